"""Tests that need a kernel with IPVS (and dummy links, loadable modules).

They run inside the test VM (``kubeplex.testing.vm``), which tests/kernel/test_vm_suite.py
boots once for the whole folder; on a kernel without IPVS every test here is skipped, saying
why. Each carries the ``vm`` marker (``-m "not vm"`` leaves them out).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
IPVS_PROC = Path("/proc/net/ip_vs")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "vm: needs a kernel with IPVS (runs in the test VM)")


@functools.cache
def ipvs_unavailable() -> str | None:
    """Why this kernel cannot run IPVS tests, or None (``modprobe ip_vs`` is tried once)."""
    if os.geteuid() != 0:
        return "IPVS tests need root"
    if not IPVS_PROC.exists() and shutil.which("modprobe"):
        subprocess.run(["modprobe", "ip_vs"], capture_output=True, check=False)
    if not IPVS_PROC.exists():
        return (
            f"this kernel has no IPVS ({IPVS_PROC} is absent after `modprobe ip_vs`): "
            "tests/kernel/test_vm_suite.py runs these in a VM"
        )
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ours = [item for item in items if HERE in item.path.parents]
    for item in ours:
        item.add_marker(pytest.mark.vm)
    reason = ipvs_unavailable() if ours else None
    if reason:
        for item in ours:
            item.add_marker(pytest.mark.skip(reason=reason))
