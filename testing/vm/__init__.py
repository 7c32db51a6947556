"""A throw-away VM for tests that need a real kernel with IPVS (and dummy links, modules).

``run_in_vm(argv, timeout=...)`` boots a stock distribution kernel under qemu software
emulation (TCG, one vCPU; no KVM, which may be a nested hypervisor that runs only its own
guests), runs ONE command in it as root and returns its exit status; ``vm_unavailable()``
says why that cannot work here (None when it can), for skips. From a shell::

    python -m kubeplex.testing.vm [--timeout S] [--keep-log F] -- CMD ARGS...

The guest's root filesystem is the host's ``/``, shared read-only over virtio-9p under a tmpfs
overlay (so the guest runs the host's Python, venv and tools, and its writes vanish); the
command's working folder (or ``share``) is shared read-write at the same path. The guest has no
network card: it only talks to the network namespaces it makes itself. At boot it loads the
IPVS schedulers, ipset types, dummy, veth and the netfilter modules; the rest autoload.

What the host needs (Debian or Ubuntu, x86_64, as root)::

    apt-get install --no-install-recommends qemu-system-x86 busybox-static kmod

and apt's package lists (``apt-get update``): the guest kernel is the package that
``linux-image-amd64`` (Debian) or ``linux-image-generic`` (Ubuntu) depends on, fetched once
with ``apt-get download`` and unpacked into ``$KUBEPLEX_VM_CACHE`` (default
``~/.cache/kubeplex/vm``); nothing is installed, /boot and /lib/modules are left
alone. A cached kernel is used when apt cannot name the current one.

Cost: a boot before the command, and CPU-bound Python runs many times slower than on the host
(docs/benchmarks.md), so boot once and run a whole test folder in that one boot.
"""

from __future__ import annotations

from kubeplex.testing.vm.runner import (
    TIMEOUT_STATUS,
    VM_FAILED_STATUS,
    VmError,
    VmResult,
    run_in_vm,
    vm_unavailable,
)

__all__ = [
    "TIMEOUT_STATUS",
    "VM_FAILED_STATUS",
    "VmError",
    "VmResult",
    "run_in_vm",
    "vm_unavailable",
]
