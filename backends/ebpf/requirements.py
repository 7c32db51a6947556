"""What a node lacks for the ebpf mode, each named: the bpf system call, a kernel with every hook
the programs attach to, the cgroup2 and bpffs folders of the options, libbpf and the compiled
programs, and nft (the entry points for traffic from other hosts: entry_nat.py)."""

from __future__ import annotations

import ctypes
import errno
import platform
import re
import shutil
from pathlib import Path

from kubeplex.backends.ebpf.loader import (
    BPF_FS_MAGIC,
    CGROUP2_SUPER_MAGIC,
    Loader,
    LoaderError,
    filesystem_magic,
)
from kubeplex.backends.ebpf.options import EbpfOptions

#: The oldest kernel with every hook used: cgroup getpeername4/6 and pinnable cgroup links
#: came in 5.8 (connect4/6 in 4.17, sendmsg in 4.18, recvmsg in 5.2).
MIN_KERNEL = (5, 8)

#: bpf(2)'s number where the architecture is known (others are not probed).
_SYS_BPF = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "s390x": 351, "riscv64": 280}


def kernel_release_tuple(release: str) -> tuple[int, ...]:
    m = re.match(r"\d+(\.\d+)*", release)
    return tuple(int(p) for p in m.group(0).split(".")) if m else ()


def bpf_syscall_missing() -> str | None:
    """Calls bpf(2) with a command no kernel has: EINVAL means the call is there."""
    number = _SYS_BPF.get(platform.machine())
    if number is None:
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall(number, 0xFFFF, None, 0)
    if ctypes.get_errno() == errno.ENOSYS:
        return "the bpf system call is not available (kernel built without CONFIG_BPF_SYSCALL)"
    return None


def _folder_missing(path: Path, magic: int, what: str) -> str | None:
    try:
        found = filesystem_magic(path)
    except LoaderError as err:
        return f"{what} {err}"
    return None if found == magic else f"{what} {path} is not a {what} mount"


def missing_bpffs(options: EbpfOptions) -> list[str]:
    """The bpffs folder of the options, if it is not one (what cleanup needs)."""
    reason = _folder_missing(options.bpffs, BPF_FS_MAGIC, "bpffs")
    return [reason] if reason else []


def missing(options: EbpfOptions, loader: Loader, release: str | None = None) -> list[str]:
    """Every requirement this node lacks (empty: ready)."""
    found: list[str] = []
    version = kernel_release_tuple(release if release is not None else platform.release())
    if version and version < MIN_KERNEL:
        wanted = ".".join(map(str, MIN_KERNEL))
        found.append(f"kernel {'.'.join(map(str, version))} is older than {wanted}")
    for reason in (
        bpf_syscall_missing(),
        _folder_missing(options.cgroup, CGROUP2_SUPER_MAGIC, "cgroup2"),
        _folder_missing(options.bpffs, BPF_FS_MAGIC, "bpffs"),
        loader.missing(),
        None if shutil.which("nft") else "executable 'nft' not found in PATH",
    ):
        if reason:
            found.append(reason)
    return found
