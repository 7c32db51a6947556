"""The sync step: check out the cluster state, hand it to the backend, remember the outcome."""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from kubeplex.core.backend import Backend, SyncResult
from kubeplex.core.cluster import ClusterState
from kubeplex.core.errors import KubeplexError
from kubeplex.core.graph import ProxyState

log = logging.getLogger(__name__)

#: Called after every successful apply, e.g. conntrack cleanup, health and metrics.
SyncListener = Callable[[ProxyState, SyncResult, float], None]


@dataclass
class SyncStatus:
    last_success: float | None = None
    last_attempt: float | None = None
    last_error: str = ""
    successes: int = 0
    failures: int = 0


class Proxier:
    def __init__(self, cluster: ClusterState, backend: Backend) -> None:
        self.cluster = cluster
        self.backend = backend
        self.status = SyncStatus()
        self.listeners: list[SyncListener] = []
        self._need_full = True

    @property
    def next_sync_full(self) -> bool:
        """True if the next sync will be a full one (first sync, or after a failure)."""
        return self._need_full

    def sync(self, full: bool = False) -> bool:
        """One sync. Returns False if it failed; the previous rules then stay in place."""
        with collector_paused():  # building the graphs allocates as much as a render
            state = self.cluster.checkout(full=full or self._need_full)
        if state.empty:
            return True
        started = time.monotonic()
        self.status.last_attempt = time.time()
        try:
            with collector_paused():
                result = self.backend.sync(state)
        except KubeplexError as err:
            return self._failed(str(err))
        except Exception as err:  # a plugin bug must not take the daemon down
            log.exception("backend %s crashed during sync", self.backend.mode)
            return self._failed(f"backend {self.backend.mode} crashed: {err!r}")
        elapsed = time.monotonic() - started
        if result.full:
            # The graph and the render caches live until the next full sync: keep the cyclic
            # collector from scanning them again and again (they hold no cycles).
            gc.freeze()
        self._need_full = False
        self.status.last_success = time.time()
        self.status.last_error = ""
        self.status.successes += 1
        log.info(
            "synced %s rules (%s) in %.1f ms",
            self.backend.mode,
            "full" if result.full else "partial",
            elapsed * 1000,
        )
        for listener in self.listeners:
            listener(state, result, elapsed)
        return True

    def _failed(self, message: str) -> bool:
        log.error("sync failed, previous rules left in place: %s", message)
        self.backend.invalidate()
        self._need_full = True
        self.status.last_error = message
        self.status.failures += 1
        return False


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """A render allocates hundreds of thousands of strings: no collector passes meanwhile."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
