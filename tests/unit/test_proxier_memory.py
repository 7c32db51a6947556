"""Memory across many syncs: what the collector was kept from must still be freed.

Each sync runs with the cyclic collector paused, while the daemon's other threads (watches,
HTTP servers) make reference cycles. Full syncs freeze nothing (the start freezes once, after
the initial lists): a cycle pending at a sync is collected later, never kept for good. When the
proxier froze what was alive after every full sync, every such cycle stayed frozen.
"""

from __future__ import annotations

import gc
import threading
import tracemalloc
import weakref
from collections.abc import Iterator

import pytest

from kubeplex.core.config.kubeproxy import default_config
from kubeplex.core.daemon.proxier import Proxier
from kubeplex.core.daemon.runner import SyncRunner
from kubeplex.core.dataplane.backend import Backend, BackendContext, Rendered, SyncResult
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.graph import ProxyState
from kubeplex.core.model.types import IPFamily

NODE = "node-a"
SYNCS = 200


class _Rendered(Rendered):
    @property
    def full(self) -> bool:
        return True

    def __str__(self) -> str:
        return ""


class CycleMaker(Backend):
    """A backend whose every sync leaves garbage reference cycles behind, as the daemon's other
    threads do while the collector is paused: one that is garbage before the sync ends, and one
    still alive then (held by the backend) that becomes garbage at the next sync."""

    mode = "cycles"

    def __init__(self) -> None:
        super().__init__(BackendContext(default_config(), NODE, (IPFamily.IPv4,)))
        self.made: list[weakref.ref[Cycle]] = []
        self.held: Cycle | None = None

    def render(self, state: ProxyState, observed: object = None) -> Rendered:
        dead = Cycle()
        self.made.append(weakref.ref(dead))
        del dead
        self.held = Cycle()  # the previous one is dropped here, frozen by the previous sync
        self.made.append(weakref.ref(self.held))
        return _Rendered()

    def apply(self, rendered: Rendered) -> SyncResult:
        return SyncResult(full=True)


class Cycle:
    def __init__(self) -> None:
        self.me = self
        self.payload = bytearray(1024)


@pytest.fixture
def collector() -> Iterator[None]:
    """The collector enabled and nothing frozen, as in the daemon; restored afterwards."""
    was = gc.isenabled()
    gc.enable()
    gc.unfreeze()
    try:
        yield
    finally:
        gc.unfreeze()
        if not was:
            gc.disable()


def full_syncs(proxier: Proxier, count: int) -> None:
    for _ in range(count):
        assert proxier.sync(full=True)


def new_proxier(backend: CycleMaker) -> Proxier:
    return Proxier(ClusterState(NODE, (IPFamily.IPv4,)), backend)


def test_cycles_made_during_full_syncs_are_collected(collector: None) -> None:
    backend = CycleMaker()
    proxier = new_proxier(backend)
    full_syncs(proxier, SYNCS)
    gc.collect()
    alive = sum(ref() is not None for ref in backend.made)
    assert alive <= 1, f"{alive} of {len(backend.made)} cycles never collected"  # the one held


def test_full_syncs_freeze_nothing(collector: None) -> None:
    proxier = new_proxier(CycleMaker())
    full_syncs(proxier, 3)
    assert gc.get_freeze_count() == 0


class Quiet(CycleMaker):
    """A backend that makes nothing itself: what stays is what the sync loop leaves."""

    def render(self, state: ProxyState, observed: object = None) -> Rendered:
        return _Rendered()


def test_the_sync_loop_keeps_no_memory_across_full_syncs(collector: None) -> None:
    """The runner's retry machinery (a tenacity Retrying, in cycles) is alive during a sync:
    frozen then, it stayed for good."""
    proxier = new_proxier(Quiet())
    runner = SyncRunner(proxier.sync, threading.Event(), 0.0, 2.0)
    for _ in range(40):
        runner.sync_with_retry(True)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for _ in range(SYNCS * 2):
            assert runner.sync_with_retry(True)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert grown < 300_000, f"{grown} bytes kept by {SYNCS * 2} syncs"
