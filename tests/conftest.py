"""Shared fixtures: the ``kernel`` marker's skip and a namespace lab (``netlab``)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from kubeplex.testing.netlab import DEFAULT_SPEC, Lab, reap_stale, unique_prefix


@functools.cache
def _kernel_unavailable() -> str | None:
    """Why kernel tests cannot run here, or None. Probes by creating a namespace."""
    if os.geteuid() != 0:
        return "kernel tests need root (CAP_NET_ADMIN, CAP_SYS_ADMIN)"
    if shutil.which("ip") is None:
        return "kernel tests need iproute2 (`ip`)"
    # A reap_stale()-able name: if this process dies between add and del, a later run cleans up.
    probe = f"{unique_prefix()}-probe"
    add = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if add.returncode != 0:
        return f"`ip netns add` fails: {add.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kernel_items = [item for item in items if item.get_closest_marker("kernel")]
    if not kernel_items:
        return
    reason = _kernel_unavailable()
    if reason:
        for item in kernel_items:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="module")
def netlab() -> Iterator[Lab]:
    """The default two-node lab, private to one test module, removed even if tests fail."""
    reap_stale()  # leftovers of killed runs (their pid is dead); live runs are left alone
    with Lab(DEFAULT_SPEC, unique_prefix()) as lab:
        yield lab
