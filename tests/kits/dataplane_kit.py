"""The namespace-lab cluster the kernel test modules share (see the ``dp`` fixture in
conftest.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from kubeplex.testing.dataplane import DataplaneCluster, DataplaneUnavailable, cluster
from kubeplex.testing.netlab import reap_stale


def shared_dataplane(mode: str, ipv6: bool = False) -> Iterator[DataplaneCluster]:
    """One lab programmed in ``mode`` for a module (a module-scoped ``shared`` fixture yields
    from this), removed even if tests fail; the module is skipped if the lab cannot be had."""
    reap_stale()
    with contextlib.ExitStack() as stack:
        try:
            dc = stack.enter_context(cluster(mode, ipv6=ipv6))
        except DataplaneUnavailable as err:
            pytest.skip(str(err))
        yield dc
