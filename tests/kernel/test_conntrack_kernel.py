"""Conntrack cleanup after a sync: which entries are stale (pure), and real UDP flows in a lab.

The kernel tests pin a client's UDP 5-tuple (fixed source port) so every datagram rides one
conntrack entry, change the Service, sync, and look at who answers the next datagram: with
the cleanup the flow is load-balanced again, without it the stale entry keeps sending it to
the old place (a removed endpoint, or nowhere).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pytest
from dataplane_kit import shared_dataplane

from kubeplex.core.daemon.conntrack import (
    SCTP,
    UDP,
    ConntrackCleaner,
    Flow,
    FlowFilter,
    FrontendFilter,
    NetlinkConntrack,
    clear_flows,
    stale_flow_filters,
)
from kubeplex.core.dataplane.backend import SyncResult
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.types import IPFamily
from kubeplex.testing.dataplane import (
    DataplaneCluster,
    NodeAgent,
    endpoint,
    endpoint_slice,
    service,
)
from kubeplex.testing.netlab import (
    CLIENT_POD,
    NODE1,
    UDP_PORT,
    WEB_A,
    WEB_B,
    WEB_C,
)

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
        self.closed = False

    def flows(self, proto: int) -> list[Flow]:
        self.listed.append(proto)
        return [f for f in self.flows_ if f.proto == proto]

    def delete(self, flow: Flow) -> bool:
        if flow in self.gone:
            return False
        self.deleted.append(flow)
        return True

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


# --------------------------------------------------------------------------------- the kernel

SOURCE_PORT = 40053
PODS = {WEB_A: EP_A, WEB_B: "10.244.2.2", WEB_C: "10.244.2.3"}


@pytest.fixture(scope="module")
def shared() -> Iterator[DataplaneCluster]:
    yield from shared_dataplane("iptables")


def with_cleaners(dp: DataplaneCluster, enabled: bool) -> dict[str, ConntrackCleaner]:
    """A ConntrackCleaner listening on every node's proxier, as ``kubeplex run`` wires it."""
    cleaners = {}
    for name, agent in dp.agents.items():
        cleaners[name] = ConntrackCleaner(agent.netns, enabled=enabled)
        agent.proxier.listeners.append(cleaners[name])
    return cleaners


def answers(dp: DataplaneCluster, count: int = 3, timeout: float = 1.0) -> list[str]:
    results = dp.lab.udp(CLIENT_POD, VIP, 53, count=count, timeout=timeout, source_port=SOURCE_PORT)
    return [r.body or "" if r.ok else r.outcome for r in results]


def dns(*pods: str) -> list[dict[str, Any]]:
    return [
        service("dns", VIP, 53, target_port=UDP_PORT, protocol="UDP"),
        endpoint_slice("dns", dp_endpoints(pods), port=UDP_PORT, protocol="UDP"),
    ]


def dp_endpoints(pods: Iterable[str]) -> list[dict[str, Any]]:
    nodes = {WEB_A: NODE1, WEB_B: "kind-worker2", WEB_C: "kind-worker2"}
    return [endpoint(PODS[p], nodes[p]) for p in pods]


@pytest.mark.kernel
@pytest.mark.parametrize("cleanup", [True, False], ids=["cleanup", "no-cleanup"])
def test_udp_flow_leaves_a_removed_endpoint_only_with_cleanup(
    dp: DataplaneCluster, cleanup: bool
) -> None:
    cleaners = with_cleaners(dp, cleanup)
    dp.set(*dns(WEB_A, WEB_B, WEB_C))
    dp.sync_or_raise()
    first = answers(dp)
    assert len(set(first)) == 1 and first[0] in PODS, first  # one flow, one endpoint
    chosen = first[0]

    # The entry is there, DNATed to the chosen pod: read through the same netlink path.
    with NetlinkConntrack(IPFamily.IPv4, dp.agent(NODE1).netns) as table:
        mine = [f for f in table.flows(UDP) if f.orig_dst == VIP and f.orig_sport == SOURCE_PORT]
    assert [(f.reply_src, f.reply_sport) for f in mine] == [(PODS[chosen], UDP_PORT)]

    dp.set(endpoint_slice("dns", dp_endpoints(p for p in PODS if p != chosen), port=UDP_PORT,
                          protocol="UDP"))  # fmt: skip
    dp.sync_or_raise()
    after = answers(dp)
    if cleanup:
        assert len(set(after)) == 1 and after[0] in PODS and after[0] != chosen, after
        assert cleaners[NODE1].deleted[IPFamily.IPv4] == 1
    else:
        # The stale entry still sends the flow to the pod that left the Service.
        assert after == [chosen] * 3, after


@pytest.mark.kernel
@pytest.mark.parametrize("cleanup", [True, False], ids=["cleanup", "no-cleanup"])
def test_blackholed_flow_reaches_a_newly_active_service_only_with_cleanup(
    dp: DataplaneCluster, cleanup: bool
) -> None:
    cleaners = with_cleaners(dp, cleanup)
    dp.set(service("other", "10.96.0.99", 80))  # the node has rules (and conntrack) already
    dp.sync_or_raise()
    # No dns Service yet: the node routes the datagram to its default gateway, where it dies,
    # and conntrack remembers the flow un-NATed.
    assert answers(dp, count=1, timeout=0.5) == ["timeout"]
    with NetlinkConntrack(IPFamily.IPv4, dp.agent(NODE1).netns) as table:
        mine = [f for f in table.flows(UDP) if f.orig_dst == VIP and f.orig_sport == SOURCE_PORT]
    assert [f.reply_src for f in mine] == [VIP]  # not DNATed: a blackholed flow
    dp.set(*dns(WEB_B, WEB_C))
    dp.sync_or_raise()
    after = answers(dp, count=2, timeout=0.5)
    if cleanup:
        assert set(after) <= {WEB_B, WEB_C} and len(set(after)) == 1, after
        assert cleaners[NODE1].deleted[IPFamily.IPv4] == 1
    else:
        assert after == ["timeout", "timeout"]


@pytest.mark.kernel
@pytest.mark.parametrize("cleanup", [True, False], ids=["cleanup", "no-cleanup"])
def test_deleted_udp_service_takes_its_flows_along_only_with_cleanup(
    dp: DataplaneCluster, cleanup: bool
) -> None:
    cleaners = with_cleaners(dp, cleanup)
    dp.set(*dns(WEB_A))
    dp.sync_or_raise()
    assert answers(dp, count=1) == [WEB_A]
    dp.delete("Service", "default", "dns")
    dp.sync_or_raise()
    if cleanup:
        assert cleaners[NODE1].deleted[IPFamily.IPv4] == 1
        assert answers(dp, count=1, timeout=0.5) == ["timeout"]
    else:
        # The Service and its rules are gone, yet the entry still delivers to web-a.
        assert answers(dp, count=1) == [WEB_A]


# ------------------------------------------------------------------------- a restart's first sync


def restart(dp: DataplaneCluster) -> dict[str, ConntrackCleaner]:
    """Fresh agents (state, proxier, backend) and cleaners on the same nodes, as a daemon
    restart (or a takeover, or a mode switch) has: the kernel keeps its rules and conntrack."""
    for name in dp.agents:
        dp.agents[name] = NodeAgent(dp.lab, name, dp.mode, config=dp.config, families=dp.families)
    return with_cleaners(dp, True)


def pinned(dp: DataplaneCluster) -> list[tuple[str, int | None]]:
    """Where the client's pinned flow is DNATed to (empty: it has no conntrack entry)."""
    with NetlinkConntrack(IPFamily.IPv4, dp.agent(NODE1).netns) as table:
        mine = [f for f in table.flows(UDP) if f.orig_dst == VIP and f.orig_sport == SOURCE_PORT]
    return [(f.reply_src, f.reply_sport) for f in mine]


def pin_to_web_a(dp: DataplaneCluster) -> None:
    """A flow pinned to web-a of a three-endpoint Service: web-a alone first, then 1 -> 3."""
    with_cleaners(dp, True)
    dp.set(*dns(WEB_A))
    dp.sync_or_raise()
    assert answers(dp, count=1) == [WEB_A]
    dp.set(*dns(WEB_A, WEB_B, WEB_C))
    dp.sync_or_raise()  # more endpoints: nothing is stale, the flow stays
    assert answers(dp) == [WEB_A] * 3
    assert pinned(dp) == [(EP_A, UDP_PORT)]


@pytest.mark.kernel
def test_a_restart_keeps_an_established_udp_flow_on_its_serving_endpoint(
    dp: DataplaneCluster,
) -> None:
    pin_to_web_a(dp)
    cleaners = restart(dp)
    dp.set(*dns(WEB_A, WEB_B, WEB_C))
    dp.sync_or_raise()
    assert dp.agent(NODE1).last_result is not None and dp.agent(NODE1).last_result.full
    assert pinned(dp) == [(EP_A, UDP_PORT)]  # the entry outlived the first sync
    assert cleaners[NODE1].deleted.get(IPFamily.IPv4, 0) == 0
    assert answers(dp) == [WEB_A] * 3


@pytest.mark.kernel
def test_a_restart_moves_a_flow_whose_endpoint_left_while_it_was_down(
    dp: DataplaneCluster,
) -> None:
    pin_to_web_a(dp)
    cleaners = restart(dp)
    dp.set(*dns(WEB_B, WEB_C))
    dp.sync_or_raise()
    assert cleaners[NODE1].deleted[IPFamily.IPv4] == 1
    after = answers(dp)
    assert len(set(after)) == 1 and after[0] in (WEB_B, WEB_C), after


@pytest.mark.kernel
def test_a_restart_clears_the_flows_of_a_service_scaled_to_zero(dp: DataplaneCluster) -> None:
    pin_to_web_a(dp)
    cleaners = restart(dp)
    dp.set(*dns())  # upstream #139628: no serving endpoint left, the entry must go anyway
    dp.sync_or_raise()
    assert cleaners[NODE1].deleted[IPFamily.IPv4] == 1
    assert pinned(dp) == []
    assert WEB_A not in answers(dp, count=1, timeout=0.5)


@pytest.mark.kernel
def test_a_first_sync_clears_a_flow_blackholed_before_its_service_had_rules(
    dp: DataplaneCluster,
) -> None:
    dp.set(service("other", "10.96.0.99", 80))  # the node has rules (and conntrack) already
    dp.sync_or_raise()
    # The dns Service is not programmed yet: the datagram is routed to the node's default
    # gateway and dies, and conntrack keeps the flow un-NATed (a REJECT would leave no entry).
    assert answers(dp, count=1, timeout=0.5) == ["timeout"]
    assert pinned(dp) == [(VIP, 53)]
    cleaners = restart(dp)
    dp.set(service("other", "10.96.0.99", 80), *dns(WEB_A))
    dp.sync_or_raise()
    assert cleaners[NODE1].deleted[IPFamily.IPv4] == 1
    assert answers(dp, count=2) == [WEB_A] * 2
