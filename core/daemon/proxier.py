"""The sync step: check out the cluster state, hand it to the backend, remember the outcome."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kubeplex.core.dataplane.backend import Backend, SyncResult
from kubeplex.core.dataplane.drift import summary as drift_summary
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.errors import BackendError, KubeplexError
from kubeplex.core.model.graph import ProxyState
from kubeplex.core.model.types import IPFamily
from kubeplex.core.startup.collector import collector_paused

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
    #: Services the last sync left out (name -> reason), and how often one was left out.
    failed_services: dict[str, str] = field(default_factory=dict)
    service_failures: int = 0
    #: The IP families the last failed sync failed in (None: all of them, or not known).
    failed_families: tuple[IPFamily, ...] | None = None


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
        full = full or self._need_full
        # Before the checkout: with the "synced" line this times the whole sync (a full one
        # at info, where it is rare; the partial ones' start at debug).
        log.log(logging.INFO if full else logging.DEBUG, "sync starting (%s)", _kind(full))
        checkout_started = time.monotonic()
        with collector_paused():  # building the graphs allocates as much as a render
            state = self.cluster.checkout(full=full)
        checkout = time.monotonic() - checkout_started
        if state.empty and not self.status.failed_services:
            return True  # (services left out last time make the backend retry them)
        started = time.monotonic()
        self.status.last_attempt = time.time()
        try:
            with collector_paused():
                result = self.backend.sync(state)
        except KubeplexError as err:
            return self._failed(str(err), err.families if isinstance(err, BackendError) else None)
        except Exception as err:  # a plugin bug must not take the daemon down
            log.exception("backend %s crashed during sync", self.backend.mode)
            return self._failed(f"backend {self.backend.mode} crashed: {err!r}")
        elapsed = time.monotonic() - started
        self._need_full = False
        self.status.last_success = time.time()
        self.status.last_error = ""
        self.status.successes += 1
        log.info(
            "synced %s rules (%s) in %.1f ms (checkout %.1f ms before)",
            self.backend.mode,
            _kind(result.full),
            elapsed * 1000,
            checkout * 1000,
        )
        self._report_failed_services(result)
        if result.repaired:
            log.warning(
                "the kernel differed from what kubeplex last wrote (%d rules; changed by someone "
                "else?), written again: %s",
                len(result.repaired),
                drift_summary(result.repaired),
            )
        for listener in self.listeners:
            listener(state, result, elapsed)
        return True

    def _report_failed_services(self, result: SyncResult) -> None:
        """Services the backend left out of an otherwise successful sync: they cost only
        themselves (their previous rules stay; the backend retries them next sync)."""
        for name, why in sorted(result.failed.items()):
            log.error("service %s not programmed, previous rules kept: %s", name, why)
        self.status.failed_services = dict(result.failed)
        self.status.service_failures += len(result.failed)

    def _failed(self, message: str, families: tuple[IPFamily, ...] | None = None) -> bool:
        # The message says what the kernel holds (a backend knows; "previous rules left in
        # place" is not always true).
        log.error("sync failed, the next sync is a full one: %s", message)
        self.status.failed_families = families
        self.backend.invalidate()
        self._need_full = True
        self.status.last_error = message
        self.status.failures += 1
        return False


def _kind(full: bool) -> str:
    return "full" if full else "partial"
