"""Conntrack cleanup after a sync, without the kernel: which entries are stale, and which flows
a table's clearing deletes (tests/kernel/test_conntrack_kernel.py sends real UDP flows)."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import Any

import pytest
from kits.fake_backend_kit import FakeBackend

from kubeplex.core.config.kubeproxy import default_config
from kubeplex.core.daemon.conntrack import (
    SCTP,
    UDP,
    ConntrackCleaner,
    FlowFilter,
    FrontendFilter,
    LiveFlows,
    clear_flows,
    stale_flow_filters,
)
from kubeplex.core.daemon.ctnetlink import Flow, NetlinkConntrack
from kubeplex.core.daemon.operations import start_operations
from kubeplex.core.daemon.proxier import Proxier
from kubeplex.core.dataplane.backend import SyncResult
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.types import IPFamily
from kubeplex.testing.dataplane import endpoint, endpoint_slice, service

NODE = "node-a"
VIP = "10.96.0.10"
EP_A, EP_B = "10.244.1.2", "10.244.2.2"


# ----------------------------------------------------------------------------- stale filters


def udp_service(**extra: Any) -> dict[str, Any]:
    return service(
        "dns", VIP, 53, target_port=8081, protocol="UDP", type="LoadBalancer", node_port=30053,
        external_ips=["192.0.2.1"], load_balancer_ips=["192.0.2.2"], **extra,
    )  # fmt: skip


def dns_slice(*ips: str, protocol: str = "UDP") -> dict[str, Any]:
    return endpoint_slice("dns", [endpoint(ip, NODE) for ip in ips], port=8081, protocol=protocol)


def test_a_newly_active_service_clears_only_flows_not_dnated_to_a_serving_endpoint() -> None:
    state = ClusterState(NODE, (IPFamily.IPv4,))
    state.set_service(udp_service())
    state.set_endpoint_slice(dns_slice(EP_A, EP_B))
    why = "default/dns has endpoints again"
    serving = frozenset({(EP_A, 8081), (EP_B, 8081)})
    plan = stale_flow_filters(state.checkout())[IPFamily.IPv4]
    assert not plan.full
    assert plan.filters == (  # 0 -> 2 endpoints: flows that went nowhere are stale
        FrontendFilter(UDP, VIP, 53, serving, why),
        FrontendFilter(UDP, "192.0.2.1", 53, serving, why),
        FrontendFilter(UDP, "192.0.2.2", 53, serving, why),
        FrontendFilter(UDP, None, 30053, serving, why),
    )
    assert plan.frontends == {(UDP, ip, 53) for ip in (VIP, "192.0.2.1", "192.0.2.2")}


def test_a_stale_endpoint_clears_flows_to_every_service_address_dnated_to_it() -> None:
    state = ClusterState(NODE, (IPFamily.IPv4,))
    state.set_service(udp_service())
    state.set_endpoint_slice(dns_slice(EP_A, EP_B))
    state.checkout()
    state.set_endpoint_slice(dns_slice(EP_A))
    why = f"default/dns lost endpoint {EP_B}:8081"
    assert stale_flow_filters(state.checkout())[IPFamily.IPv4].filters == (
        FlowFilter(UDP, VIP, None, EP_B, 8081, why),
        FlowFilter(UDP, "192.0.2.1", None, EP_B, 8081, why),
        FlowFilter(UDP, "192.0.2.2", None, EP_B, 8081, why),
        FlowFilter(UDP, None, 30053, EP_B, 8081, why),
    )
    state.set_endpoint_slice(dns_slice(EP_A, EP_B, "10.244.2.3"))  # more: nothing is stale
    assert stale_flow_filters(state.checkout()) == {}
    state.set_endpoint_slice(dns_slice(EP_A, EP_B, "10.244.2.3"))  # no change either
    assert stale_flow_filters(state.checkout()) == {}


def test_a_full_sync_reconciles_every_connectionless_service() -> None:
    state = ClusterState(NODE, (IPFamily.IPv4,))
    state.set_service(udp_service())
    state.set_endpoint_slice(dns_slice(EP_A))
    state.set_service(service("idle", "10.96.0.11", 30053, protocol="UDP"))  # no endpoints
    state.set_service(service("web", "10.96.0.12", 80))
    state.set_endpoint_slice(endpoint_slice("web", [endpoint(EP_A, NODE)]))
    plan = stale_flow_filters(state.checkout(full=True))[IPFamily.IPv4]
    assert plan.full
    assert plan.filters == (
        FrontendFilter(UDP, VIP, 53, frozenset({(EP_A, 8081)}), "default/dns reconciled"),
        FrontendFilter(UDP, "192.0.2.1", 53, frozenset({(EP_A, 8081)}), "default/dns reconciled"),
        FrontendFilter(UDP, "192.0.2.2", 53, frozenset({(EP_A, 8081)}), "default/dns reconciled"),
        FrontendFilter(UDP, None, 30053, frozenset({(EP_A, 8081)}), "default/dns reconciled"),
        FrontendFilter(UDP, "10.96.0.11", 30053, frozenset(), "default/idle reconciled"),
    )  # and nothing for TCP
    # A partial sync asks for it too when the cleaner has not reconciled the family yet.
    state.set_endpoint_slice(dns_slice(EP_A, EP_B))
    assert stale_flow_filters(state.checkout(), {IPFamily.IPv4})[IPFamily.IPv4].full


def test_a_deleted_service_clears_its_cluster_ip() -> None:
    state = ClusterState(NODE, (IPFamily.IPv4,))
    state.set_service(udp_service())
    state.set_endpoint_slice(dns_slice(EP_A))
    state.checkout()
    state.delete_service("default", "dns")
    why = f"service IP {VIP} deleted"
    # The endpoint is stale too, but its Service is gone: the cluster IP covers it.
    assert stale_flow_filters(state.checkout())[IPFamily.IPv4].filters == (
        FlowFilter(UDP, VIP, reason=why),
        FlowFilter(SCTP, VIP, reason=why),
    )


def test_flows_of_a_stale_ip_stay_on_the_ports_a_live_service_still_serves() -> None:
    state = ClusterState(NODE, (IPFamily.IPv4,))
    svc = service("sig", VIP, 53, protocol="UDP")
    svc["spec"]["ports"] = [
        {"name": "a", "port": 53, "protocol": "UDP"},
        {"name": "b", "port": 5353, "protocol": "UDP"},
        {"name": "c", "port": 2905, "protocol": "SCTP"},
        {"name": "d", "port": 2906, "protocol": "SCTP"},
    ]
    state.set_service(svc)
    state.checkout()
    svc["spec"]["ports"] = [svc["spec"]["ports"][0], svc["spec"]["ports"][2]]
    state.set_service(svc)
    plan = stale_flow_filters(state.checkout())[IPFamily.IPv4]
    live_udp, gone_udp = flow(VIP, "10.244.1.9", dport=53), flow(VIP, "10.244.1.9", dport=5353)
    live_sctp = flow(VIP, "10.244.1.9", dport=2905, proto=SCTP)
    gone_sctp = flow(VIP, "10.244.1.9", dport=2906, proto=SCTP)
    table = FakeTable([live_udp, gone_udp, live_sctp, gone_sctp])
    assert clear_flows(table, plan.filters, plan.frontends) == 2
    assert table.deleted == [gone_udp, gone_sctp]


def test_tcp_changes_clear_nothing() -> None:
    state = ClusterState(NODE, (IPFamily.IPv4,))
    state.set_service(service("web", VIP, 80))
    state.set_endpoint_slice(endpoint_slice("web", [endpoint(EP_A, NODE)]))
    state.checkout()
    state.set_endpoint_slice(endpoint_slice("web", []))
    state.delete_service("default", "web")
    assert stale_flow_filters(state.checkout()) == {}


# ---------------------------------------------------------------------------- the clearing


def flow(dst: str, reply_src: str, *, proto: int = UDP, dport: int = 53, rport: int = 8081) -> Flow:
    return Flow(proto, "10.244.1.3", dst, 40000, dport, reply_src, "10.244.1.3", rport, 40000)


class FakeTable:
    def __init__(self, flows: Iterable[Flow], gone: Iterable[Flow] = ()) -> None:
        self.flows_ = list(flows)
        self.gone = set(gone)
        self.deleted: list[Flow] = []
        self.listed: list[int] = []
        self.batches: list[int] = []
        self.closed = False

    def flows(self, proto: int) -> list[Flow]:
        self.listed.append(proto)
        return [f for f in self.flows_ if f.proto == proto]

    def delete(self, flows: Sequence[Flow]) -> int:
        self.batches.append(len(flows))
        done = [f for f in flows if f not in self.gone]
        self.deleted.extend(done)
        return len(done)

    def close(self) -> None:
        self.closed = True


def test_clear_flows_deletes_only_matching_entries_and_counts_real_deletions() -> None:
    stale = flow(VIP, EP_B)
    expired = flow(VIP, EP_B, dport=54)
    table = FakeTable(
        [
            stale,
            expired,
            flow(VIP, EP_A),  # a live endpoint
            flow(VIP, EP_B, rport=9000),  # the same pod on its new port
            flow(VIP, EP_B, proto=SCTP),  # another protocol
            flow("10.96.0.11", EP_B),  # another Service
        ],
        gone=[expired],
    )
    assert clear_flows(table, [FlowFilter(UDP, VIP, None, EP_B, 8081)]) == 1
    assert table.deleted == [stale]


def nodeport_flow(reply_src: str, *, rport: int = 8081) -> Flow:
    return Flow(UDP, "172.18.0.9", "172.18.0.5", 40000, 30053, reply_src, "172.18.0.9", rport,
                40000)  # fmt: skip


def test_full_reconciliation_keeps_flows_dnated_to_serving_endpoints_only() -> None:
    state = ClusterState(NODE, (IPFamily.IPv4,))
    state.set_service(udp_service())
    state.set_endpoint_slice(dns_slice(EP_A))
    # A ClusterIP port equal to dns' NodePort: its flows are its own, not NodePort flows.
    state.set_service(service("metrics", "10.96.0.11", 30053, protocol="UDP"))
    state.set_endpoint_slice(endpoint_slice("metrics", [endpoint("10.244.2.7", NODE)],
                                            port=30053, protocol="UDP"))  # fmt: skip
    state.set_service(service("idle", "10.96.0.12", 53, protocol="UDP"))  # no endpoints
    plan = stale_flow_filters(state.checkout(full=True))[IPFamily.IPv4]
    keep = [
        flow(VIP, EP_A),  # established to the serving endpoint
        flow("192.0.2.1", EP_A),
        nodeport_flow(EP_A),
        flow("10.96.0.11", "10.244.2.7", dport=30053, rport=30053),
        flow("10.96.0.13", EP_B),  # no Service of ours
        flow(VIP, EP_B, dport=54),  # another port of the IP
    ]
    stale = [
        flow(VIP, EP_B),  # an endpoint that left while kubeplex was down
        flow(VIP, EP_A, rport=9000),  # the endpoint's old port
        flow(VIP, VIP, rport=53),  # never DNATed: blackholed
        flow("192.0.2.2", VIP, rport=53),
        nodeport_flow(EP_B),
        nodeport_flow("172.18.0.5", rport=30053),
        flow("10.96.0.12", EP_B),  # a Service without serving endpoints (upstream #139628)
    ]
    table = FakeTable([*keep, *stale, flow(VIP, EP_B, proto=SCTP)])
    assert clear_flows(table, plan.filters, plan.frontends) == len(stale)
    assert table.deleted == stale
    assert table.listed == [UDP]  # one listing: no SCTP Service, so SCTP is not looked at


def test_a_newly_active_service_keeps_flows_that_reach_a_serving_endpoint() -> None:
    state = ClusterState(NODE, (IPFamily.IPv4,))
    state.set_service(udp_service())
    state.set_endpoint_slice(endpoint_slice("dns", [endpoint(EP_A, NODE, ready=False)],
                                            port=8081, protocol="UDP"))  # fmt: skip
    state.checkout(full=True)
    state.set_endpoint_slice(dns_slice(EP_A))  # ready again: 0 -> 1 serving
    plan = stale_flow_filters(state.checkout())[IPFamily.IPv4]
    assert not plan.full
    table = FakeTable([flow(VIP, EP_A), flow(VIP, VIP, rport=53), nodeport_flow(EP_A)])
    assert clear_flows(table, plan.filters, plan.frontends) == 1
    assert table.deleted == [flow(VIP, VIP, rport=53)]


def test_cleaner_reconciles_first_then_lists_only_when_something_can_be_stale() -> None:
    state = ClusterState(NODE, (IPFamily.IPv4,))
    state.set_service(udp_service())
    state.set_service(service("web", "10.96.0.12", 80))
    state.set_endpoint_slice(dns_slice(EP_A))
    tables: list[FakeTable] = []
    fail = [True]

    def factory(family: IPFamily) -> FakeTable:
        if fail[0]:
            raise PermissionError("netlink: operation not permitted")
        tables.append(FakeTable([flow(VIP, EP_A), flow(VIP, EP_B)]))
        return tables[-1]

    cleaner = ConntrackCleaner(table_factory=factory)
    cleaner(state.checkout(), SyncResult(full=False), 0.0)  # a partial first call: full anyway
    assert cleaner.errors == 1 and not tables
    fail[0] = False
    state.set_endpoint_slice(endpoint_slice("web", [endpoint(EP_B, NODE)]))
    cleaner(state.checkout(), SyncResult(full=False), 0.0)  # after a failure: full again
    assert [t.deleted for t in tables] == [[flow(VIP, EP_B)]]
    for change in (
        lambda: state.set_endpoint_slice(dns_slice(EP_A, EP_B)),  # more endpoints
        lambda: state.set_endpoint_slice(endpoint_slice("web", [])),  # TCP
    ):
        change()
        cleaner(state.checkout(), SyncResult(full=False), 0.0)
    assert len(tables) == 1  # nothing could be stale: the table was not even opened
    state.set_endpoint_slice(dns_slice(EP_A))
    cleaner(state.checkout(), SyncResult(full=False), 0.0)
    assert len(tables) == 2 and tables[1].listed == [UDP]
    cleaner(state.checkout(full=True), SyncResult(full=True), 0.0)  # a resync, nothing new
    assert len(tables) == 2


def test_a_full_sync_after_lost_change_sets_reconciles_and_clears_gone_service_ips() -> None:
    state = ClusterState(NODE, (IPFamily.IPv4,))
    state.set_service(udp_service())
    state.set_endpoint_slice(dns_slice(EP_A))
    state.set_service(service("old", "10.96.0.11", 53, protocol="UDP"))
    state.set_endpoint_slice(endpoint_slice("old", [endpoint(EP_B, NODE)], port=8081,
                                            protocol="UDP"))  # fmt: skip
    tables: list[FakeTable] = []

    def factory(family: IPFamily) -> FakeTable:
        tables.append(FakeTable([flow(VIP, EP_A), flow("10.96.0.11", EP_B), nodeport_flow(EP_A)]))
        return tables[-1]

    cleaner = ConntrackCleaner(table_factory=factory)
    cleaner(state.checkout(full=True), SyncResult(full=True), 0.0)
    assert tables[0].deleted == []
    # Two syncs fail: the listener never hears of their change sets.
    state.set_endpoint_slice(dns_slice(EP_B))
    state.checkout()
    state.delete_service("default", "old")
    state.checkout()
    cleaner(state.checkout(full=True), SyncResult(full=True), 0.0)  # the retry is a full one
    assert tables[1].deleted == [flow(VIP, EP_A), flow("10.96.0.11", EP_B), nodeport_flow(EP_A)]


def test_cleaner_reports_per_family_and_survives_a_broken_table() -> None:
    state = ClusterState(NODE, (IPFamily.IPv4,))
    state.set_service(udp_service())
    state.set_endpoint_slice(dns_slice(EP_A, EP_B))
    state.checkout()
    state.set_endpoint_slice(dns_slice(EP_A))
    proxy_state = state.checkout()
    seen: list[tuple[IPFamily, int]] = []
    tables: list[FakeTable] = []

    def factory(family: IPFamily) -> FakeTable:
        tables.append(FakeTable([flow(VIP, EP_B), flow("10.96.0.11", EP_B)]))
        return tables[-1]

    cleaner = ConntrackCleaner(
        table_factory=factory, on_cleaned=lambda f, s, n: seen.append((f, n))
    )
    cleaner(proxy_state, SyncResult(full=False), 0.0)
    assert seen == [(IPFamily.IPv4, 1)] and tables[0].closed
    assert cleaner.deleted == {IPFamily.IPv4: 1}

    def broken(family: IPFamily) -> FakeTable:
        raise PermissionError("netlink: operation not permitted")

    cleaner = ConntrackCleaner(table_factory=broken, on_cleaned=lambda f, s, n: seen.append((f, n)))
    cleaner(proxy_state, SyncResult(full=False), 0.0)  # logged, not raised
    assert cleaner.errors == 1 and seen[-1] == (IPFamily.IPv4, 0)

    cleaner = ConntrackCleaner(table_factory=factory, enabled=False)
    cleaner(proxy_state, SyncResult(full=False), 0.0)
    assert len(tables) == 1


def test_netlink_table_refuses_a_missing_namespace() -> None:
    with pytest.raises(FileNotFoundError, match="no network namespace"):
        NetlinkConntrack(IPFamily.IPv4, "kpx-no-such-ns")


def test_clear_flows_deletes_what_a_listing_matches_in_one_go() -> None:
    stale = [flow(VIP, EP_B, rport=8081 + i) for i in range(5)]
    table = FakeTable([flow(VIP, EP_A), *stale, flow(VIP, EP_B, proto=SCTP)])
    filters = [FrontendFilter(UDP, VIP, 53, frozenset({(EP_A, 8081)}))]
    assert clear_flows(table, filters) == 5
    assert table.batches == [5]  # one request for the lot, not one per entry


# ------------------------------------------------------------------ cleaning off the sync loop


class Conntrack:
    """One table every opened ``FakeTable`` reads and deletes from (the kernel's, in short);
    a listing can be held until the test lets it go."""

    def __init__(self, flows: Iterable[Flow]) -> None:
        self.flows = list(flows)
        self.listing = threading.Event()
        self.go = threading.Event()
        self.held_too_long = False
        self.opened = 0

    def open(self, family: IPFamily) -> SharedTable:
        self.opened += 1
        return SharedTable(self)


class SharedTable(FakeTable):
    def __init__(self, kernel: Conntrack) -> None:
        super().__init__(kernel.flows)
        self.kernel = kernel

    def flows(self, proto: int) -> list[Flow]:
        self.kernel.listing.set()
        if not self.kernel.go.wait(10):
            self.kernel.held_too_long = True
        return super().flows(proto)

    def delete(self, flows: Sequence[Flow]) -> int:
        done = super().delete(flows)
        self.kernel.flows = [f for f in self.kernel.flows if f not in flows]
        return done


def test_a_background_cleaner_never_holds_a_sync_and_folds_waiting_plans_into_one() -> None:
    state = ClusterState(NODE, (IPFamily.IPv4,))
    state.set_service(udp_service())
    state.set_endpoint_slice(dns_slice(EP_A, EP_B))
    ep_c = "10.244.2.9"
    to_a, to_b, to_c, blackholed = flow(VIP, EP_A), flow(VIP, EP_B), flow(VIP, ep_c), flow(VIP, VIP)
    kernel = Conntrack([to_a, to_b, to_c, blackholed])
    cleaner = ConntrackCleaner(table_factory=kernel.open, background=True)
    try:
        cleaner(state.checkout(full=True), SyncResult(full=True), 0.0)
        assert kernel.listing.wait(5)  # the first (full) cleanup is listing the table, held
        state.set_endpoint_slice(dns_slice(EP_A))  # B leaves: its flows are stale ...
        cleaner(state.checkout(), SyncResult(full=False), 0.0)
        state.set_endpoint_slice(dns_slice(EP_B, ep_c))  # ... but it is back, A and C leave
        cleaner(state.checkout(), SyncResult(full=False), 0.0)
        # Both syncs returned while the first cleanup was held; the second plan waits, and
        # the third was folded into it.
        assert kernel.opened == 1 and cleaner._worker is not None
        assert cleaner._worker.merged == 1
        kernel.go.set()
        assert cleaner.wait_idle(5)
    finally:
        kernel.go.set()
        cleaner.close()
    assert not kernel.held_too_long
    assert kernel.opened == 2  # the held cleanup, and one for the two syncs behind it
    # The blackholed flow went at once, A's after A left. The first plan named C's flow
    # stale, the second B's, but both serve when the cleanups run: their flows stay.
    assert kernel.flows == [to_b, to_c]
    assert cleaner.deleted == {IPFamily.IPv4: 2} and cleaner.errors == 0


def test_a_failed_background_cleanup_makes_the_next_one_a_full_reconciliation() -> None:
    state = ClusterState(NODE, (IPFamily.IPv4,))
    state.set_service(udp_service())
    state.set_endpoint_slice(dns_slice(EP_A))
    fail = [True]
    tables: list[FakeTable] = []

    def factory(family: IPFamily) -> FakeTable:
        if fail[0]:
            raise PermissionError("netlink: operation not permitted")
        tables.append(FakeTable([flow(VIP, EP_B)]))
        return tables[-1]

    cleaner = ConntrackCleaner(table_factory=factory, background=True)
    try:
        cleaner(state.checkout(full=True), SyncResult(full=True), 0.0)
        assert cleaner.wait_idle(5) and cleaner.errors == 1
        fail[0] = False
        state.set_service(service("web", "10.96.0.12", 80))  # nothing stale by itself
        cleaner(state.checkout(), SyncResult(full=False), 0.0)
        assert cleaner.wait_idle(5)
    finally:
        cleaner.close()
    assert [t.deleted for t in tables] == [[flow(VIP, EP_B)]]


def test_live_flows_judge_a_service_ip_by_its_own_frontend_not_a_node_port() -> None:
    state = ClusterState(NODE, (IPFamily.IPv4,))
    state.set_service(udp_service())  # NodePort 30053
    state.set_endpoint_slice(dns_slice(EP_A))
    state.set_service(service("metrics", "10.96.0.11", 30053, protocol="UDP"))  # no endpoints
    live = LiveFlows(state.checkout(full=True).graphs[IPFamily.IPv4])
    assert live.serves(flow(VIP, EP_A)) and live.serves(flow("192.0.2.1", EP_A))
    assert live.serves(nodeport_flow(EP_A))
    assert not live.serves(flow(VIP, EP_B)) and not live.serves(flow(VIP, EP_A, rport=9000))
    assert not live.serves(flow("10.96.0.11", EP_A, dport=30053))  # not dns' NodePort
    assert not live.serves(flow(VIP, EP_A, proto=SCTP))


@pytest.mark.parametrize("serve", [True, False], ids=["daemon", "once"])
def test_the_daemon_cleans_conntrack_off_the_sync_loop_unless_it_runs_once(serve: bool) -> None:
    cluster = ClusterState(NODE, (IPFamily.IPv4,))
    ops = start_operations(
        default_config(),
        Proxier(cluster, FakeBackend()),
        cluster,
        serve=serve,
        sysctls=False,
        healthz_address="127.0.0.1:0",
        metrics_address="127.0.0.1:0",
        service_health_addresses=("127.0.0.1",),
        poll_interval=3600,
    )
    try:
        assert ops.conntrack.enabled and ops.conntrack.background is serve
    finally:
        ops.stop()
