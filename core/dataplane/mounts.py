"""The machine's mounts of a file system type, from /proc/self/mounts: where cgroup2 and bpffs
are (the ebpf mode's options, the test lab's cgroups and bpffs)."""

from __future__ import annotations

from pathlib import Path

MOUNTS = Path("/proc/self/mounts")


def mount_points(fstype: str, mounts: Path = MOUNTS) -> list[Path]:
    """Mount points of ``fstype``, in the order the kernel lists them (none if unreadable)."""
    try:
        lines = mounts.read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        fields = line.split()
        if len(fields) > 2 and fields[2] == fstype:
            found.append(Path(fields[1].replace("\\040", " ")))
    return found
