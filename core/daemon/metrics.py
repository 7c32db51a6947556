"""Prometheus metrics with upstream kube-proxy's names, types, buckets and labels.

Everything lives on the ``CollectorRegistry`` of one ``ProxyMetrics`` (no module-level
state), so tests and several in-process proxies can each have their own. The set, including
which modes register which metrics, follows pkg/proxy/metrics in current Kubernetes, with the
``ip_family`` label upstream added when it made every backend dual-stack; ``process_*`` and
``python_*`` stand in for the Go runtime's ``process_*`` and ``go_*``.

``ProxyMetrics.sync_listener`` is a ``SyncListener``: it reads the ProxyState and the backend's
``SyncResult.counts``. Counts it understands, per IP family value ``F`` (``IPv4``/``IPv6``):

* ``no_local_endpoints_internal_F`` / ``no_local_endpoints_external_F`` — Services with a
  Local traffic policy and no local endpoint (computed from the graph when absent);
* ``iptables_total_TABLE_F`` / ``iptables_last_TABLE_F`` — rules owned in, and rules written
  to, ``TABLE`` (``filter``, ``nat``) by the last sync (left unset when absent).
* ``nftables_cleanup_failures_F`` — stale nftables objects that could not be removed, or
  listings of the table that failed, since the last successful sync (added to the counter).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.registry import Collector

from kubeplex.core.daemon.healthcheck import App, HTTPServing, Response
from kubeplex.core.dataplane import execer
from kubeplex.core.dataplane.backend import SyncResult
from kubeplex.core.model.graph import ProxyState, ServiceGraph
from kubeplex.core.model.types import IPFamily

log = logging.getLogger(__name__)

SUBSYSTEM = "kubeproxy"
#: Upstream's nfacct counter names (the iptables rules count into them).
NFACCT_CT_STATE_INVALID_DROPPED = "ct_state_invalid_dropped_pkts"
NFACCT_LOCALHOST_NODEPORTS_ACCEPTED = "localhost_nps_accepted_pkts"

#: metrics.ExponentialBuckets(0.001, 2, 15): 1 ms .. 16.384 s.
SYNC_BUCKETS = tuple(0.001 * 2**i for i in range(15))
#: metrics.MergeBuckets(...) of network_programming_duration_seconds (it starts at 0).
NETWORK_PROGRAMMING_BUCKETS = (
    0.0,
    0.25,
    0.5,
    *(float(s) for s in range(1, 60)),
    *(float(s) for s in range(60, 116, 5)),
    *(float(s) for s in range(120, 301, 30)),
)
IPTABLES_TABLES = ("filter", "nat")
TRAFFIC_POLICIES = ("internal", "external")

#: Reads an nfacct counter's packet count (None: it could not be read).
NfacctReader = Callable[[str], int | None]

_NFACCT_PKTS = re.compile(r"pkts\s*=\s*(\d+)")


def read_nfacct(name: str, netns: str | None = None, timeout: float = 5.0) -> int | None:
    """Packets of nfacct counter ``name`` (``nfacct get``), in ``netns``; None if unreadable."""
    try:
        proc = execer.run(["nfacct", "get", name], netns, check=False, timeout=timeout)
    except Exception as err:
        log.debug("nfacct get %s: %s", name, err)
        return None
    m = _NFACCT_PKTS.search(proc.stdout) if proc.returncode == 0 else None
    if m is None:
        log.debug("nfacct get %s failed: %s", name, (proc.stderr or proc.stdout).strip())
        return None
    return int(m.group(1))


class NfacctCollector(Collector):
    """A counter read at scrape time from an nfacct object (upstream's nfacctMetricCollector).

    Nothing is exported while the counter cannot be read (no nfacct, no such object).
    """

    def __init__(self, name: str, documentation: str, counter: str, reader: NfacctReader) -> None:
        self.name = name
        self.documentation = documentation
        self.counter = counter
        self.reader = reader

    def describe(self) -> Iterable[Metric]:
        return [CounterMetricFamily(self.name, self.documentation)]

    def collect(self) -> Iterable[Metric]:
        try:
            packets = self.reader(self.counter)
        except Exception:
            log.exception("reading nfacct counter %s failed", self.counter)
            packets = None
        if packets is None:
            return []
        return [CounterMetricFamily(self.name, self.documentation, value=packets)]


class _WithoutCreated(Collector):
    """The registry minus the ``*_created`` series Go's client never writes."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        for metric in self.registry.collect():
            if metric.type in ("counter", "histogram", "summary"):
                metric.samples = [s for s in metric.samples if not s.name.endswith("_created")]
            yield metric


def no_local_endpoints(graph: ServiceGraph) -> tuple[int, int]:
    """(internal, external): Services with a Local policy, endpoints, but none on this node."""
    internal = external = 0
    for spn, svc in graph.services.items():
        if not (svc.internal_policy_local or svc.external_policy_local):
            continue
        cat = graph.categorized(spn)
        if not cat.has_any or cat.local:
            continue
        internal += int(svc.internal_policy_local)
        external += int(svc.external_policy_local)
    return internal, external


class ProxyMetrics:
    """kube-proxy's metrics on a private registry, and the hooks that update them.

    ``mode`` selects the mode-specific metrics as upstream's RegisterMetrics does; ``netns`` is
    where the nfacct counters are read (the node's namespace); ``clock`` gives wall-clock
    seconds for the timestamp gauges and the network programming latency.
    """

    def __init__(
        self,
        mode: str = "iptables",
        *,
        registry: CollectorRegistry | None = None,
        netns: str | None = None,
        nfacct_reader: NfacctReader | None = None,
        process_collectors: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.mode = mode
        self.registry = registry if registry is not None else CollectorRegistry()
        self.clock = clock
        self._lock = threading.Lock()
        reg = self.registry
        fam = ["ip_family"]

        def name(short: str) -> str:
            return f"{SUBSYSTEM}_{short}"

        # --- every mode -------------------------------------------------------------------
        self.sync_proxy_rules_duration = Histogram(
            name("sync_proxy_rules_duration_seconds"),
            "SyncProxyRules latency in seconds",
            fam,
            buckets=SYNC_BUCKETS,
            registry=reg,
        )
        self.sync_proxy_rules_last_queued_timestamp = Gauge(
            name("sync_proxy_rules_last_queued_timestamp_seconds"),
            "The last time a sync of proxy rules was queued",
            fam,
            registry=reg,
        )
        self.sync_proxy_rules_last_timestamp = Gauge(
            name("sync_proxy_rules_last_timestamp_seconds"),
            "The last time proxy rules were successfully synced",
            fam,
            registry=reg,
        )
        self.endpoint_changes_pending = Gauge(
            name("sync_proxy_rules_endpoint_changes_pending"),
            "Pending proxy rules Endpoint changes",
            registry=reg,
        )
        self.endpoint_changes_total = Counter(
            name("sync_proxy_rules_endpoint_changes_total"),
            "Cumulative proxy rules Endpoint changes",
            registry=reg,
        )
        self.service_changes_pending = Gauge(
            name("sync_proxy_rules_service_changes_pending"),
            "Pending proxy rules Service changes",
            registry=reg,
        )
        self.service_changes_total = Counter(
            name("sync_proxy_rules_service_changes_total"),
            "Cumulative proxy rules Service changes",
            registry=reg,
        )
        self.proxy_healthz_total = Counter(
            name("proxy_healthz_total"),
            "Cumulative proxy healthz HTTP status",
            ["code"],
            registry=reg,
        )
        self.proxy_livez_total = Counter(
            name("proxy_livez_total"), "Cumulative proxy livez HTTP status", ["code"], registry=reg
        )
        self.network_programming_duration = Histogram(
            name("network_programming_duration_seconds"),
            "In Cluster Network Programming Latency in seconds",
            fam,
            buckets=NETWORK_PROGRAMMING_BUCKETS,
            registry=reg,
        )
        self.no_local_endpoints_total = Gauge(
            name("sync_proxy_rules_no_local_endpoints_total"),
            "Number of services with a Local traffic policy and no endpoints",
            ["ip_family", "traffic_policy"],
            registry=reg,
        )
        self.conntrack_reconciler_sync_duration: Histogram | None = None
        self.conntrack_reconciler_deleted_entries: Counter | None = None
        if mode != "kernelspace":
            self.conntrack_reconciler_sync_duration = Histogram(
                name("conntrack_reconciler_sync_duration_seconds"),
                "ReconcileConntrackFlowsLatency latency in seconds",
                fam,
                buckets=SYNC_BUCKETS,
                registry=reg,
            )
            self.conntrack_reconciler_deleted_entries = Counter(
                name("conntrack_reconciler_deleted_entries_total"),
                "Cumulative conntrack flows deleted by conntrack reconciler",
                fam,
                registry=reg,
            )

        # --- mode-specific ----------------------------------------------------------------
        self.sync_full_proxy_rules_duration: Histogram | None = None
        self.sync_partial_proxy_rules_duration: Histogram | None = None
        self.iptables_restore_failures: Counter | None = None
        self.iptables_partial_restore_failures: Counter | None = None
        self.iptables_rules_total: Gauge | None = None
        self.iptables_rules_last: Gauge | None = None
        self.nftables_sync_failures: Counter | None = None
        self.nftables_cleanup_failures: Counter | None = None
        if mode in ("iptables", "ipvs"):
            self.iptables_restore_failures = Counter(
                name("sync_proxy_rules_iptables_restore_failures_total"),
                "Cumulative proxy iptables restore failures",
                fam,
                registry=reg,
            )
        if mode == "iptables":
            reader = nfacct_reader or (lambda counter: read_nfacct(counter, netns))
            reg.register(
                NfacctCollector(
                    name("iptables_ct_state_invalid_dropped_packets_total"),
                    "packets dropped by iptables to work around conntrack problems",
                    NFACCT_CT_STATE_INVALID_DROPPED,
                    reader,
                )
            )
            reg.register(
                NfacctCollector(
                    name("iptables_localhost_nodeports_accepted_packets_total"),
                    "Number of packets accepted on nodeports of loopback interface",
                    NFACCT_LOCALHOST_NODEPORTS_ACCEPTED,
                    reader,
                )
            )
            self.sync_full_proxy_rules_duration = Histogram(
                name("sync_full_proxy_rules_duration_seconds"),
                "SyncProxyRules latency in seconds for full resyncs",
                fam,
                buckets=SYNC_BUCKETS,
                registry=reg,
            )
            self.sync_partial_proxy_rules_duration = Histogram(
                name("sync_partial_proxy_rules_duration_seconds"),
                "SyncProxyRules latency in seconds for partial resyncs",
                fam,
                buckets=SYNC_BUCKETS,
                registry=reg,
            )
            self.iptables_partial_restore_failures = Counter(
                name("sync_proxy_rules_iptables_partial_restore_failures_total"),
                "Cumulative proxy iptables partial restore failures",
                fam,
                registry=reg,
            )
            self.iptables_rules_total = Gauge(
                name("sync_proxy_rules_iptables_total"),
                "Total number of iptables rules owned by kube-proxy",
                ["ip_family", "table"],
                registry=reg,
            )
            self.iptables_rules_last = Gauge(
                name("sync_proxy_rules_iptables_last"),
                "Number of iptables rules written by kube-proxy in last sync",
                ["ip_family", "table"],
                registry=reg,
            )
        if mode == "nftables":
            self.nftables_sync_failures = Counter(
                name("sync_proxy_rules_nftables_sync_failures_total"),
                "Cumulative proxy nftables sync failures",
                fam,
                registry=reg,
            )
            self.nftables_cleanup_failures = Counter(
                name("sync_proxy_rules_nftables_cleanup_failures_total"),
                "Cumulative proxy nftables cleanup failures",
                fam,
                registry=reg,
            )

        if process_collectors:
            ProcessCollector(registry=reg)
            PlatformCollector(registry=reg)
            GCCollector(registry=reg)

    # --- hooks ----------------------------------------------------------------------------

    def sync_listener(self, state: ProxyState, result: SyncResult, elapsed: float) -> None:
        """After a successful apply: latencies, timestamps, rule and no-endpoint counts."""
        now = self.clock()
        counts = result.counts
        for family, graph in state.graphs.items():
            fam = family.value
            self.sync_proxy_rules_duration.labels(fam).observe(elapsed)
            split = (
                self.sync_full_proxy_rules_duration
                if result.full
                else self.sync_partial_proxy_rules_duration
            )
            if split is not None:
                split.labels(fam).observe(elapsed)
            self.sync_proxy_rules_last_timestamp.labels(fam).set(now)

            change = state.changes.get(family)
            triggers = change.trigger_times if change is not None else {}
            for when in triggers.values():
                self.network_programming_duration.labels(fam).observe(max(0.0, now - when))

            keys = [f"no_local_endpoints_{p}_{fam}" for p in TRAFFIC_POLICIES]
            if all(k in counts for k in keys):
                values: Sequence[int] = [counts[k] for k in keys]
            else:
                values = no_local_endpoints(graph)
            for policy, value in zip(TRAFFIC_POLICIES, values, strict=True):
                self.no_local_endpoints_total.labels(fam, policy).set(value)

            for gauge, prefix in (
                (self.iptables_rules_total, "iptables_total"),
                (self.iptables_rules_last, "iptables_last"),
            ):
                if gauge is None:
                    continue
                for table in IPTABLES_TABLES:
                    key = f"{prefix}_{table}_{fam}"
                    if key in counts:
                        gauge.labels(fam, table).set(counts[key])

            cleanup = counts.get(f"nftables_cleanup_failures_{fam}", 0)
            if cleanup and self.nftables_cleanup_failures is not None:
                self.nftables_cleanup_failures.labels(fam).inc(cleanup)

    def sync_failed(
        self, families: Iterable[IPFamily], *, partial: bool = False, elapsed: float | None = None
    ) -> None:
        """The sync of ``families`` failed: the mode's failure counters of just those, and
        (``elapsed``) its duration, which upstream observes for failed syncs too."""
        for family in families:
            fam = family.value
            if elapsed is not None:
                self.sync_proxy_rules_duration.labels(fam).observe(elapsed)
                split = (
                    self.sync_partial_proxy_rules_duration
                    if partial
                    else self.sync_full_proxy_rules_duration
                )
                if split is not None:
                    split.labels(fam).observe(elapsed)
            if self.iptables_restore_failures is not None:
                self.iptables_restore_failures.labels(fam).inc()
            if partial and self.iptables_partial_restore_failures is not None:
                self.iptables_partial_restore_failures.labels(fam).inc()
            if self.nftables_sync_failures is not None:
                self.nftables_sync_failures.labels(fam).inc()

    def cleanup_failed(self, families: Iterable[IPFamily]) -> None:
        """nftables mode: removing stale chains/maps failed."""
        if self.nftables_cleanup_failures is not None:
            for family in families:
                self.nftables_cleanup_failures.labels(family.value).inc()

    def queued(self, families: Iterable[IPFamily], when: float | None = None) -> None:
        """A sync was queued (a change arrived)."""
        ts = self.clock() if when is None else when
        for family in families:
            self.sync_proxy_rules_last_queued_timestamp.labels(family.value).set(ts)

    def set_pending(self, services: int, endpoints: int) -> None:
        self.service_changes_pending.set(services)
        self.endpoint_changes_pending.set(endpoints)

    def add_changes(self, services: int = 0, endpoints: int = 0) -> None:
        if services > 0:
            self.service_changes_total.inc(services)
        if endpoints > 0:
            self.endpoint_changes_total.inc(endpoints)

    def health_probe(self, probe: str, code: int) -> None:
        """A /healthz or /livez answer (the ``ProbeHook`` of the health server)."""
        counter = self.proxy_livez_total if probe == "livez" else self.proxy_healthz_total
        counter.labels(str(code)).inc()

    def conntrack_cleaned(self, family: IPFamily, seconds: float, deleted: int) -> None:
        """One family's conntrack cleanup after a sync: its duration and flows deleted."""
        if self.conntrack_reconciler_sync_duration is not None:
            self.conntrack_reconciler_sync_duration.labels(family.value).observe(seconds)
        if self.conntrack_reconciler_deleted_entries is not None and deleted > 0:
            self.conntrack_reconciler_deleted_entries.labels(family.value).inc(deleted)

    # --- exposition -----------------------------------------------------------------------

    def exposition(self) -> bytes:
        """The Prometheus text format (0.0.4) of every metric, as /metrics serves it."""
        return generate_latest(_WithoutCreated(self.registry))

    def value(self, name: str, labels: Mapping[str, str] | None = None) -> float | None:
        """One sample's value (tests and debugging)."""
        found = self.registry.get_sample_value(name, dict(labels or {}))
        return None if found is None else float(found)


class MetricsServer:
    """``/metrics``, ``/proxyMode`` and ``/healthz`` on metricsBindAddress, like upstream."""

    def __init__(
        self,
        serving: HTTPServing,
        metrics: ProxyMetrics,
        host: str,
        port: int,
        *,
        netns: str | None = None,
    ) -> None:
        self.metrics = metrics
        self._serving = serving
        self._server = serving.listen(host, port, self.app, netns=netns)
        self.address = serving.address_of(self._server)

    @property
    def app(self) -> App:
        return self._app

    def _app(self, method: str, path: str) -> Response:
        nosniff = ("X-Content-Type-Options", "nosniff")
        text = ("Content-Type", "text/plain; charset=utf-8")
        if path == "/metrics":
            return 200, (("Content-Type", CONTENT_TYPE_PLAIN_0_0_4),), self.metrics.exposition()
        if path == "/proxyMode":
            return 200, (text, nosniff), self.metrics.mode.encode()
        if path == "/healthz":
            return 200, (text, nosniff), b"ok"
        return 404, (text, nosniff), b"404 page not found\n"

    def close(self) -> None:
        self._serving.close(self._server)
