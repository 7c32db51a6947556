"""The ebpf mode: Services load-balanced at the socket by cgroup BPF programs (bpf/), whose maps
are laid out in layout.py, loaded and pinned by loader.py through libbpf.py."""
