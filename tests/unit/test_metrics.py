"""kube-proxy's metrics: upstream names, types, labels and buckets; the sync listener; what a
backend contributes (families fed by samples, events and scrapes)."""

from __future__ import annotations

import http.client
import logging
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import pytest
from kits.http_kit import serving_loop

from kubeplex.core.config.kubeproxy import default_config, with_overrides
from kubeplex.core.daemon.httpserving import HTTPServing
from kubeplex.core.daemon.metrics import (
    NETWORK_PROGRAMMING_BUCKETS,
    SYNC_BUCKETS,
    MetricsServer,
    ProxyMetrics,
    no_local_endpoints,
)
from kubeplex.core.daemon.operations import start_operations
from kubeplex.core.daemon.proxier import Proxier
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import (
    Backend,
    BackendContext,
    MetricEvent,
    MetricFamily,
    NoLocalEndpoints,
    Rendered,
    Sample,
    SyncResult,
)
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.errors import BackendError
from kubeplex.core.model.graph import ProxyState
from kubeplex.core.model.types import IPFamily
from kubeplex.testing import fakes
from kubeplex.testing.dataplane import endpoint, endpoint_slice, service

NODE = "node-a"
T0 = 1_700_000_000.0
V4 = {"ip_family": "IPv4"}
DUAL = (IPFamily.IPv4, IPFamily.IPv6)
#: Upstream's nfacct counter names (the iptables rules count into them).
NFACCT_CT_STATE_INVALID_DROPPED = "ct_state_invalid_dropped_pkts"
NFACCT_LOCALHOST_NODEPORTS_ACCEPTED = "localhost_nps_accepted_pkts"
IPTABLES_TOTAL = "kubeproxy_sync_proxy_rules_iptables_total"
IPTABLES_LAST = "kubeproxy_sync_proxy_rules_iptables_last"
NFT_CLEANUP_FAILURES = "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total"

#: name -> (type, labels) of every kubeproxy_* family in iptables mode (current upstream).
IPTABLES_FAMILIES = {
    "kubeproxy_sync_proxy_rules_duration_seconds": ("histogram", {"ip_family"}),
    "kubeproxy_sync_full_proxy_rules_duration_seconds": ("histogram", {"ip_family"}),
    "kubeproxy_sync_partial_proxy_rules_duration_seconds": ("histogram", {"ip_family"}),
    "kubeproxy_sync_proxy_rules_last_timestamp_seconds": ("gauge", {"ip_family"}),
    "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds": ("gauge", {"ip_family"}),
    "kubeproxy_network_programming_duration_seconds": ("histogram", {"ip_family"}),
    "kubeproxy_sync_proxy_rules_endpoint_changes_pending": ("gauge", set()),
    "kubeproxy_sync_proxy_rules_endpoint_changes_total": ("counter", set()),
    "kubeproxy_sync_proxy_rules_service_changes_pending": ("gauge", set()),
    "kubeproxy_sync_proxy_rules_service_changes_total": ("counter", set()),
    "kubeproxy_sync_proxy_rules_iptables_restore_failures_total": ("counter", {"ip_family"}),
    "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total": (
        "counter",
        {"ip_family"},
    ),
    "kubeproxy_sync_proxy_rules_iptables_total": ("gauge", {"ip_family", "table"}),
    "kubeproxy_sync_proxy_rules_iptables_last": ("gauge", {"ip_family", "table"}),
    "kubeproxy_sync_proxy_rules_no_local_endpoints_total": (
        "gauge",
        {"ip_family", "traffic_policy"},
    ),
    "kubeproxy_proxy_healthz_total": ("counter", {"code"}),
    "kubeproxy_proxy_livez_total": ("counter", {"code"}),
    "kubeproxy_conntrack_reconciler_sync_duration_seconds": ("histogram", {"ip_family"}),
    "kubeproxy_conntrack_reconciler_deleted_entries_total": ("counter", {"ip_family"}),
    "kubeproxy_iptables_ct_state_invalid_dropped_packets_total": ("counter", set()),
    "kubeproxy_iptables_localhost_nodeports_accepted_packets_total": ("counter", set()),
}

#: upstream's ipvs mode: of the mode-specific families, only the iptables restore failures.
IPVS_FAMILIES = (
    MetricFamily(
        "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
        "Cumulative proxy iptables restore failures",
        "counter",
        on=MetricEvent.SYNC_FAILED,
    ),
)


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def real_backend(mode: str, nfacct: dict[str, int] | None = None) -> Backend:
    """The installed backend of ``mode``, on its in-memory kernel (iptables: these nfacct
    counters, by default upstream's two with 7 and 3 packets)."""
    kernel = fakes.for_mode(mode)
    if isinstance(kernel, fakes.FakeIptables):
        kernel.nfacct = (
            {NFACCT_CT_STATE_INVALID_DROPPED: 7, NFACCT_LOCALHOST_NODEPORTS_ACCEPTED: 3}
            if nfacct is None
            else nfacct
        )
    cfg = with_overrides(default_config(), mode=mode, known_modes=plugins.known_modes())
    return plugins.load_backend(mode, BackendContext(cfg, NODE, DUAL, kernel=kernel))


class Declared(Backend):
    """A dual-stack backend double that declares ``families`` and scrapes ``scraped``;
    ``fail`` is what apply raises (None: it succeeds)."""

    def __init__(
        self,
        mode: str = "iptables",
        families: Sequence[MetricFamily] = (),
        scraped: Sequence[Sample] = (),
        uses_conntrack: bool = True,
    ) -> None:
        super().__init__(BackendContext(default_config(), NODE, DUAL))
        self.mode = mode
        self.families = tuple(families)
        self.scraped = list(scraped)
        self.uses_conntrack = uses_conntrack
        self.scrapes = 0
        self.fail: BackendError | None = None

    def render(self, state: ProxyState, observed: object = None) -> Rendered:
        return _Rendered(state.is_full())

    def apply(self, rendered: Rendered) -> SyncResult:
        if self.fail is not None:
            raise self.fail
        return SyncResult(full=rendered.full)

    def metric_families(self) -> Sequence[MetricFamily]:
        return self.families

    def scrape(self) -> Sequence[Sample]:
        self.scrapes += 1
        return self.scraped


@dataclass
class _Rendered(Rendered):
    is_full: bool

    @property
    def full(self) -> bool:
        return self.is_full

    def __str__(self) -> str:
        return ""


def new_metrics(mode: str = "iptables", **kwargs: object) -> ProxyMetrics:
    backend = Declared("ipvs", IPVS_FAMILIES) if mode == "ipvs" else real_backend(mode)
    return ProxyMetrics(backend, clock=Clock(), **kwargs)  # type: ignore[arg-type]


def families(text: str) -> dict[str, str]:
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE))


def label_names(text: str, family: str) -> set[str]:
    names: set[str] = set()
    for labels in re.findall(rf"^{family}(?:_bucket|_count|_sum|_total)?{{([^}}]*)}}", text, re.M):
        names |= {kv.split("=", 1)[0] for kv in labels.split(",")}
    return names - {"le"}


@dataclass(frozen=True)
class ChangesWithTriggers:
    """A change set as the tracker can report it: with EndpointSlice trigger times."""

    full: bool = False
    trigger_times: dict[str, float] = field(default_factory=dict)


def v4_state(triggers: dict[str, float] | None = None) -> ProxyState:
    state = ClusterState(NODE, (IPFamily.IPv4,)).checkout(full=True)
    if triggers is None:
        return state
    changes = {IPFamily.IPv4: ChangesWithTriggers(trigger_times=triggers)}
    return ProxyState(state.node, state.graphs, changes)  # type: ignore[arg-type]


def touch_everything(m: ProxyMetrics) -> None:
    """Give every labelled metric a sample, through the hooks the daemon calls, so its labels
    show in the exposition."""
    rules = tuple(Sample(f, ("IPv4", "nat"), 1) for f in (IPTABLES_TOTAL, IPTABLES_LAST))
    m.sync_listener(v4_state({"default/web": T0 - 1}), SyncResult(True, samples=rules), 0.1)
    m.sync_listener(v4_state(), SyncResult(full=False), 0.1)
    m.queued([IPFamily.IPv4])
    m.sync_failed([IPFamily.IPv4], partial=True)
    m.health_probe("healthz", 200)
    m.health_probe("livez", 200)
    m.conntrack_cleaned(IPFamily.IPv4, 0.01, 2)


def test_iptables_mode_exposes_upstreams_families_types_and_labels() -> None:
    m = new_metrics()
    touch_everything(m)
    text = m.exposition().decode()
    found = {k: v for k, v in families(text).items() if k.startswith("kubeproxy_")}
    assert found == {name: kind for name, (kind, _) in IPTABLES_FAMILIES.items()}
    for name, (_, labels) in IPTABLES_FAMILIES.items():
        assert label_names(text, name) == labels, name
    assert "_created" not in text  # Go's client writes no *_created series
    assert "process_resident_memory_bytes" in text and "python_info" in text
    assert "kubeproxy_iptables_ct_state_invalid_dropped_packets_total 7.0" in text
    assert "kubeproxy_iptables_localhost_nodeports_accepted_packets_total 3.0" in text


def test_buckets_are_upstreams() -> None:
    assert SYNC_BUCKETS[0] == 0.001 and len(SYNC_BUCKETS) == 15
    assert SYNC_BUCKETS[-1] == pytest.approx(16.384)
    assert NETWORK_PROGRAMMING_BUCKETS[:4] == (0.0, 0.25, 0.5, 1.0)
    assert NETWORK_PROGRAMMING_BUCKETS[-8:] == (
        115.0,
        120.0,
        150.0,
        180.0,
        210.0,
        240.0,
        270.0,
        300.0,
    )
    assert len(NETWORK_PROGRAMMING_BUCKETS) == 1 + 2 + 59 + 12 + 7
    m = new_metrics()
    m.sync_proxy_rules_duration.labels("IPv4").observe(0.003)
    text = m.exposition().decode()
    assert (
        'kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.002"} 0.0'
        in text
    )
    assert (
        'kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.004"} 1.0'
        in text
    )
    # A contributed histogram without buckets of its own has the sync buckets.
    m.sync_listener(v4_state(), SyncResult(full=True), 0.003)
    full = "kubeproxy_sync_full_proxy_rules_duration_seconds_bucket"
    assert f'{full}{{ip_family="IPv4",le="0.004"}} 1.0' in m.exposition().decode()


def test_mode_specific_metrics_follow_upstreams_registration() -> None:
    nft = families(new_metrics("nftables").exposition().decode())
    assert "kubeproxy_sync_proxy_rules_nftables_sync_failures_total" in nft
    assert NFT_CLEANUP_FAILURES in nft
    assert not [n for n in nft if "iptables" in n or "full_proxy" in n]
    ipvs = families(new_metrics("ipvs").exposition().decode())
    assert "kubeproxy_sync_proxy_rules_iptables_restore_failures_total" in ipvs
    assert "kubeproxy_sync_proxy_rules_iptables_total" not in ipvs
    m = new_metrics("nftables")
    m.sync_failed([IPFamily.IPv6])
    v6 = ClusterState(NODE, (IPFamily.IPv6,)).checkout(full=True)
    m.sync_listener(
        v6, SyncResult(True, samples=(Sample(NFT_CLEANUP_FAILURES, ("IPv6",), 1, True),)), 0.1
    )
    assert (
        m.value("kubeproxy_sync_proxy_rules_nftables_sync_failures_total", {"ip_family": "IPv6"})
        == 1
    )
    assert m.value(NFT_CLEANUP_FAILURES, {"ip_family": "IPv6"}) == 1


def test_a_mode_without_conntrack_has_no_reconciler_metrics() -> None:
    text = ProxyMetrics(real_backend("kernelspace"), process_collectors=False)
    assert not [n for n in families(text.exposition().decode()) if "conntrack" in n]
    with_ct = ProxyMetrics(Declared(), process_collectors=False).exposition().decode()
    assert "kubeproxy_conntrack_reconciler_sync_duration_seconds" in families(with_ct)


def test_registries_are_private() -> None:
    a, b = new_metrics(process_collectors=False), new_metrics(process_collectors=False)
    a.health_probe("healthz", 503)
    assert a.value("kubeproxy_proxy_healthz_total", {"code": "503"}) == 1
    assert b.value("kubeproxy_proxy_healthz_total", {"code": "503"}) is None


def test_an_unreadable_nfacct_counter_is_left_out() -> None:
    m = ProxyMetrics(real_backend("iptables", nfacct={}), process_collectors=False)
    assert "iptables_ct_state_invalid" not in m.exposition().decode()
    assert m.value("kubeproxy_iptables_ct_state_invalid_dropped_packets_total") is None


# ------------------------------------------------------------------- contributed families

SCRAPED = (
    MetricFamily("kubeproxy_a_packets_total", "a", "counter", labels=(), scraped=True),
    MetricFamily("kubeproxy_b_packets", "b", "gauge", labels=("ip_family",), scraped=True),
)


def test_scraped_families_are_read_once_per_scrape_and_only_when_there() -> None:
    backend = Declared(families=SCRAPED, scraped=[Sample("kubeproxy_a_packets_total", (), 5)])
    m = ProxyMetrics(backend, process_collectors=False)
    assert backend.scrapes == 0  # registering reads nothing
    text = m.exposition().decode()
    assert backend.scrapes == 1
    assert "kubeproxy_a_packets_total 5.0" in text
    assert "kubeproxy_b_packets" not in text  # no sample: nothing exported
    backend.scraped.append(Sample("kubeproxy_b_packets", ("IPv6",), 2))
    assert 'kubeproxy_b_packets{ip_family="IPv6"} 2.0' in m.exposition().decode()


def test_a_failing_scrape_exports_nothing_of_it(caplog: pytest.LogCaptureFixture) -> None:
    class Failing(Declared):
        def scrape(self) -> Sequence[Sample]:
            raise RuntimeError("no nfacct here")

    m = ProxyMetrics(Failing(families=SCRAPED), process_collectors=False)
    with caplog.at_level(logging.ERROR):
        text = m.exposition().decode()
    assert "kubeproxy_a_packets" not in text and "kubeproxy_proxy_healthz_total" in text
    assert "no nfacct here" in caplog.text


def test_samples_set_gauges_and_add_to_counters() -> None:
    declared = (
        MetricFamily("kubeproxy_g", "g", "gauge", labels=("ip_family", "table")),
        MetricFamily("kubeproxy_c_total", "c", "counter"),
    )
    m = ProxyMetrics(Declared(families=declared), process_collectors=False)
    samples = (
        Sample("kubeproxy_g", ("IPv4", "nat"), 4),
        Sample("kubeproxy_c_total", ("IPv4",), 2, add=True),
        Sample("kubeproxy_c_total", ("IPv6",), 0, add=True),  # adds nothing: no series
        Sample("kubeproxy_unknown", ("IPv4",), 1),  # ignored
        Sample("kubeproxy_g", ("IPv4",), 1),  # wrong labels: ignored
    )
    for _ in range(2):
        m.sync_listener(v4_state(), SyncResult(True, samples=samples), 0.1)
    assert m.value("kubeproxy_g", {"ip_family": "IPv4", "table": "nat"}) == 4
    assert m.value("kubeproxy_c_total", V4) == 4
    assert 'kubeproxy_c_total{ip_family="IPv6"}' not in m.exposition().decode()


def test_event_families_are_labelled_by_ip_family_only() -> None:
    bad = MetricFamily("kubeproxy_x_total", "x", "counter", ("table",), on=MetricEvent.SYNC_FAILED)
    with pytest.raises(ValueError, match="ip_family only"):
        ProxyMetrics(Declared(families=[bad]), process_collectors=False)
    twice = [IPVS_FAMILIES[0], IPVS_FAMILIES[0]]
    with pytest.raises(ValueError, match="twice"):
        ProxyMetrics(Declared(families=twice), process_collectors=False)


# ------------------------------------------------------------------------------ sync listener


def local_policy_state() -> ProxyState:
    cluster = ClusterState(NODE, (IPFamily.IPv4,))
    cluster.set_service(service("itp", "10.96.0.1", internal_traffic_policy="Local"))
    cluster.set_endpoint_slice(endpoint_slice("itp", [endpoint("10.244.2.2", "node-b")]))
    cluster.set_service(
        service(
            "lb",
            "10.96.0.2",
            type="LoadBalancer",
            node_port=30001,
            external_traffic_policy="Local",
            health_check_node_port=32001,
        )
    )
    cluster.set_endpoint_slice(endpoint_slice("lb", [endpoint("10.244.2.3", "node-b")]))
    cluster.set_service(service("ok", "10.96.0.3", internal_traffic_policy="Local"))
    cluster.set_endpoint_slice(endpoint_slice("ok", [endpoint("10.244.1.2", NODE)]))
    cluster.set_service(service("empty", "10.96.0.4", internal_traffic_policy="Local"))
    return cluster.checkout(full=True)


def test_no_local_endpoints_is_computed_from_the_graph() -> None:
    state = local_policy_state()
    # itp: internal, lb: external; ok has a local endpoint; empty has no endpoint at all.
    assert no_local_endpoints(state.graphs[IPFamily.IPv4]) == (1, 1)


def test_sync_listener_records_a_full_and_a_partial_sync() -> None:
    m = new_metrics()
    state = local_policy_state()
    m.sync_listener(state, SyncResult(full=True), 0.004)
    assert m.value("kubeproxy_sync_proxy_rules_duration_seconds_count", V4) == 1
    assert m.value("kubeproxy_sync_full_proxy_rules_duration_seconds_sum", V4) == 0.004
    assert m.value("kubeproxy_sync_partial_proxy_rules_duration_seconds_count", V4) is None
    assert m.value("kubeproxy_sync_proxy_rules_last_timestamp_seconds", V4) == T0
    policy = {"ip_family": "IPv4", "traffic_policy": "internal"}
    assert m.value("kubeproxy_sync_proxy_rules_no_local_endpoints_total", policy) == 1

    # The backend's own count wins; the iptables_* gauges come from its samples only; no key
    # of `counts` is read.
    result = SyncResult(
        full=False,
        counts={"no_local_endpoints_internal_IPv4": 9, "iptables_last_filter_IPv4": 9},
        no_local_endpoints={IPFamily.IPv4: NoLocalEndpoints(internal=5, external=6)},
        samples=(
            Sample(IPTABLES_TOTAL, ("IPv4", "nat"), 40),
            Sample(IPTABLES_TOTAL, ("IPv4", "filter"), 9),
            Sample(IPTABLES_LAST, ("IPv4", "nat"), 4),
        ),
    )
    m.sync_listener(state, result, 0.002)
    assert m.value("kubeproxy_sync_partial_proxy_rules_duration_seconds_count", V4) == 1
    assert m.value("kubeproxy_sync_proxy_rules_no_local_endpoints_total", policy) == 5
    external = {**policy, "traffic_policy": "external"}
    assert m.value("kubeproxy_sync_proxy_rules_no_local_endpoints_total", external) == 6
    nat = {"ip_family": "IPv4", "table": "nat"}
    assert m.value(IPTABLES_TOTAL, nat) == 40
    assert m.value(IPTABLES_LAST, nat) == 4
    assert m.value(IPTABLES_LAST, {**nat, "table": "filter"}) is None


def test_network_programming_latency_uses_trigger_times() -> None:
    m = new_metrics()
    state = local_policy_state()
    changes = {IPFamily.IPv4: ChangesWithTriggers(trigger_times={"default/web": T0 - 2.5})}
    m.sync_listener(ProxyState(state.node, state.graphs, changes), SyncResult(full=False), 0.1)  # type: ignore[arg-type]
    assert m.value("kubeproxy_network_programming_duration_seconds_sum", V4) == 2.5
    le3 = {**V4, "le": "3.0"}
    assert m.value("kubeproxy_network_programming_duration_seconds_bucket", le3) == 1


def test_pending_and_change_counts() -> None:
    m = new_metrics()
    m.set_pending(2, 3)
    m.add_changes(services=2, endpoints=0)
    assert m.value("kubeproxy_sync_proxy_rules_service_changes_pending") == 2
    assert m.value("kubeproxy_sync_proxy_rules_endpoint_changes_pending") == 3
    assert m.value("kubeproxy_sync_proxy_rules_service_changes_total") == 2
    assert m.value("kubeproxy_sync_proxy_rules_endpoint_changes_total") == 0


@pytest.fixture
def serving() -> Iterator[HTTPServing]:
    yield from serving_loop()


def test_metrics_server_serves_metrics_proxymode_and_healthz(serving: HTTPServing) -> None:
    for metrics, mode in ((new_metrics(), "iptables"), (new_metrics("nftables"), "nftables")):
        server = MetricsServer(serving, metrics, "127.0.0.1", 0)
        conn = http.client.HTTPConnection(*server.address, timeout=5)
        try:
            conn.request("GET", "/metrics")
            resp = conn.getresponse()
            body = resp.read().decode()
            assert resp.status == 200
            assert resp.getheader("Content-Type") == "text/plain; version=0.0.4; charset=utf-8"
            assert "# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram" in body
            for path, want in (("/proxyMode", mode), ("/healthz", "ok")):
                conn.request("GET", path)
                resp = conn.getresponse()
                assert (resp.status, resp.read().decode()) == (200, want)
        finally:
            conn.close()
            server.close()


# ------------------------------------------------------------------------- failure counters

RESTORE_FAILURES = "kubeproxy_sync_proxy_rules_iptables_restore_failures_total"
PARTIAL_FAILURES = "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total"


def failures(m: ProxyMetrics) -> dict[str, tuple[float, float]]:
    """(restore, partial restore) failures per family."""
    return {
        f.value: (
            m.value(RESTORE_FAILURES, {"ip_family": f.value}) or 0.0,
            m.value(PARTIAL_FAILURES, {"ip_family": f.value}) or 0.0,
        )
        for f in DUAL
    }


def test_a_failed_sync_counts_only_the_families_that_failed() -> None:
    cluster = ClusterState(NODE, DUAL)
    # The iptables mode's families, on a backend whose apply fails on demand.
    backend = Declared("iptables", real_backend("iptables").metric_families())
    m = ProxyMetrics(backend, clock=Clock(), process_collectors=False)
    ops = start_operations(
        default_config(), Proxier(cluster, backend), cluster, serve=False, sysctls=False, metrics=m
    )
    try:
        cluster.set_service(service("web", "10.96.0.50", 80, secondary_cluster_ip="fd00::50"))
        assert ops.sync(full=True)
        cluster.set_service(service("web", "10.96.0.50", 81, secondary_cluster_ip="fd00::50"))
        backend.fail = BackendError("IPv4: iptables-restore failed", families=[IPFamily.IPv4])
        assert not ops.sync()  # a partial sync, failed in IPv4 only
        assert failures(m) == {"IPv4": (1, 1), "IPv6": (0, 0)}
        # Its duration is observed too, as upstream does for a failed sync.
        partial = "kubeproxy_sync_partial_proxy_rules_duration_seconds_count"
        assert m.value(partial, {"ip_family": "IPv4"}) == 1
        assert m.value(partial, {"ip_family": "IPv6"}) is None

        backend.fail = BackendError("both failed")  # no families: all of them
        assert not ops.sync()  # the retry is full: no partial failure
        assert failures(m) == {"IPv4": (2, 1), "IPv6": (1, 0)}
    finally:
        ops.stop()
