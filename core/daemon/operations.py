"""What runs around the sync loop of ``kubeplex run``: health, metrics, conntrack, sysctls.

``start_operations`` sets everything up for one Proxier and returns an ``Operations``:

* the ``conntrack`` sysctls are applied (upstream does it before the first sync);
* ``/healthz`` + ``/livez`` on healthzBindAddress and ``/metrics`` on metricsBindAddress, and
  the health-check NodePorts of ``externalTrafficPolicy: Local`` Services, all served by one
  loop thread;
* one SyncListener on the Proxier that, after every successful apply, hands the clearing of
  stale conntrack entries to the cleaner's own thread (if the backend ``uses_conntrack``),
  updates the metrics and the Service health checks, and marks the rules fresh;
* ``Operations.sync`` wraps ``Proxier.sync`` for the runner: it also counts failed syncs and
  marks the rules stale when a sync fails or changes are waiting;
* a poller (every ``poll_interval``) that publishes the pending change counts, marks the
  rules stale as soon as a change arrives (so /healthz turns 503 if no sync follows within
  2 x the backend's syncPeriod, however the loop is stuck), and retries a listener that could
  not bind.

``stop()`` undoes all of it (listeners closed, threads ended, the Proxier listener removed).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from kubeplex.core.config.kubeproxy import KubeProxyConfiguration, split_host_port
from kubeplex.core.daemon.conntrack import ConntrackCleaner
from kubeplex.core.daemon.httpserving import HTTPServing, ListenError
from kubeplex.core.daemon.metrics import MetricsServer, ProxyMetrics
from kubeplex.core.daemon.proxier import Proxier
from kubeplex.core.daemon.proxy_health import ProxyHealth, ProxyHealthServer
from kubeplex.core.daemon.service_health import ServiceHealthServer
from kubeplex.core.daemon.sysctls import SysctlReport, apply_conntrack_sysctls
from kubeplex.core.dataplane.backend import SyncResult
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.errors import KubeplexError
from kubeplex.core.model.graph import ProxyState
from kubeplex.core.model.types import IPFamily

log = logging.getLogger(__name__)

BIND_RETRY_SECONDS = 5.0  # upstream retries a failed healthz/metrics listener every 5s


def parse_bind_address(address: str) -> tuple[str, int]:
    """``IP:port`` / ``[IPv6]:port`` of a bind address; port 0 (any free port) is allowed."""
    try:
        return split_host_port(address)
    except ValueError:
        if address.endswith(":0"):
            host, _ = split_host_port(address[:-2] + ":1")
            return host, 0
        raise


class Operations:
    """The running health, metrics and conntrack machinery of one Proxier."""

    def __init__(
        self,
        cfg: KubeProxyConfiguration,
        proxier: Proxier,
        cluster: ClusterState,
        *,
        metrics: ProxyMetrics,
        health: ProxyHealth,
        conntrack: ConntrackCleaner,
        netns: str | None = None,
        poll_interval: float = 1.0,
    ) -> None:
        self.cfg = cfg
        self.proxier = proxier
        self.cluster = cluster
        self.metrics = metrics
        self.health = health
        self.conntrack = conntrack
        self.netns = netns
        self.poll_interval = poll_interval
        self.families: tuple[IPFamily, ...] = tuple(cluster.families)
        self.sysctls: SysctlReport | None = None
        self.serving: HTTPServing | None = None
        self.healthz: ProxyHealthServer | None = None
        self.metrics_server: MetricsServer | None = None
        self.service_health: ServiceHealthServer | None = None
        #: (kind, host, port) of listeners that could not bind yet (retried by the poller).
        self._unbound: list[tuple[str, str, int]] = []
        self._next_bind_retry = 0.0
        self._pending = (0, 0)
        self._events = (0, 0)
        self._was_changed = False
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None
        self._lock = threading.Lock()

    # --- addresses (tests bind port 0) ----------------------------------------------------

    @property
    def healthz_address(self) -> tuple[str, int] | None:
        return self.healthz.address if self.healthz else None

    @property
    def metrics_address(self) -> tuple[str, int] | None:
        return self.metrics_server.address if self.metrics_server else None

    # --- the sync path --------------------------------------------------------------------

    def sync(self, full: bool = False) -> bool:
        """``Proxier.sync`` plus bookkeeping: what the SyncRunner should call."""
        self._publish_pending()  # what is about to be synced counts as queued and changed
        # Proxier makes the sync full after a failure or at start: a partial one otherwise.
        will_be_full = full or self.proxier.next_sync_full
        started = time.monotonic()
        ok = bool(self.proxier.sync(full))
        if ok:
            # Also when there was nothing to do: the rules reflect everything seen.
            self.health.updated(self.families)
        else:
            # Only the families that failed (an IPv4 restore failure is no IPv6 failure).
            failed = self.proxier.status.failed_families
            self.metrics.sync_failed(
                self.families if failed is None else failed,
                partial=not will_be_full,
                elapsed=time.monotonic() - started,
            )
            # The changes this sync consumed are not in the kernel: stale until one succeeds.
            self.health.queued_update(self.families)
        self._publish_pending()
        return ok

    def listener(self, state: ProxyState, result: SyncResult, elapsed: float) -> None:
        """The SyncListener: every part guarded, so none can fail the sync it follows."""
        parts: list[tuple[str, Callable[[ProxyState, SyncResult, float], None]]] = [
            ("conntrack cleanup", self.conntrack),
            ("metrics", self.metrics.sync_listener),
            ("service health checks", self._sync_service_health),
            ("services left out", self._left_out),
        ]
        for what, part in parts:
            try:
                part(state, result, elapsed)
            except Exception:
                log.exception("%s after a sync failed", what)
        self.health.updated(state.graphs.keys())

    def _left_out(self, state: ProxyState, result: SyncResult, elapsed: float) -> None:
        """Counted and listed in /healthz: the log alone alerts no one."""
        self.metrics.left_out(result.failed)
        self.health.not_programmed(result.failed)

    def _sync_service_health(self, state: ProxyState, result: SyncResult, elapsed: float) -> None:
        if self.service_health is not None:
            self.service_health.sync_state(state)

    # --- the poller -----------------------------------------------------------------------

    def _publish_pending(self) -> None:
        with self._lock:
            services, endpoints = self.cluster.pending()
            before_s, before_e = self._pending
            self.metrics.set_pending(services, endpoints)
            # Every Service and EndpointSlice event, as upstream's trackers count them.
            events = (self.cluster.service_events, self.cluster.endpoint_events)
            self.metrics.add_changes(events[0] - self._events[0], events[1] - self._events[1])
            self._events = events
            changed = self.cluster.changed.is_set()
            grew = services > before_s or endpoints > before_e
            if services or endpoints or changed:
                self.health.queued_update(self.families)
            if grew or (changed and not self._was_changed):
                self.metrics.queued(self.families)
            self._pending = (services, endpoints)
            self._was_changed = changed

    def poll_once(self) -> None:
        self._publish_pending()
        if self._unbound and time.monotonic() >= self._next_bind_retry:
            self._bind_missing()

    def _poll(self) -> None:
        while not self._stop.wait(self.poll_interval):
            try:
                self.poll_once()
            except Exception:
                log.exception("operations poller failed")

    # --- listeners ------------------------------------------------------------------------

    def _bind(self, kind: str, host: str, port: int) -> None:
        assert self.serving is not None
        if kind == "healthz":
            self.healthz = ProxyHealthServer(
                self.serving,
                self.health,
                host,
                port,
                on_probe=self.metrics.health_probe,
                netns=self.netns,
            )
            log.info("serving /healthz and /livez on %s:%d", *self.healthz.address)
        else:
            self.metrics_server = MetricsServer(
                self.serving, self.metrics, host, port, netns=self.netns
            )
            log.info("serving /metrics on %s:%d", *self.metrics_server.address)

    def _bind_missing(self) -> None:
        still: list[tuple[str, str, int]] = []
        for kind, host, port in self._unbound:
            try:
                self._bind(kind, host, port)
            except (ListenError, RuntimeError) as err:
                log.error("%s server failed to start (retrying): %s", kind, err)
                still.append((kind, host, port))
        self._unbound = still
        self._next_bind_retry = time.monotonic() + BIND_RETRY_SECONDS

    # --- lifecycle ------------------------------------------------------------------------

    def start(
        self,
        *,
        serve: bool,
        healthz_address: str,
        metrics_address: str,
        service_health_addresses: Sequence[str],
    ) -> None:
        self.proxier.listeners.append(self.listener)
        # Upstream's SyncLoop marks every family updated at start, so a first sync that
        # never succeeds turns the proxy unhealthy once changes wait too long.
        self.health.updated(self.families)
        if not serve:
            return
        self.serving = HTTPServing()
        self.service_health = ServiceHealthServer(
            self.serving,
            addresses=service_health_addresses,
            proxy_healthy=lambda: self.health.health().healthy,
            netns=self.netns,
            node_name=self.cluster.node_name,
        )
        for kind, address in (("healthz", healthz_address), ("metrics", metrics_address)):
            if address:
                self._unbound.append((kind, *parse_bind_address(address)))
        self._bind_missing()
        if self._unbound and self.cfg.bind_address_hard_fail:
            failed = ", ".join(f"{k} on {h}:{p}" for k, h, p in self._unbound)
            self.stop()
            raise KubeplexError(f"bindAddressHardFail: could not listen for {failed}")
        self._poller = threading.Thread(target=self._poll, name="kubeplex-ops", daemon=True)
        self._poller.start()

    def stop(self) -> None:
        """Close every listener and end the threads; idempotent."""
        self._stop.set()
        if self.listener in self.proxier.listeners:
            self.proxier.listeners.remove(self.listener)
        if self._poller is not None and self._poller is not threading.current_thread():
            self._poller.join(timeout=5)
        self.conntrack.close()
        for closer in (self.service_health, self.healthz, self.metrics_server):
            if closer is not None:
                try:
                    closer.close()
                except Exception:
                    log.exception("closing a listener failed")
        if self.serving is not None:
            self.serving.stop()
        self.healthz = self.metrics_server = self.service_health = None
        self.serving = None


def start_operations(
    cfg: KubeProxyConfiguration,
    proxier: Proxier,
    cluster: ClusterState,
    node_deleting: Callable[[], bool] = lambda: False,
    *,
    netns: str | None = None,
    serve: bool = True,
    sysctls: bool = True,
    healthz_address: str | None = None,
    metrics_address: str | None = None,
    service_health_addresses: Sequence[str] = ("0.0.0.0",),
    poll_interval: float = 1.0,
    clock: Callable[[], float] = time.time,
    metrics: ProxyMetrics | None = None,
) -> Operations:
    """Apply the conntrack sysctls, start serving, hook into ``proxier``; see the module doc.

    ``node_deleting`` turns /healthz unhealthy (nodeEligible false). With ``netns`` every
    listener, sysctl and conntrack operation is in that network namespace. ``serve=False``
    (``--once``) starts no listener and no thread. The bind addresses default to the
    configuration's; tests pass ``"127.0.0.1:0"``. Sysctl refusals stop the start on the host
    (as upstream) and are logged as warnings in a namespace, where the kernel never lets
    ``nf_conntrack_max`` be set.
    """
    backend = proxier.backend
    sync_period, _ = backend.sync_periods()
    health = ProxyHealth(2 * sync_period, node_eligible=lambda: not node_deleting(), clock=clock)
    metrics = metrics if metrics is not None else ProxyMetrics(backend, clock=clock)
    # Off the sync loop where the process keeps running; ``--once`` cleans up before it exits.
    cleaner = ConntrackCleaner(
        netns,
        on_cleaned=metrics.conntrack_cleaned,
        enabled=backend.uses_conntrack,
        background=serve,
    )
    ops = Operations(
        cfg,
        proxier,
        cluster,
        metrics=metrics,
        health=health,
        conntrack=cleaner,
        netns=netns,
        poll_interval=poll_interval,
    )
    if sysctls:
        ops.sysctls = _apply_sysctls(cfg, netns)
    ops.start(
        serve=serve,
        healthz_address=cfg.healthz_bind_address if healthz_address is None else healthz_address,
        metrics_address=cfg.metrics_bind_address if metrics_address is None else metrics_address,
        service_health_addresses=service_health_addresses,
    )
    return ops


def _apply_sysctls(cfg: KubeProxyConfiguration, netns: str | None) -> SysctlReport:
    try:
        report = apply_conntrack_sysctls(cfg.conntrack, netns=netns)
    except OSError as err:
        raise KubeplexError(f"conntrack sysctls: cannot enter netns {netns}: {err}") from err
    for name, before, after in report.changed:
        log.info("set %s = %d (was %s)", name, after, before)
    for name, why in report.skipped:
        log.info("not setting %s: %s", name, why)
    for refusal in report.errors:
        log.warning("%s", refusal)
    if netns is None:
        report.raise_for_errors()
    return report
