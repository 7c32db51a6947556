"""What the ebpf mode's kernel tests share: a bpffs mount and a cgroup2 folder of the test's
own (never the host's root cgroup), and the loader on them, removed even if the test fails."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from kubeplex.backends.ebpf.loader import Loader

CGROUP2 = Path("/sys/fs/cgroup/unified")


def missing() -> str | None:
    """Why the mode's programs cannot be loaded here, or None."""
    if shutil.which("bpftool") is None:
        return "bpftool is not installed (scripts/setup.sh with KUBEPLEX_BPF_TOOLS=1)"
    if not (CGROUP2 / "cgroup.procs").exists():
        return f"no cgroup2 mounted at {CGROUP2}"
    return Loader().missing()


@contextmanager
def own_bpffs() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="kpx-bpffs-"))
    subprocess.run(["mount", "-t", "bpf", "bpf", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)
        folder.rmdir()


@contextmanager
def own_cgroup() -> Iterator[Path]:
    path = CGROUP2 / f"kpx-test-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    try:
        yield path
    finally:
        path.rmdir()


@contextmanager
def own_loader(bpffs: Path) -> Iterator[Loader]:
    """A loader on ``bpffs`` (the test skipped where the programs cannot load), cleaned up."""
    reason = missing()
    if reason:
        pytest.skip(reason)
    loader = Loader(bpffs)
    try:
        yield loader
    finally:
        loader.cleanup()
