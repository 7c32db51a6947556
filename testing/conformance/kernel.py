"""The kernel suite's IPv4 cases: traffic outcomes in the namespace lab, and the kernel's own
account of them through the contract (``inspect``, ``leftovers``, ``cleanup``, and a kernel
seam whose ``writes`` refuse). Those run in each family are the IPv4 halves of families.py's.

Every case gets a blank dataplane with fresh agents (``DataplaneCluster.reset``); a case that
needs a capability runs only for a backend that declares it.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterable
from typing import Any

from kubeplex.core.dataplane.backend import CleanupReport
from kubeplex.testing.conformance.common import Case, Skip, case, check
from kubeplex.testing.conformance.families import (
    CLUSTERIP_SPREAD,
    HAIRPIN,
    NODEPORT_CASES,
    NODEPORT_LOCAL,
    SOCKET_LOAD_BALANCING,
    UDP,
)
from kubeplex.testing.conformance.seams import REFUSAL, Recorder, refusing, swapped
from kubeplex.testing.conformance.traffic import (
    NODEPORT,
    V4,
    WEB,
    WEB_VIP,
    WEBS,
    all_ok,
    check_even_split,
    ip_of,
    leftovers,
    named_in,
    packets,
    spn,
    synced,
    targets,
    view,
    web,
)
from kubeplex.testing.dataplane import WEB_D, DataplaneCluster, NodeAgent, endpoint_slice, service
from kubeplex.testing.netlab import (
    CLIENT_POD,
    EXTERNAL,
    NODE1,
    WEB_A,
    WEB_B,
    WEB_C,
    tally,
)


def check_none_left(agent: NodeAgent, gone: Iterable[str], live: Iterable[str]) -> None:
    """None of the ``gone`` objects is in ``leftovers()``, which names the ``live`` ones (else
    it could not show a stale object either)."""
    lines = leftovers(agent)
    unseen = [o for o in live if not named_in(o, lines)]
    check(
        not unseen,
        f"{agent.node}: leftovers() does not name objects inspect() gives ({unseen[:3]}), so "
        f"it cannot show a stale one; it says: {lines[:4]}",
    )
    stale = {o: named_in(o, lines) for o in gone if named_in(o, lines)}
    check(not stale, f"{agent.node}: objects that should be gone are still there: {stale}")


def case_scale_up_and_down(dc: DataplaneCluster) -> None:
    node1 = dc.agent(NODE1)
    synced(dc, *web(dc))
    three = view(node1, spn(WEB))
    if three is not None:
        check_even_split(three, 3)

    dc.set(endpoint_slice(WEB, dc.endpoints(*WEBS, WEB_D), port=8080))
    dc.sync_or_raise()
    four = view(node1, spn(WEB))
    if four is not None:
        check_even_split(four, 4)
        web_d = f"{ip_of(dc, WEB_D)}:8080"
        check(web_d in targets(four), f"{web_d} not among the endpoints: {targets(four)}")
    counts = tally(dc.lab.http(CLIENT_POD, WEB_VIP, 80, count=80))
    check(set(counts) == {*WEBS, WEB_D}, f"after scaling to four: {dict(counts)}")

    dc.set(endpoint_slice(WEB, dc.endpoints(*WEBS), port=8080))
    check(dc.sync(), node1.last_error)
    check(node1.last_result is not None and not node1.last_result.full, "scale down was full")
    back = view(node1, spn(WEB))
    if back is not None and four is not None:
        check_even_split(back, 3)
        check_none_left(node1, set(four.objects) - set(back.objects), back.objects)
    counts = tally(dc.lab.http(CLIENT_POD, WEB_VIP, 80, count=60))
    check(set(counts) == set(WEBS), f"after scaling back to three: {dict(counts)}")


def case_no_endpoints_refused(dc: DataplaneCluster) -> None:
    synced(
        dc,
        service("empty", "10.96.0.30", 80, target_port=8080),
        # A slice whose only endpoint is neither ready nor serving counts as no endpoints.
        service("notready", "10.96.0.31", 80, target_port=8080),
        endpoint_slice("notready", dc.endpoints(WEB_A, ready=False), port=8080),
    )
    for vip in ("10.96.0.30", "10.96.0.31"):
        [r] = dc.lab.http(CLIENT_POD, vip, 80, timeout=3.0)
        # An immediate ICMP reject, not the 3 s timeout.
        check(r.outcome == "refused" and r.ms < 500, f"{vip}: expected a refusal, got {r}")


def case_session_affinity(dc: DataplaneCluster) -> None:
    synced(dc, *web(dc, session_affinity="ClientIP", affinity_timeout=60))
    counts = tally(dc.lab.http(CLIENT_POD, WEB_VIP, 80, count=30))
    check(
        len(counts) == 1 and next(iter(counts)) in WEBS and sum(counts.values()) == 30,
        f"not sticky: {dict(counts)}",
    )
    programmed = view(dc.agent(NODE1), spn(WEB))
    if programmed is not None:
        check(
            programmed.affinity_seconds == 60,
            f"inspect() says affinity {programmed.affinity_seconds} s, the Service 60 s",
        )


def case_internal_local(dc: DataplaneCluster) -> None:
    synced(dc, *web(dc, internal_traffic_policy="Local"))
    counts = tally(dc.lab.http(CLIENT_POD, WEB_VIP, 80, count=20))
    check(counts == {WEB_A: 20}, f"kind-worker's only local endpoint is web-a: {dict(counts)}")
    # On kind-worker2 the local endpoints are web-b and web-c.
    counts = tally(dc.lab.http(WEB_B, WEB_VIP, 80, count=20))
    check(
        set(counts) <= {WEB_B, WEB_C} and sum(counts.values()) == 20,
        f"kind-worker2's local endpoints: {dict(counts)}",
    )


def case_conntrack_dnat_tuple(dc: DataplaneCluster) -> None:
    """conntrack holds the DNAT tuple of a connection to a ClusterIP; a backend that translates
    at the socket (``socket-load-balancing``) holds none."""
    if shutil.which("conntrack") is None:
        raise Skip("the conntrack tool is not installed on this machine")
    synced(dc, *web(dc))
    [r] = dc.lab.http(CLIENT_POD, WEB_VIP, 80)
    check(r.ok and r.body in WEBS, f"request to the ClusterIP: {r}")
    out = str(dc.lab.exec(NODE1, ["conntrack", "-L", "-p", "tcp", "-d", WEB_VIP]).stdout)
    if SOCKET_LOAD_BALANCING in dc.agent(NODE1).backend.capabilities:
        check(WEB_VIP not in out, f"a backend translating at the socket left a NAT entry: {out}")
        return
    client = re.escape(ip_of(dc, CLIENT_POD))
    pattern = re.compile(
        rf"src={client} dst={re.escape(WEB_VIP)} sport=\d+ dport=80 "
        rf"src=(\S+) dst={client} sport=8080 "
    )
    replies = {m.group(1) for m in pattern.finditer(out)}
    # The original tuple goes to the ClusterIP, the expected reply comes from the chosen pod.
    check(replies and replies <= {ip_of(dc, w) for w in WEBS}, f"conntrack: {out}")
    check(ip_of(dc, r.body or "") in replies, f"the answering pod is not in conntrack: {out}")


LB_IP = "192.0.2.10"


def case_load_balancer_ip(dc: DataplaneCluster) -> None:
    synced(dc, *web(dc, type="LoadBalancer", node_port=30081, load_balancer_ips=[LB_IP]))
    dc.lab.add_route(EXTERNAL, f"{LB_IP}/32", ip_of(dc, NODE1))
    try:
        results = dc.lab.http(EXTERNAL, LB_IP, 80, count=9)
        check(all_ok(results), f"LoadBalancer IP from the external host: {tally(results)}")
        check(set(tally(results)) <= set(WEBS), f"non-endpoints: {tally(results)}")
    finally:
        dc.lab.exec(EXTERNAL, ["ip", "route", "del", f"{LB_IP}/32"])


def case_load_balancer_source_ranges(dc: DataplaneCluster) -> None:
    external = ip_of(dc, EXTERNAL)
    lb: dict[str, Any] = {"type": "LoadBalancer", "node_port": 30081, "load_balancer_ips": [LB_IP]}
    synced(dc, *web(dc, **lb, load_balancer_source_ranges=[f"{external}/32"]))
    dc.lab.add_route(EXTERNAL, f"{LB_IP}/32", ip_of(dc, NODE1))
    try:
        allowed = dc.lab.http(EXTERNAL, LB_IP, 80, count=6)
        check(all_ok(allowed), f"a source in the ranges: {tally(allowed)}")
        [dropped] = dc.lab.http(CLIENT_POD, LB_IP, 80, timeout=1.0)
        check(dropped.outcome == "timeout", f"a source outside the ranges: dropped, not {dropped}")
        # Widening the ranges lets the pod in, the external host stays in.
        synced(dc, *web(dc, **lb, load_balancer_source_ranges=[f"{external}/32", "10.244.0.0/16"]))
        inside = dc.lab.http(CLIENT_POD, LB_IP, 80, count=3)
        check(all_ok(inside), f"a source in the widened ranges: {tally(inside)}")
        check(all_ok(dc.lab.http(EXTERNAL, LB_IP, 80, count=3)), "the external host, widened")
    finally:
        dc.lab.exec(EXTERNAL, ["ip", "route", "del", f"{LB_IP}/32"])


def case_partial_sync_keeps_counters(dc: DataplaneCluster) -> None:
    """A partial sync does not rewrite an unchanged Service: its kernel counters stay. Where
    the kernel keeps no counters (``inspect`` says None), nothing the partial sync sends
    through the seam may name one of its objects instead."""
    node1 = dc.agent(NODE1)
    synced(dc, *web(dc), *web(dc, (WEB_A, WEB_B), name="other", vip="10.96.0.40"))
    first = view(node1, spn(WEB))
    if first is None:
        raise Skip("inspect() returns None: the backend cannot read its kernel back")
    start = packets(first)
    check(all_ok(dc.lab.http(CLIENT_POD, WEB_VIP, 80, count=30)), "30 requests to web")
    time.sleep(0.5)  # the connections' last packets
    counted = view(node1, spn(WEB))
    assert counted is not None
    before = packets(counted)
    if start is not None:
        check(
            before is not None and before - start >= 30,
            f"30 connections to web, its counter went from {start} to {before}",
        )

    dc.set(endpoint_slice("other", dc.endpoints(WEB_A), port=8080))
    recorder = Recorder(node1.backend.kernel)
    with swapped(node1.backend, recorder.seam):
        check(node1.sync(full=False), node1.last_error)
    check(node1.last_result is not None and not node1.last_result.full, "the sync was full")
    check(recorder.sent, "the partial sync sent nothing through the kernel seam")
    other = tally(dc.lab.http(CLIENT_POD, "10.96.0.40", 80, count=6))
    check(other == {WEB_A: 6}, f"the changed Service: {dict(other)}")
    after = view(node1, spn(WEB))
    assert after is not None
    if before is not None:
        check(
            packets(after) == before,
            f"the unchanged Service's counter went from {before} to {packets(after)}: rewritten",
        )
        return
    lines = [ln for text in recorder.sent for ln in text.splitlines()]
    touched = {o: named_in(o, lines)[:2] for o in counted.objects if named_in(o, lines)}
    check(not touched, f"the partial sync wrote objects of the unchanged Service: {touched}")


def case_failed_apply_keeps_rules(dc: DataplaneCluster) -> None:
    node1 = dc.agent(NODE1)
    synced(dc, *web(dc))
    dc.set(endpoint_slice(WEB, dc.endpoints(WEB_A, WEB_B), port=8080))
    backend = node1.backend
    with swapped(backend, refusing(backend.kernel)):
        check(node1.sync() is False, "a sync whose every kernel write is refused succeeded")
        check(REFUSAL in node1.last_error, f"the sync's error: {node1.last_error!r}")
        # The old rules (three endpoints) are still in place and still work.
        counts = tally(dc.lab.http(CLIENT_POD, WEB_VIP, 80, count=30))
        check(set(counts) == set(WEBS), f"after the refused apply: {dict(counts)}")
    before = len(node1.results)
    check(node1.sync(), node1.last_error)
    check(len(node1.results) == before + 1, "the sync after the refusal did nothing")
    check(node1.last_result is not None and node1.last_result.full, "not a full resync")
    counts = tally(dc.lab.http(CLIENT_POD, WEB_VIP, 80, count=30))
    check(set(counts) == {WEB_A, WEB_B}, f"after the resync: {dict(counts)}")


def case_removed_service_leaves_nothing(dc: DataplaneCluster) -> None:
    node1 = dc.agent(NODE1)
    synced(dc, *web(dc), *web(dc, name="gone", vip="10.96.0.50"))
    programmed = view(node1, spn("gone"))
    owned = set(programmed.objects) if programmed is not None else set()
    kept = view(node1, spn(WEB))
    check(all_ok(dc.lab.http(CLIENT_POD, "10.96.0.50", 80)), "the Service before removal")

    dc.delete("Service", "default", "gone")
    dc.delete("EndpointSlice", "default", "gone-slice")
    check(dc.sync(), node1.last_error)
    check(node1.last_result is not None and not node1.last_result.full, "the removal was full")
    after = node1.backend.inspect(spn("gone"))
    check(after is None or after == [], f"inspect() of the removed Service: {after}")
    check_none_left(node1, owned, kept.objects if kept is not None else ())
    [r] = dc.lab.http(CLIENT_POD, "10.96.0.50", 80, timeout=0.5)
    check(not r.ok, f"the removed Service still answers: {r}")
    check(all_ok(dc.lab.http(CLIENT_POD, WEB_VIP, 80, count=3)), "the other one is not intact")


def case_cleanup_leaves_nothing(dc: DataplaneCluster) -> None:
    synced(dc, *web(dc, type="NodePort", node_port=NODEPORT))
    check(all_ok(dc.lab.http(CLIENT_POD, WEB_VIP, 80)), "the Service before cleanup")
    for agent in dc.agents.values():
        check(leftovers(agent), f"{agent.node}: leftovers() is empty with a Service programmed")
        report = agent.cleanup()
        check(isinstance(report, CleanupReport), f"cleanup() returned {report!r}")
        check(report.removed, f"{agent.node}: cleanup() says it removed nothing")
        left = leftovers(agent)
        check(left == [], f"{agent.node}: left after cleanup: {left[:10]}")
    [r] = dc.lab.http(CLIENT_POD, WEB_VIP, 80, timeout=0.5)
    check(not r.ok, f"the Service still answers after cleanup: {r}")


def case_localhost_nodeport(dc: DataplaneCluster) -> None:
    synced(dc, *web(dc, type="NodePort", node_port=NODEPORT))
    results = dc.lab.http(NODE1, "127.0.0.1", NODEPORT, count=6)
    check(all_ok(results) and set(tally(results)) <= set(WEBS), f"127.0.0.1: {results}")


def case_unused_clusterip_port_refused(dc: DataplaneCluster) -> None:
    synced(dc, *web(dc))
    [r] = dc.lab.http(CLIENT_POD, WEB_VIP, 81, timeout=3.0)
    check(r.outcome == "refused" and r.ms < 500, f"an unused port of the ClusterIP: {r}")
    check(all_ok(dc.lab.http(CLIENT_POD, WEB_VIP, 80, count=3)), "the Service port broke")


K = "kernel"
IPV4_CASES: tuple[Case, ...] = (
    CLUSTERIP_SPREAD[V4],
    case(K, "scale-up-down", "3 -> 4 -> 3 endpoints, even split", case_scale_up_and_down),
    case(K, "no-endpoints-refused", "no (ready) endpoints: refused", case_no_endpoints_refused),
    NODEPORT_CASES[V4],
    NODEPORT_LOCAL[V4],
    case(
        K, "session-affinity", "ClientIP affinity sticks", case_session_affinity, "session-affinity"
    ),
    HAIRPIN[V4],
    case(K, "internal-local", "internalTrafficPolicy Local", case_internal_local),
    case(
        K, "conntrack-dnat", "conntrack holds the DNAT tuple (or none)", case_conntrack_dnat_tuple
    ),
    UDP[V4],
    case(K, "loadbalancer-ip", "LoadBalancer IP from outside", case_load_balancer_ip),
    case(
        K,
        "loadbalancer-source-ranges",
        "only sources in loadBalancerSourceRanges",
        case_load_balancer_source_ranges,
        "load-balancer-source-ranges",
    ),
    case(
        K,
        "partial-sync-counters",
        "a partial sync keeps an unchanged Service's counters",
        case_partial_sync_keeps_counters,
    ),
    case(K, "failed-apply", "a refused apply keeps the rules", case_failed_apply_keeps_rules),
    case(
        K,
        "removed-service",
        "a removed Service leaves nothing",
        case_removed_service_leaves_nothing,
    ),
    case(K, "cleanup", "cleanup() leaves nothing", case_cleanup_leaves_nothing),
    case(
        K,
        "localhost-nodeport",
        "NodePort on 127.0.0.1",
        case_localhost_nodeport,
        "localhost-nodeports",
    ),
    case(
        K,
        "unused-port-refused",
        "an unused ClusterIP port is refused",
        case_unused_clusterip_port_refused,
        "reject-unused-clusterip-ports",
    ),
)
