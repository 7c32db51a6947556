"""Memory across many syncs: what the collector was kept from must still be freed.

The proxier freezes the objects alive after a full sync (gc.freeze), so the cyclic collector
does not scan the graph and render caches again and again. Frozen objects are never examined
by the collector: a reference cycle that was frozen — garbage not collected yet, or an object
alive then and dropped later — must not stay in memory for good. The daemon's other threads
(watches, HTTP servers) make such cycles all the time; a full sync every 2 s froze them all.
"""

from __future__ import annotations

import gc
import threading
import tracemalloc
import weakref
from collections.abc import Iterator

import pytest

from kubeplex.core.config.kubeproxy import default_config
from kubeplex.core.daemon.freezer import Freezer
from kubeplex.core.daemon.proxier import Proxier
from kubeplex.core.daemon.runner import SyncRunner
from kubeplex.core.dataplane.backend import Backend, BackendContext, Rendered, SyncResult
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.graph import ProxyState
from kubeplex.core.model.types import IPFamily

NODE = "node-a"
SYNCS = 200
#: A full sync every 2 s (syncPeriod 2s) and the freezer's collection every 60 s.
SYNC_PERIOD = 2.0
INTERVAL = 60.0


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


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def syncing(backend: CycleMaker) -> tuple[Proxier, Clock]:
    proxier = Proxier(ClusterState(NODE, (IPFamily.IPv4,)), backend)
    clock = Clock()
    proxier.freezer = Freezer(INTERVAL, clock)
    return proxier, clock


def full_syncs(proxier: Proxier, clock: Clock, count: int) -> None:
    for _ in range(count):
        clock.now += SYNC_PERIOD
        assert proxier.sync(full=True)


def test_cycles_frozen_by_full_syncs_are_collected_later(collector: None) -> None:
    backend = CycleMaker()
    proxier, clock = syncing(backend)
    full_syncs(proxier, clock, SYNCS)
    gc.collect()
    alive = sum(ref() is not None for ref in backend.made)
    # At most what the syncs since the last collection froze (two per sync) may be left.
    bound = 2 * INTERVAL / SYNC_PERIOD + 2
    assert alive <= bound, f"{alive} of {len(backend.made)} cycles never collected"
    assert proxier.freezer.collections >= SYNCS * SYNC_PERIOD // INTERVAL - 1


def test_full_syncs_keep_the_frozen_generation_bounded(collector: None) -> None:
    backend = CycleMaker()
    proxier, clock = syncing(backend)
    full_syncs(proxier, clock, 40)
    warm = gc.get_freeze_count() - len(backend.made)  # the test's weakrefs are tracked too
    full_syncs(proxier, clock, SYNCS)
    # Each sync freezes two cycles of two tracked objects (the instance and its dict): kept
    # for good, 200 syncs would add 800; collected every 30 syncs, at most ~120 stay frozen.
    grown = gc.get_freeze_count() - len(backend.made) - warm
    assert grown <= 4 * INTERVAL / SYNC_PERIOD + 10


def test_a_collection_runs_at_most_once_per_interval(collector: None) -> None:
    proxier, clock = syncing(CycleMaker())
    full_syncs(proxier, clock, 29)  # 58 s: not due yet
    assert proxier.freezer.collections == 0
    full_syncs(proxier, clock, 1)
    assert proxier.freezer.collections == 1


class Quiet(CycleMaker):
    """A backend that makes nothing itself: what stays is what the sync loop leaves."""

    def render(self, state: ProxyState, observed: object = None) -> Rendered:
        return _Rendered()


def test_the_sync_loop_keeps_no_memory_across_full_syncs(collector: None) -> None:
    """The runner's retry machinery (a tenacity Retrying, in cycles) is alive while a sync
    freezes: kept frozen, ~2.6 KB per sync stayed for good (~9 MB an hour at one sync a
    second)."""
    proxier, clock = syncing(Quiet())

    def sync(full: bool) -> bool:
        clock.now += SYNC_PERIOD
        return proxier.sync(full)

    runner = SyncRunner(sync, threading.Event(), 0.0, SYNC_PERIOD)
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
    # Only the syncs since the last collection (30) may still hold theirs.
    assert grown < 300_000, f"{grown} bytes kept by {SYNCS * 2} syncs"
