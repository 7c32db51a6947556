"""Shared fixtures: the ``kernel`` marker's skip, a namespace lab (``netlab``), empty
network namespaces (``netns``, ``netns2``), and ``dp``: a module's ``shared`` dataplane lab
(tests/kits/dataplane_kit.py), reset for each test."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from kubeplex.testing.dataplane import DataplaneCluster
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


def _scratch_netns(stem: str) -> Iterator[str]:
    """An empty namespace with loopback up, deleted afterwards (reap_stale() finds it if the
    test process dies first)."""
    name = f"{unique_prefix()}-{stem}"
    if subprocess.run(["ip", "netns", "add", name], capture_output=True).returncode != 0:
        pytest.skip("needs root and network namespaces")
    try:
        subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


@pytest.fixture
def netns() -> Iterator[str]:
    yield from _scratch_netns("a")


@pytest.fixture
def netns2() -> Iterator[str]:
    yield from _scratch_netns("b")


@pytest.fixture
def dp(shared: DataplaneCluster) -> DataplaneCluster:
    """The module's shared lab with a blank dataplane and fresh agents."""
    shared.reset()
    return shared
