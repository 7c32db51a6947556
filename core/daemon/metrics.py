"""Prometheus metrics with upstream kube-proxy's names, types, buckets and labels.

Everything lives on the ``CollectorRegistry`` of one ``ProxyMetrics`` (no module-level
state), so tests and several in-process proxies can each have their own. The families every
mode has are registered here, as pkg/proxy/metrics in current Kubernetes does, with the
``ip_family`` label upstream added when it made every backend dual-stack; ``process_*`` and
``python_*`` stand in for the Go runtime's ``process_*`` and ``go_*``. The rest is the
backend's: the families of its ``metric_families()`` (in its order, after the common ones),
the conntrack reconciler's only if it ``uses_conntrack``.

A contributed family is fed by the typed fields of ``SyncResult`` (``samples``), by the
daemon's events (``MetricFamily.on``: failed syncs and sync durations), or, if ``scraped``,
by ``Backend.scrape()`` at every scrape (nothing is exported while it gives no sample).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from prometheus_client.gc_collector import GCCollector
from prometheus_client.metrics import Counter, Gauge, Histogram, MetricWrapperBase
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector, CollectorRegistry

from kubeplex.core.daemon.httpserving import App, HTTPServing, Response
from kubeplex.core.dataplane.backend import (
    Backend,
    MetricEvent,
    MetricFamily,
    NoLocalEndpoints,
    Sample,
    SyncResult,
)
from kubeplex.core.model.graph import ProxyState, ServiceGraph
from kubeplex.core.model.types import IPFamily

#: The text format /metrics answers in (prometheus_client's ``CONTENT_TYPE_PLAIN_0_0_4``).
TEXT_FORMAT = "text/plain; version=0.0.4; charset=utf-8"

log = logging.getLogger(__name__)

SUBSYSTEM = "kubeproxy"

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
TRAFFIC_POLICIES = ("internal", "external")
#: The label of the families the daemon's events feed (or none at all).
_EVENT_LABELS = (("ip_family",), ())


class ScrapedFamilies(Collector):
    """The backend's ``scraped`` families, read through one ``Backend.scrape()`` per scrape
    (upstream's nfacctMetricCollector, for any mode). A family without a sample is left out;
    so is everything while ``scrape`` fails."""

    def __init__(self, backend: Backend, specs: Sequence[MetricFamily]) -> None:
        self.backend = backend
        self.specs = tuple(specs)

    def _family(self, spec: MetricFamily) -> CounterMetricFamily | GaugeMetricFamily:
        kind = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
        return kind(spec.name, spec.help, labels=spec.labels)

    def describe(self) -> Iterable[Metric]:
        return [self._family(spec) for spec in self.specs]

    def collect(self) -> Iterable[Metric]:
        try:
            samples = list(self.backend.scrape())
        except Exception:
            log.exception("reading the %s backend's counters failed", self.backend.mode)
            return []
        values: dict[str, dict[tuple[str, ...], float]] = {}
        for sample in samples:
            values.setdefault(sample.family, {})[sample.labels] = sample.value
        out: list[Metric] = []
        for spec in self.specs:
            found = values.get(spec.name)
            if not found:
                continue
            family = self._family(spec)
            for labels, value in found.items():
                family.add_metric(list(labels), value)
            out.append(family)
        return out


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


def family_seconds(
    backend: Backend, families: Iterable[IPFamily], elapsed: float
) -> dict[IPFamily, float]:
    """Each family's share of a sync that took ``elapsed`` seconds, as upstream's proxier per
    family times its own: what the backend timed of it (``Backend.render_seconds`` and
    ``write_seconds``), and the rest of the sync in proportion."""
    families = list(families)
    render, write = backend.render_seconds, backend.write_seconds
    timed = {f: render.get(f, 0.0) + write.get(f, 0.0) for f in families}
    total = sum(timed.values())
    if total <= 0.0:
        return dict.fromkeys(families, elapsed)
    rest = max(0.0, elapsed - total)
    return {f: timed[f] + rest * timed[f] / total for f in families}


class ProxyMetrics:
    """kube-proxy's metrics on a private registry, and the hooks that update them.

    The families every mode has, plus what ``backend`` contributes (see the module doc);
    ``clock`` gives wall-clock seconds for the timestamp gauges and the network programming
    latency.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        registry: CollectorRegistry | None = None,
        process_collectors: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.backend = backend
        #: What /proxyMode answers.
        self.mode = backend.mode
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
        # kubeplex's own: upstream fails a whole sync where kubeplex leaves one Service out.
        self.services_not_programmed = Gauge(
            "kubeplex_sync_proxy_rules_services_not_programmed",
            "Services the last successful sync left out (their previous rules kept)",
            registry=reg,
        )
        self.service_failures_total = Counter(
            "kubeplex_sync_proxy_rules_service_failures_total",
            "Cumulative syncs that left a Service out, by Service",
            ["namespace", "name"],
            registry=reg,
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
        # kubeplex's own (no upstream metric says it): see docs/backends.md, "Metrics".
        self.drift_repaired_total = Counter(
            "kubeplex_drift_repaired_rules_total",
            "Rules of kubeplex's own chains found differing from what it last wrote (extra, "
            "missing or changed by someone else) and written again by a full sync",
            ["mode", "kind"],
            registry=reg,
        )
        self.conntrack_reconciler_sync_duration: Histogram | None = None
        self.conntrack_reconciler_deleted_entries: Counter | None = None
        if backend.uses_conntrack:
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

        # --- the backend's ----------------------------------------------------------------
        #: The backend's families by name, and their metrics (scraped ones have none).
        self.families: dict[str, MetricFamily] = {}
        self.contributed: dict[str, MetricWrapperBase] = {}
        self._register_contributed(backend.metric_families())

        if process_collectors:
            ProcessCollector(registry=reg)
            PlatformCollector(registry=reg)
            GCCollector(registry=reg)

    def _register_contributed(self, specs: Sequence[MetricFamily]) -> None:
        specs = list(specs)
        scraped = [s for s in specs if s.scraped]
        for spec in specs:
            if spec.name in self.families:
                raise ValueError(f"metric family {spec.name} declared twice")
            if spec.on is not MetricEvent.NONE and spec.labels not in _EVENT_LABELS:
                raise ValueError(
                    f"metric family {spec.name}: a family fed by {spec.on.value} is labelled "
                    f"by ip_family only, not {spec.labels}"
                )
            if spec.scraped and spec.kind == "histogram":
                raise ValueError(f"metric family {spec.name}: a scraped histogram")
            self.families[spec.name] = spec
            if spec.scraped:
                # One collector for all of them (one scrape), where the first one stands.
                if spec is scraped[0]:
                    self.registry.register(ScrapedFamilies(self.backend, scraped))
                continue
            self.contributed[spec.name] = _new_metric(spec, self.registry)

    # --- hooks ----------------------------------------------------------------------------

    def _on(self, event: MetricEvent) -> list[tuple[MetricFamily, MetricWrapperBase]]:
        return [
            (self.families[n], m)
            for n, m in self.contributed.items()
            if self.families[n].on is event
        ]

    def _event(self, event: MetricEvent, family: IPFamily, value: float | None = None) -> None:
        """Feed ``event`` of ``family`` to the contributed families that want it: +1 to a
        counter, ``value`` observed in a histogram."""
        for spec, metric in self._on(event):
            child = metric.labels(family.value) if spec.labels else metric
            if spec.kind == "histogram":
                if value is not None:
                    child.observe(value)  # type: ignore[attr-defined]
            else:
                child.inc()  # type: ignore[attr-defined]

    def _sample(self, sample: Sample) -> None:
        spec = self.families.get(sample.family)
        metric = self.contributed.get(sample.family)
        if spec is None or metric is None:
            log.warning("sample of unknown or scraped metric family %s ignored", sample.family)
            return
        if len(sample.labels) != len(spec.labels):
            log.warning("sample of %s with labels %s ignored", sample.family, sample.labels)
            return
        if spec.kind == "counter" and not sample.add:
            log.warning("sample of counter %s sets it: ignored (counters are added to)", spec.name)
            return
        if sample.add and not sample.value and spec.kind != "histogram":
            return  # adding nothing makes no series
        child = metric.labels(*sample.labels) if spec.labels else metric
        if spec.kind == "histogram":
            child.observe(sample.value)  # type: ignore[attr-defined]
        elif sample.add:
            child.inc(sample.value)  # type: ignore[attr-defined]
        else:
            child.set(sample.value)  # type: ignore[attr-defined]

    def sync_listener(self, state: ProxyState, result: SyncResult, elapsed: float) -> None:
        """After a successful apply: latencies, timestamps, no-endpoint counts, the backend's
        samples."""
        now = self.clock()
        split = MetricEvent.FULL_SYNC_SECONDS if result.full else MetricEvent.PARTIAL_SYNC_SECONDS
        seconds = family_seconds(self.backend, state.graphs, elapsed)
        for family, graph in state.graphs.items():
            fam = family.value
            self.sync_proxy_rules_duration.labels(fam).observe(seconds[family])
            self._event(split, family, seconds[family])
            self.sync_proxy_rules_last_timestamp.labels(fam).set(now)

            change = state.changes.get(family)
            triggers = change.trigger_times if change is not None else {}
            for when in triggers.values():
                self.network_programming_duration.labels(fam).observe(max(0.0, now - when))

            counted = result.no_local_endpoints.get(family)
            if counted is None:
                counted = NoLocalEndpoints(*no_local_endpoints(graph))
            for policy, value in zip(
                TRAFFIC_POLICIES, (counted.internal, counted.external), strict=True
            ):
                self.no_local_endpoints_total.labels(fam, policy).set(value)
        for sample in result.samples:
            self._sample(sample)
        for drift in result.repaired:
            self.drift_repaired_total.labels(self.mode, drift.change).inc()

    def sync_failed(
        self, families: Iterable[IPFamily], *, partial: bool = False, elapsed: float | None = None
    ) -> None:
        """The sync of ``families`` failed: the backend's failure counters of just those, and
        (``elapsed``) its duration, which upstream observes for failed syncs too."""
        split = MetricEvent.PARTIAL_SYNC_SECONDS if partial else MetricEvent.FULL_SYNC_SECONDS
        for family in families:
            if elapsed is not None:
                self.sync_proxy_rules_duration.labels(family.value).observe(elapsed)
                self._event(split, family, elapsed)
            self._event(MetricEvent.SYNC_FAILED, family)
            if partial:
                self._event(MetricEvent.PARTIAL_SYNC_FAILED, family)

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

    def left_out(self, failed: Mapping[str, str]) -> None:
        """The Services a successful sync left out (``SyncResult.failed``: service port ->
        why): +1 each, however many of its ports."""
        services = {service_of(port) for port in failed}
        self.services_not_programmed.set(len(services))
        for namespace, name in services:
            self.service_failures_total.labels(namespace, name).inc()

    def conntrack_cleaned(self, family: IPFamily, seconds: float, deleted: int) -> None:
        """One family's conntrack cleanup after a sync: its duration and flows deleted."""
        if self.conntrack_reconciler_sync_duration is not None:
            self.conntrack_reconciler_sync_duration.labels(family.value).observe(seconds)
        if self.conntrack_reconciler_deleted_entries is not None and deleted > 0:
            self.conntrack_reconciler_deleted_entries.labels(family.value).inc(deleted)

    # --- exposition -----------------------------------------------------------------------

    def exposition(self) -> bytes:
        """The Prometheus text format (0.0.4) of every metric, as /metrics serves it."""
        from prometheus_client.exposition import generate_latest

        return generate_latest(_WithoutCreated(self.registry))

    def value(self, name: str, labels: Mapping[str, str] | None = None) -> float | None:
        """One sample's value (tests and debugging)."""
        found = self.registry.get_sample_value(name, dict(labels or {}))
        return None if found is None else float(found)


def service_of(service_port: str) -> tuple[str, str]:
    """(namespace, name) of a service port named as ``SyncResult.failed`` names it
    ("namespace/name:port")."""
    namespace, _, rest = service_port.rpartition("/")
    return namespace, rest.split(":", 1)[0]


def _new_metric(spec: MetricFamily, registry: CollectorRegistry) -> MetricWrapperBase:
    """The prometheus_client metric of a contributed, not scraped, family."""
    labels = list(spec.labels)
    if spec.kind == "histogram":
        return Histogram(
            spec.name, spec.help, labels, buckets=spec.buckets or SYNC_BUCKETS, registry=registry
        )
    if spec.kind == "gauge":
        return Gauge(spec.name, spec.help, labels, registry=registry)
    return Counter(spec.name, spec.help, labels, registry=registry)


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
            return 200, (("Content-Type", TEXT_FORMAT),), self.metrics.exposition()
        if path == "/proxyMode":
            return 200, (text, nosniff), self.metrics.mode.encode()
        if path == "/healthz":
            return 200, (text, nosniff), b"ok"
        return 404, (text, nosniff), b"404 page not found\n"

    def close(self) -> None:
        self._serving.close(self._server)
