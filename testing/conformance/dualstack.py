"""The kernel suite's dual-stack cases (backends that declare ``ipv6``; the lab is then
dual-stack): Services with an IPv4 and an IPv6 ClusterIP and one EndpointSlice per family,
driven on the IPv6 side. The cases that only differ from IPv4 ones in their addresses are the
IPv6 halves of families.py's."""

from __future__ import annotations

from kubeplex.testing.conformance.common import Case, case, check
from kubeplex.testing.conformance.families import (
    CLUSTERIP_SPREAD,
    HAIRPIN,
    NODEPORT_CASES,
    NODEPORT_LOCAL,
    UDP,
)
from kubeplex.testing.conformance.traffic import (
    NODEPORT,
    V6,
    WEB_VIP,
    WEB_VIP6,
    WEBS,
    all_ok,
    hosts,
    ip_of,
    synced,
    web_in,
)
from kubeplex.testing.dataplane import DataplaneCluster, endpoint_slice, service
from kubeplex.testing.netlab import (
    CLIENT_POD,
    NODE1,
    NODE2,
    UDP_PORT,
    WEB_A,
    WEB_B,
    tally,
)


def ip6(dc: DataplaneCluster, name: str) -> str:
    return ip_of(dc, name, ipv6=True)


def case_dual_stack_no_snat(dc: DataplaneCluster) -> None:
    synced(dc, *web_in(dc, V6))
    seen6 = dc.lab.http(CLIENT_POD, WEB_VIP6, 80, "/clientip", count=6)
    check(all_ok(seen6) and hosts(seen6) == {ip6(dc, CLIENT_POD)}, f"IPv6 client IP: {seen6}")
    seen4 = dc.lab.http(CLIENT_POD, WEB_VIP, 80, "/clientip", count=6)
    check(all_ok(seen4) and hosts(seen4) == {ip_of(dc, CLIENT_POD)}, f"IPv4 client IP: {seen4}")
    # The IPv6 ClusterIP reaches the IPv6 endpoints from the other node too.
    counts = tally(dc.lab.http(WEB_B, WEB_VIP6, 80, count=30))
    check(
        set(counts) <= set(WEBS) and sum(counts.values()) == 30,
        f"from kind-worker2: {dict(counts)}",
    )


def case_ipv6_no_endpoints_refused(dc: DataplaneCluster) -> None:
    synced(
        dc,
        service("empty", "10.96.0.30", 80, target_port=8080, secondary_cluster_ip="fd00:96::30"),
        # Ready in IPv4, but its only IPv6 endpoint is neither ready nor serving.
        service("notready", "10.96.0.31", 80, target_port=8080, secondary_cluster_ip="fd00:96::31"),
        endpoint_slice("notready", dc.endpoints(WEB_A), port=8080, name="notready-v4"),
        endpoint_slice(
            "notready",
            dc.endpoints(WEB_A, family=V6, ready=False),
            port=8080,
            name="notready-v6",
            address_type="IPv6",
        ),
        service(
            "empty-udp",
            "10.96.0.32",
            53,
            target_port=UDP_PORT,
            protocol="UDP",
            secondary_cluster_ip="fd00:96::32",
        ),
    )
    for vip in ("fd00:96::30", "fd00:96::31"):
        [r] = dc.lab.http(CLIENT_POD, vip, 80, timeout=3.0)
        # Rejected, not dropped: refused well before the 3 s timeout. Not within 500 ms as in
        # IPv4: the ICMPv6 error for the first SYN arrives while connect() still holds the
        # socket (it is generated in the same softirq run on this one host), TCPv6 keeps it as
        # a soft error only (TcpExtLockDroppedIcmps), and the SYN retransmit 1 s later is what
        # fails. A kernel property of same-host rejects, not of the rules.
        check(r.outcome == "refused" and r.ms < 1500, f"{vip}: expected a refusal, got {r}")
    # UDP has no such lock: the port-unreachable is reported at once.
    [r] = dc.lab.udp(CLIENT_POD, "fd00:96::32", 53, timeout=3.0)
    check(r.outcome == "refused" and r.ms < 500, f"UDP without endpoints: {r}")
    # The families are independent: the IPv4 side of "notready" has its endpoint.
    v4 = tally(dc.lab.http(CLIENT_POD, "10.96.0.31", 80, count=2))
    check(v4 == {WEB_A: 2}, f"the IPv4 side of notready: {dict(v4)}")


def case_ipv6_nodeport_from_nodes_and_pods(dc: DataplaneCluster) -> None:
    synced(dc, *web_in(dc, V6, type="NodePort", node_port=NODEPORT))
    node1, node2 = ip6(dc, NODE1), ip6(dc, NODE2)
    for src, dst in ((NODE1, node1), (NODE2, node1), (CLIENT_POD, node2)):
        results = dc.lab.http(src, dst, NODEPORT, count=6)
        check(
            all_ok(results) and set(tally(results)) <= set(WEBS),
            f"from {src} to [{dst}]:{NODEPORT}: {results}",
        )
    # Like upstream, NodePorts are never served on IPv6 loopback: nothing listens there, so
    # the node itself refuses.
    [r] = dc.lab.http(NODE1, "::1", NODEPORT, timeout=1.0)
    check(r.outcome == "refused", f"[::1]:{NODEPORT}: {r}")


K, NEEDS = "kernel", "ipv6"
DUAL_STACK_CASES: tuple[Case, ...] = (
    CLUSTERIP_SPREAD[V6],
    case(K, "dual-stack-no-snat", "both families, client IP kept", case_dual_stack_no_snat, NEEDS),
    case(
        K,
        "ipv6-no-endpoints-refused",
        "IPv6 without endpoints: refused (TCP, UDP)",
        case_ipv6_no_endpoints_refused,
        NEEDS,
    ),
    NODEPORT_CASES[V6],
    case(
        K,
        "ipv6-nodeport-nodes-pods",
        "IPv6 NodePort from nodes and pods, not on ::1",
        case_ipv6_nodeport_from_nodes_and_pods,
        NEEDS,
    ),
    NODEPORT_LOCAL[V6],
    HAIRPIN[V6],
    UDP[V6],
)
