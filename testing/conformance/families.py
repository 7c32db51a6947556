"""The kernel cases that run once per IP family: the same traffic and the same checks, to the
family's addresses. The IPv4 case gets a single-stack Service; the IPv6 one (named
``ipv6-<name>``, for backends that declare ``ipv6``) a dual-stack Service driven on its IPv6
side, in the dual-stack lab."""

from __future__ import annotations

import functools
from typing import Protocol

from kubeplex.core.model.types import IPFamily
from kubeplex.testing.conformance.common import Case, case, check
from kubeplex.testing.conformance.traffic import (
    CHI2_CRIT_2DOF_0001,
    NODEPORT,
    V4,
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
    web_in,
)
from kubeplex.testing.dataplane import DataplaneCluster
from kubeplex.testing.netlab import (
    CLIENT_POD,
    EXTERNAL,
    NODE1,
    NODE2,
    UDP_PORT,
    WEB_A,
    WEB_B,
    WEB_C,
    tally,
)

K = "kernel"
#: A second Service's ClusterIPs (hairpin) and the UDP Service's.
SELF_VIPS = {V4: "10.96.0.20", V6: "fd00:96::20"}
DNS_VIPS = {V4: "10.96.0.10", V6: "fd00:96::10"}


def address(dc: DataplaneCluster, name: str, family: IPFamily) -> str:
    """A pod's, node's or host's address in ``family``."""
    return ip_of(dc, name, ipv6=family is V6)


def case_clusterip_spread(dc: DataplaneCluster, family: IPFamily) -> None:
    synced(dc, *web_in(dc, family))
    vip = WEB_VIP6 if family is V6 else WEB_VIP
    counts = tally(dc.lab.http(CLIENT_POD, vip, 80, count=300))
    check(sum(counts[w] for w in WEBS) == 300, f"not every request answered: {dict(counts)}")
    chi2 = chi2_even(counts, WEBS, 300)
    check(chi2 < CHI2_CRIT_2DOF_0001, f"not spread evenly (chi2 {chi2:.1f}): {dict(counts)}")
    programmed = view(dc.agent(NODE1), spn(WEB), family)
    if programmed is not None:
        check_even_split(programmed, 3)
        # "[ip]:port" as upstream joins IPv6 ones; a bare "ip:port" says the same.
        wanted = sorted(f"{address(dc, w, family)}:8080" for w in WEBS)
        got = sorted(e.target.replace("[", "").replace("]", "") for e in programmed.endpoints)
        check(got == wanted, f"inspect() {family} endpoints {got}, not {wanted}")


def case_nodeport(dc: DataplaneCluster, family: IPFamily) -> None:
    synced(dc, *web_in(dc, family, type="NodePort", node_port=NODEPORT))
    node1, node2 = address(dc, NODE1, family), address(dc, NODE2, family)
    from_external = dc.lab.http(EXTERNAL, node1, NODEPORT, count=12)
    check(all_ok(from_external), f"NodePort from the external host: {tally(from_external)}")
    check(set(tally(from_external)) <= set(WEBS), f"non-endpoints: {tally(from_external)}")
    check({WEB_B, WEB_C} & set(tally(from_external)), "never forwarded to the other node")
    check(all_ok(dc.lab.http(EXTERNAL, node2, NODEPORT, count=6)), "via kind-worker2")
    from_node2 = dc.lab.http(NODE2, node1, NODEPORT, count=6)
    check(all_ok(from_node2), f"NodePort from the other node: {tally(from_node2)}")
    # Cluster policy masquerades: the pods never see the external client's address.
    seen = dc.lab.http(EXTERNAL, node1, NODEPORT, "/clientip", count=6)
    check(all_ok(seen), f"/clientip through the NodePort: {seen}")
    check(address(dc, EXTERNAL, family) not in hosts(seen), f"not masqueraded: {hosts(seen)}")


def case_nodeport_local(dc: DataplaneCluster, family: IPFamily) -> None:
    # The only endpoint is web-a on kind-worker: kind-worker2 has no local endpoint.
    synced(
        dc,
        *web_in(
            dc,
            family,
            (WEB_A,),
            type="NodePort",
            node_port=NODEPORT,
            external_traffic_policy="Local",
        ),
    )
    node1, node2 = address(dc, NODE1, family), address(dc, NODE2, family)
    seen = dc.lab.http(EXTERNAL, node1, NODEPORT, "/clientip", count=3)
    client = address(dc, EXTERNAL, family)
    check(all_ok(seen) and hosts(seen) == {client}, f"client IP not kept: {seen}")
    [dropped] = dc.lab.http(EXTERNAL, node2, NODEPORT, timeout=1.0)
    check(dropped.outcome == "timeout", f"no local endpoint: dropped, not {dropped}")
    # The node with the endpoint still answers after the other one dropped.
    after = tally(dc.lab.http(EXTERNAL, node1, NODEPORT, count=2))
    check(after == {WEB_A: 2}, f"the node with the endpoint, after the drop: {dict(after)}")


#: The capability of a backend that translates a Service address where the socket connects.
SOCKET_LOAD_BALANCING = "socket-load-balancing"


def case_hairpin(dc: DataplaneCluster, family: IPFamily) -> None:
    """A pod reaching itself through its Service is masqueraded (with its own address as
    source, the reply would never be un-NATed); where the backend declares
    ``socket-load-balancing`` its socket connects to itself, so it sees its own address."""
    synced(dc, *web_in(dc, family, (WEB_A,), name="self", vip=SELF_VIPS[V4], vip6=SELF_VIPS[V6]))
    vip = SELF_VIPS[family]
    counts = tally(dc.lab.http(WEB_A, vip, 80, count=3))
    check(counts == {WEB_A: 3}, f"a pod through its own Service: {dict(counts)}")
    seen = dc.lab.http(WEB_A, vip, 80, "/clientip", count=3)
    check(all_ok(seen), f"hairpin /clientip failed: {seen}")
    own = address(dc, WEB_A, family)
    node1 = dc.agent(NODE1)
    at_socket = SOCKET_LOAD_BALANCING in node1.backend.capabilities
    if at_socket:
        check(hosts(seen) == {own}, f"a socket connected to itself, not from {own}: {seen}")
    else:
        check(own not in hosts(seen), "hairpin traffic was not masqueraded")
    programmed = view(node1, spn("self"), family)
    if programmed is not None:
        check(
            programmed.masquerade is not at_socket,
            f"inspect() says hairpin traffic is {'' if programmed.masquerade else 'not '}"
            "masqueraded",
        )


def case_udp(dc: DataplaneCluster, family: IPFamily) -> None:
    synced(
        dc,
        *web_in(
            dc,
            family,
            name="dns",
            vip=DNS_VIPS[V4],
            vip6=DNS_VIPS[V6],
            port=53,
            target_port=UDP_PORT,
            protocol="UDP",
        ),
    )
    vip = DNS_VIPS[family]
    counts = tally(dc.lab.udp(CLIENT_POD, vip, 53, count=9))
    check(set(counts) <= set(WEBS) and sum(counts.values()) == 9, f"UDP: {dict(counts)}")
    seen = dc.lab.udp(CLIENT_POD, vip, 53, payload="clientip", count=3)
    client = address(dc, CLIENT_POD, family)
    check(all_ok(seen) and hosts(seen) == {client}, f"UDP client IP: {seen}")


class FamilyCase(Protocol):
    def __call__(self, dc: DataplaneCluster, family: IPFamily) -> None: ...


def per_family(name: str, doc: str, func: FamilyCase) -> dict[IPFamily, Case]:
    """The case for each family: ``name`` for IPv4, ``ipv6-<name>`` (needing ``ipv6``) for
    IPv6; both run ``func``, given the family."""
    return {
        V4: case(K, name, doc, functools.partial(func, family=V4)),
        V6: case(K, f"ipv6-{name}", f"IPv6: {doc}", functools.partial(func, family=V6), "ipv6"),
    }


CLUSTERIP_SPREAD = per_family(
    "clusterip-spread", "ClusterIP spreads evenly (chi-square)", case_clusterip_spread
)
NODEPORT_CASES = per_family("nodeport", "NodePort from another node and outside", case_nodeport)
NODEPORT_LOCAL = per_family(
    "nodeport-local", "Local policy: client IP, drop if none", case_nodeport_local
)
HAIRPIN = per_family(
    "hairpin", "a pod reaches itself, masqueraded (or directly at the socket)", case_hairpin
)
UDP = per_family("udp", "UDP through a ClusterIP, client IP kept", case_udp)
