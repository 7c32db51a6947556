"""A lab's kernel facilities besides its namespaces: a cgroup2 folder per node, a bpffs mount.

A real node runs its pods in cgroups of its own and has its own bpffs; a mode that attaches
programs to a cgroup (ebpf) must see only the processes of its node. So each lab has::

    <cgroup2 mount>/kubeplex-netlab-<prefix>/<node>    every process of the node and its pods
    /run/kubeplex-netlab/<prefix>/                     a bpffs mount of the lab's own
    /run/kubeplex-netlab/<prefix>/<node>/              the node's folder in it

Both are named by the lab's prefix alone, so another process (``kubeplex lab --down``) or a
later run (``reap_stale``) finds and removes them. Where no cgroup2 is mounted, or bpffs
cannot be mounted, the lab runs without them and says why.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from kubeplex.core.dataplane.mounts import MOUNTS, mount_points

CGROUP_STEM = "kubeplex-netlab-"  # <cgroup2>/<stem><prefix>
BPFFS_ROOT = Path("/run/kubeplex-netlab")  # <root>/<prefix> is a lab's bpffs mount


def cgroup2_mount(mounts: Path | None = None) -> Path | None:
    """The machine's cgroup2 mount (the first listed), or None where there is none."""
    found = mount_points("cgroup2", mounts or MOUNTS)
    return found[0] if found else None


@contextlib.contextmanager
def scratch_cgroup(stem: str = "kpx-test") -> Iterator[Path]:
    """A cgroup2 folder of the caller's own (never the root: programs attached there see only
    what runs in it), under the machine's cgroup2 mount, or under one mounted for the while
    where there is none (a test VM). Removed afterwards, as is that mount."""
    root, mounted = cgroup2_mount(), None
    if root is None:
        root = mounted = Path(tempfile.mkdtemp(prefix="kpx-cgroup2-"))
        subprocess.run(["mount", "-t", "cgroup2", "none", str(mounted)], check=True)
    path = root / f"{stem}-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    try:
        yield path
    finally:
        path.rmdir()
        if mounted is not None:
            subprocess.run(["umount", str(mounted)], check=False)
            mounted.rmdir()


@contextlib.contextmanager
def scratch_bpffs(prefix: str = "kpx-bpffs-") -> Iterator[Path]:
    """A bpffs mount of the caller's own, in a new temporary folder; unmounted afterwards
    (what is pinned there goes with it unless a process still holds it)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    subprocess.run(["mount", "-t", "bpf", "bpf", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)
        folder.rmdir()


def lab_cgroup(prefix: str) -> Path | None:
    """The lab's cgroup folder (whether it exists or not); None without cgroup2."""
    root = cgroup2_mount()
    return None if root is None else root / f"{CGROUP_STEM}{prefix}"


def lab_bpffs(prefix: str) -> Path:
    return BPFFS_ROOT / prefix


def is_bpffs_mount(path: Path) -> bool:
    return path in mount_points("bpf")


def make_cgroups(prefix: str, nodes: Iterable[str]) -> Path:
    """Creates the lab's folder and one child per node; OSError if cgroup2 refuses."""
    folder = lab_cgroup(prefix)
    if folder is None:
        raise OSError("no cgroup2 is mounted")
    folder.mkdir(exist_ok=True)
    for node in nodes:
        (folder / node).mkdir(exist_ok=True)
    return folder


def mount_bpffs(prefix: str, nodes: Iterable[str]) -> Path:
    """Mounts the lab's bpffs and makes a folder per node in it; OSError if it cannot."""
    mount = lab_bpffs(prefix)
    mount.mkdir(parents=True, exist_ok=True)
    if not is_bpffs_mount(mount):
        done = subprocess.run(
            ["mount", "-t", "bpf", "bpf", str(mount)], capture_output=True, text=True
        )
        if done.returncode != 0:
            with contextlib.suppress(OSError):
                mount.rmdir()
            raise OSError(f"mount -t bpf {mount}: {done.stderr.strip() or done.returncode}")
    for node in nodes:
        (mount / node).mkdir(exist_ok=True)
    return mount


def in_cgroup(cgroup: Path | None, argv: Sequence[str]) -> list[str]:
    """``argv`` run inside ``cgroup`` (None: as it is): a shell moves itself there, then
    becomes the command, so the pid stays the one started. (Not a ``preexec_fn``: the lab
    starts processes from several threads, which forking Python code does not survive.)"""
    if cgroup is None:
        return list(argv)
    return ["sh", "-c", 'echo 0 > "$0" && exec "$@"', str(cgroup / "cgroup.procs"), *argv]


def _pids(cgroup: Path) -> list[int]:
    try:
        return [int(p) for p in (cgroup / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _kill(cgroup: Path, grace: float) -> None:
    """Kills every process of ``cgroup``: at once with cgroup.kill, else pid by pid."""
    kill_file = cgroup / "cgroup.kill"
    deadline = time.monotonic() + grace
    while _pids(cgroup) and time.monotonic() < deadline:
        if kill_file.exists():
            with contextlib.suppress(OSError):
                kill_file.write_text("1")
        else:
            for pid in _pids(cgroup):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)  # polling process exit, bounded by the deadline


def remove(prefix: str, grace: float = 2.0) -> list[str]:
    """Kills the processes of the lab's cgroups, removes them, unmounts and removes its
    bpffs. Tolerates any partial state; returns what could not be removed."""
    left: list[str] = []
    folder = lab_cgroup(prefix)
    if folder is not None and folder.is_dir():
        children = [c for c in folder.iterdir() if c.is_dir()]
        for cgroup in [*children, folder]:
            _kill(cgroup, grace)
            try:
                cgroup.rmdir()
            except OSError as err:
                left.append(f"cgroup {cgroup}: {err.strerror}")
    mount = lab_bpffs(prefix)
    if is_bpffs_mount(mount):
        done = subprocess.run(["umount", str(mount)], capture_output=True, text=True)
        if done.returncode != 0:
            left.append(f"bpffs {mount}: {done.stderr.strip()}")
    if mount.is_dir() and not is_bpffs_mount(mount):
        try:
            mount.rmdir()
        except OSError as err:
            left.append(f"bpffs folder {mount}: {err.strerror}")
    return left


def prefixes() -> set[str]:
    """The prefixes of every lab that has a cgroup folder or a bpffs folder here."""
    found = set()
    root = cgroup2_mount()
    if root is not None:
        with contextlib.suppress(OSError):
            found |= {
                p.name.removeprefix(CGROUP_STEM)
                for p in root.iterdir()
                if p.name.startswith(CGROUP_STEM)
            }
    with contextlib.suppress(OSError):
        found |= {p.name for p in BPFFS_ROOT.iterdir()}
    return found
