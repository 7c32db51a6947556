"""The kernel suite's dual-stack cases (backends that declare ``ipv6``; the lab is then
dual-stack): Services with an IPv4 and an IPv6 ClusterIP and one EndpointSlice per family,
driven on the IPv6 side."""

from __future__ import annotations

from typing import Any

from kubeplex.testing.conformance.common import Case, case, check
from kubeplex.testing.conformance.traffic import (
    CHI2_CRIT_2DOF_0001,
    NODEPORT,
    V6,
    WEB,
    WEB_VIP,
    WEB_VIP6,
    WEBS,
    all_ok,
    check_even_split,
    chi2_even,
    hosts,
    ip_of,
    spn,
    synced,
    view,
)
from kubeplex.testing.dataplane import DataplaneCluster, endpoint_slice, service
from kubeplex.testing.netlab import (
    CLIENT_POD,
    EXTERNAL,
    NODE1,
    NODE2,
    UDP_PORT,
    WEB_A,
    WEB_B,
    tally,
)


def web2(
    dc: DataplaneCluster,
    pods: tuple[str, ...] = WEBS,
    *,
    name: str = WEB,
    vip: str = WEB_VIP,
    vip6: str = WEB_VIP6,
    port: int = 80,
    target_port: int = 8080,
    protocol: str = "TCP",
    **svc: Any,
) -> list[dict[str, Any]]:
    """Dual-stack Service ``name`` and one EndpointSlice per family of ``pods``."""
    return [
        service(
            name,
            vip,
            port,
            target_port=target_port,
            protocol=protocol,
            secondary_cluster_ip=vip6,
            **svc,
        ),
        endpoint_slice(
            name, dc.endpoints(*pods), port=target_port, protocol=protocol, name=f"{name}-v4"
        ),
        endpoint_slice(
            name,
            dc.endpoints(*pods, family=V6),
            port=target_port,
            protocol=protocol,
            name=f"{name}-v6",
            address_type="IPv6",
        ),
    ]


def ip6(dc: DataplaneCluster, name: str) -> str:
    return ip_of(dc, name, ipv6=True)


def case_ipv6_clusterip_spread(dc: DataplaneCluster) -> None:
    synced(dc, *web2(dc))
    counts = tally(dc.lab.http(CLIENT_POD, WEB_VIP6, 80, count=150))
    check(sum(counts[w] for w in WEBS) == 150, f"not every request answered: {dict(counts)}")
    chi2 = chi2_even(counts, WEBS, 150)
    check(chi2 < CHI2_CRIT_2DOF_0001, f"not spread evenly (chi2 {chi2:.1f}): {dict(counts)}")
    programmed = view(dc.agent(NODE1), spn(WEB), V6)
    if programmed is not None:
        check_even_split(programmed, 3)
        # "[ip]:port" as upstream joins them; a bare "ip:port" says the same.
        wanted = sorted(f"{ip6(dc, w)}:8080" for w in WEBS)
        got = sorted(e.target.replace("[", "").replace("]", "") for e in programmed.endpoints)
        check(got == wanted, f"inspect() IPv6 endpoints {got}, not {wanted}")


def case_dual_stack_no_snat(dc: DataplaneCluster) -> None:
    synced(dc, *web2(dc))
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


def case_ipv6_nodeport(dc: DataplaneCluster) -> None:
    synced(dc, *web2(dc, type="NodePort", node_port=NODEPORT))
    node1, node2 = ip6(dc, NODE1), ip6(dc, NODE2)
    from_external = dc.lab.http(EXTERNAL, node1, NODEPORT, count=12)
    check(all_ok(from_external), f"IPv6 NodePort from the external host: {tally(from_external)}")
    check({"web-b", "web-c"} & set(tally(from_external)), "never forwarded to the other node")
    check(all_ok(dc.lab.http(EXTERNAL, node2, NODEPORT, count=6)), "via kind-worker2")
    # Cluster policy masquerades: the pods never see the external client's address.
    seen = dc.lab.http(EXTERNAL, node1, NODEPORT, "/clientip", count=6)
    check(all_ok(seen), f"/clientip through the IPv6 NodePort: {seen}")
    check(ip6(dc, EXTERNAL) not in hosts(seen), f"not masqueraded: {hosts(seen)}")


def case_ipv6_nodeport_from_nodes_and_pods(dc: DataplaneCluster) -> None:
    synced(dc, *web2(dc, type="NodePort", node_port=NODEPORT))
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


def case_ipv6_nodeport_local(dc: DataplaneCluster) -> None:
    # The only endpoint is web-a on kind-worker: kind-worker2 has no local endpoint.
    synced(
        dc,
        *web2(dc, (WEB_A,), type="NodePort", node_port=NODEPORT, external_traffic_policy="Local"),
    )
    node1, node2 = ip6(dc, NODE1), ip6(dc, NODE2)
    seen = dc.lab.http(EXTERNAL, node1, NODEPORT, "/clientip", count=3)
    check(all_ok(seen) and hosts(seen) == {ip6(dc, EXTERNAL)}, f"client IP not kept: {seen}")
    [dropped] = dc.lab.http(EXTERNAL, node2, NODEPORT, timeout=1.0)
    check(dropped.outcome == "timeout", f"no local endpoint: dropped, not {dropped}")
    after = tally(dc.lab.http(EXTERNAL, node1, NODEPORT, count=2))
    check(after == {WEB_A: 2}, f"the node with the endpoint, after the drop: {dict(after)}")


def case_ipv6_hairpin(dc: DataplaneCluster) -> None:
    synced(dc, *web2(dc, (WEB_A,), name="self", vip="10.96.0.20", vip6="fd00:96::20"))
    counts = tally(dc.lab.http(WEB_A, "fd00:96::20", 80, count=3))
    check(counts == {WEB_A: 3}, f"a pod through its own IPv6 Service: {dict(counts)}")
    seen = dc.lab.http(WEB_A, "fd00:96::20", 80, "/clientip", count=3)
    # Masqueraded: with its own address as source, the reply would never be un-NATed.
    check(all_ok(seen), f"IPv6 hairpin /clientip failed: {seen}")
    check(ip6(dc, WEB_A) not in hosts(seen), "IPv6 hairpin traffic was not masqueraded")


def case_ipv6_udp(dc: DataplaneCluster) -> None:
    synced(
        dc,
        *web2(
            dc,
            name="dns",
            vip="10.96.0.10",
            vip6="fd00:96::10",
            port=53,
            target_port=UDP_PORT,
            protocol="UDP",
        ),
    )
    counts = tally(dc.lab.udp(CLIENT_POD, "fd00:96::10", 53, count=9))
    check(set(counts) <= set(WEBS) and sum(counts.values()) == 9, f"IPv6 UDP: {dict(counts)}")
    seen = dc.lab.udp(CLIENT_POD, "fd00:96::10", 53, payload="clientip", count=3)
    check(all_ok(seen) and hosts(seen) == {ip6(dc, CLIENT_POD)}, f"IPv6 UDP client IP: {seen}")


K, NEEDS = "kernel", "ipv6"
DUAL_STACK_CASES: tuple[Case, ...] = (
    case(
        K,
        "ipv6-clusterip-spread",
        "IPv6 ClusterIP spreads evenly",
        case_ipv6_clusterip_spread,
        NEEDS,
    ),
    case(K, "dual-stack-no-snat", "both families, client IP kept", case_dual_stack_no_snat, NEEDS),
    case(
        K,
        "ipv6-no-endpoints-refused",
        "IPv6 without endpoints: refused (TCP, UDP)",
        case_ipv6_no_endpoints_refused,
        NEEDS,
    ),
    case(K, "ipv6-nodeport", "IPv6 NodePort from outside", case_ipv6_nodeport, NEEDS),
    case(
        K,
        "ipv6-nodeport-nodes-pods",
        "IPv6 NodePort from nodes and pods, not on ::1",
        case_ipv6_nodeport_from_nodes_and_pods,
        NEEDS,
    ),
    case(
        K,
        "ipv6-nodeport-local",
        "IPv6 Local policy keeps client IP",
        case_ipv6_nodeport_local,
        NEEDS,
    ),
    case(K, "ipv6-hairpin", "IPv6 hairpin, masqueraded", case_ipv6_hairpin, NEEDS),
    case(K, "ipv6-udp", "IPv6 UDP, client IP kept", case_ipv6_udp, NEEDS),
)
