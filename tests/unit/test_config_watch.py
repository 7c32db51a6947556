"""The config watch tells a removed file from one it cannot read for now: out of descriptors
(EMFILE), the file is still there and the daemon must keep running."""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubeplex.core.cli.config_watch import ConfigWatch


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.conf"
    path.write_text("mode: iptables\n")
    return path


@pytest.fixture
def no_descriptors_left() -> Iterator[list[int]]:
    """This process at its soft descriptor limit (restored afterwards): yields the filler
    descriptors, which the test may close to end the shortage early."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fillers: list[int] = []
    highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 64, hard))
    try:
        while True:
            try:
                fillers.append(os.open("/dev/null", os.O_RDONLY))
            except OSError:
                break
        yield fillers
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_out_of_descriptors_is_no_removal(config: Path, no_descriptors_left: list[int]) -> None:
    path = config
    # Taken with a descriptor to spare; then none is left for reading the file.
    os.close(no_descriptors_left.pop())
    watch = ConfigWatch(path)
    no_descriptors_left.append(os.open("/dev/null", os.O_RDONLY))
    with pytest.raises(OSError):
        os.open(path, os.O_RDONLY)
    assert watch.change() is None
    assert watch.change() is None
    for fd in no_descriptors_left:
        os.close(fd)
    no_descriptors_left.clear()
    assert watch.change() is None  # readable again, and unchanged
    path.unlink()
    assert watch.change() == "removed"


def test_a_file_unreadable_at_start_is_watched_from_its_first_read(
    config: Path, no_descriptors_left: list[int]
) -> None:
    path = config
    watch = ConfigWatch(path)  # no descriptor to read it with
    for fd in no_descriptors_left:
        os.close(fd)
    no_descriptors_left.clear()
    assert watch.change() is None
    path.write_text("mode: nftables\n")
    assert watch.change() == "written"


def test_a_path_through_a_file_is_removed(tmp_path: Path) -> None:
    path = tmp_path / "dir" / "config.conf"
    path.parent.mkdir()
    path.write_text("x\n")
    watch = ConfigWatch(path)
    path.unlink()
    path.parent.rmdir()
    path.parent.write_text("now a file\n")  # ENOTDIR: the folder went too
    assert watch.change() == "removed"
