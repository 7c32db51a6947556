"""The ebpf mode's entry points for traffic from other hosts, in the namespace lab: the external
host (in no node's cgroup, so no socket program translates its connections) reaches a
NodePort on kind-worker's address, an externalIP and a LoadBalancer IP routed to it, through
the kernel NAT of the mode's nftables tables; the source is masqueraded for Cluster policy
and kept for Local; loadBalancerSourceRanges filter the external host; conntrack in the node
holds NAT entries for these flows only; a full sync puts back a table someone deleted;
cleanup leaves nothing."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from typing import Any

import pytest
from kits.dataplane_kit import shared_dataplane

from kubeplex.core.daemon.conntrack import ConntrackCleaner
from kubeplex.core.model.types import IPFamily
from kubeplex.testing.conformance.traffic import (
    NODEPORT,
    WEB_VIP,
    WEBS,
    all_ok,
    hosts,
    ip_of,
    synced,
    web,
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
    WEB_C,
    tally,
)

pytestmark = pytest.mark.kernel

EXTERNAL_IP = "192.0.2.20"
DNS_VIP = "10.96.0.53"
DNS_NODEPORT = 30053
SOURCE_PORT = 40053
LB_IP = "192.0.2.10"


@pytest.fixture(scope="module")
def shared() -> Iterator[DataplaneCluster]:
    yield from shared_dataplane("ebpf")


def tables(dc: DataplaneCluster, node: str) -> str:
    return str(dc.lab.exec(node, ["nft", "list", "tables"]).stdout)


def dnat_entries(dc: DataplaneCluster, node: str) -> list[str]:
    """The node's conntrack entries whose destination was translated."""
    done = dc.lab.exec(node, ["conntrack", "-L", "--dst-nat"], check=False)
    return [line for line in done.stdout.splitlines() if line.strip()]


def test_a_nodeport_from_the_external_host_cluster_policy(dp: DataplaneCluster) -> None:
    synced(dp, *web(dp, type="NodePort", node_port=NODEPORT))
    node1 = ip_of(dp, NODE1)
    answers = dp.lab.http(EXTERNAL, node1, NODEPORT, count=30)
    assert all_ok(answers), tally(answers)
    # Endpoints on both nodes answer (one of three never chosen in 30: 3 in 190,000).
    assert set(tally(answers)) == set(WEBS)
    seen = dp.lab.http(EXTERNAL, node1, NODEPORT, "/clientip", count=6)
    assert all_ok(seen) and ip_of(dp, EXTERNAL) not in hosts(seen), seen
    # Masqueraded to the node's address, where the pod is on the other node.
    assert hosts(seen) <= {node1, "10.244.1.1"}, seen
    # And from the other node's host (its socket programs know only its own NodePorts).
    assert all_ok(dp.lab.http(NODE2, node1, NODEPORT, count=6))


def test_client_ip_affinity_from_the_external_host(dp: DataplaneCluster) -> None:
    """A ClientIP Service's NodePort (Cluster policy) sends every connection of the external
    host to one endpoint (the first one's pick, kept in that endpoint's affinity set); one
    without affinity beside it still spreads (each of 20 on one of three: 1 in 3^19)."""
    sticky = web(dp, type="NodePort", node_port=NODEPORT, session_affinity="ClientIP",
                 affinity_timeout=600)  # fmt: skip
    plain = web(dp, name="plain", vip="10.96.0.40", type="NodePort", node_port=30082)
    synced(dp, *sticky, *plain)
    node1 = ip_of(dp, NODE1)
    answers = dp.lab.http(EXTERNAL, node1, NODEPORT, count=20)
    assert all_ok(answers) and len(tally(answers)) == 1, tally(answers)
    # The external host is in the set of the endpoint that answered (and only there).
    listed = dp.lab.exec(NODE1, ["nft", "list", "table", "ip", "kubeplex-ebpf"]).stdout
    held = [s for s in listed.split("set affinity-") if f"{{ {ip_of(dp, EXTERNAL)} expires" in s]
    [pod] = tally(answers)
    assert len(held) == 1 and f"__{ip_of(dp, pod)}/8080 {{" in held[0], listed
    spread = dp.lab.http(EXTERNAL, node1, 30082, count=20)
    assert all_ok(spread) and len(tally(spread)) > 1, tally(spread)
    # A periodic full sync keeps the sets (the table is not written whole again).
    dp.sync_or_raise(full=True)
    assert dp.agent(NODE1).last_result is not None and dp.agent(NODE1).last_result.full
    again = dp.lab.http(EXTERNAL, node1, NODEPORT, count=10)
    assert all_ok(again) and tally(again) == {pod: 10}, tally(again)


def test_a_nodeport_local_policy_keeps_the_client_and_drops_without_local_endpoints(
    dp: DataplaneCluster,
) -> None:
    synced(
        dp,
        *web(
            dp, (WEB_A, WEB_B), type="NodePort", node_port=NODEPORT, external_traffic_policy="Local"
        ),
    )
    node1, node2 = ip_of(dp, NODE1), ip_of(dp, NODE2)
    seen = dp.lab.http(EXTERNAL, node1, NODEPORT, "/clientip", count=6)
    assert all_ok(seen) and hosts(seen) == {ip_of(dp, EXTERNAL)}, seen
    assert tally(dp.lab.http(EXTERNAL, node1, NODEPORT, count=10)) == {WEB_A: 10}
    assert tally(dp.lab.http(EXTERNAL, node2, NODEPORT, count=10)) == {WEB_B: 10}
    # web-b goes: kind-worker2 has no local endpoint left and drops.
    synced(
        dp,
        *web(dp, (WEB_A,), type="NodePort", node_port=NODEPORT, external_traffic_policy="Local"),
    )
    [dropped] = dp.lab.http(EXTERNAL, node2, NODEPORT, timeout=1.0)
    assert dropped.outcome == "timeout", dropped
    assert tally(dp.lab.http(EXTERNAL, node1, NODEPORT, count=3)) == {WEB_A: 3}


def test_external_ips_and_a_load_balancer_ip_routed_to_the_node(dp: DataplaneCluster) -> None:
    synced(
        dp,
        *web(
            dp,
            type="LoadBalancer",
            node_port=30081,
            external_ips=[EXTERNAL_IP],
            load_balancer_ips=[LB_IP],
        ),
    )
    for ip in (EXTERNAL_IP, LB_IP):
        dp.lab.add_route(EXTERNAL, f"{ip}/32", ip_of(dp, NODE1))
    try:
        for ip in (EXTERNAL_IP, LB_IP):
            answers = dp.lab.http(EXTERNAL, ip, 80, count=12)
            assert all_ok(answers) and set(tally(answers)) <= set(WEBS), (ip, tally(answers))
        answers = dp.lab.udp(EXTERNAL, ip_of(dp, NODE1), 30081, count=1)
        assert not all_ok(answers)  # a TCP Service: its NodePort is not open to UDP
    finally:
        for ip in (EXTERNAL_IP, LB_IP):
            dp.lab.exec(EXTERNAL, ["ip", "route", "del", f"{ip}/32"])


def test_conntrack_holds_nat_entries_for_the_external_flows_only(dp: DataplaneCluster) -> None:
    if shutil.which("conntrack") is None:
        pytest.skip("the conntrack tool is not installed")
    if dp.lab.cgroup_of(CLIENT_POD) is None:
        pytest.skip(f"the lab has no node cgroups: {dp.lab.no_cgroups}")
    synced(dp, *web(dp, type="NodePort", node_port=NODEPORT))
    # A pod of the node (in its cgroup: translated at the socket) and the external host.
    assert all_ok(dp.lab.http(CLIENT_POD, WEB_VIP, 80, count=5))
    assert all_ok(dp.lab.http(CLIENT_POD, ip_of(dp, NODE1), NODEPORT, count=5))
    assert all_ok(dp.lab.http(EXTERNAL, ip_of(dp, NODE1), NODEPORT, count=5))
    found = dnat_entries(dp, NODE1)
    external = re.escape(ip_of(dp, EXTERNAL))
    assert len(found) == 5, found
    assert all(re.search(rf"src={external} dst=\S+ sport=\d+ dport={NODEPORT} ", e) for e in found)


def listed(dc: DataplaneCluster, node: str) -> list[str]:
    """The mode's IPv4 table as nft lists it, line by line, sorted (a chain added by a partial
    sync is listed after those a whole write put in order)."""
    done = dc.lab.exec(node, ["nft", "list", "table", "ip", "kubeplex-ebpf"])
    return sorted(line.strip().rstrip(",") for line in done.stdout.splitlines())


def test_partial_syncs_leave_the_tables_a_full_sync_writes(dp: DataplaneCluster) -> None:
    synced(
        dp,
        *web(dp, type="NodePort", node_port=NODEPORT),
        *web(dp, (WEB_B,), name="other", vip="10.96.0.40", external_ips=[EXTERNAL_IP]),
    )
    agent = dp.agent(NODE1)
    for objects in (
        web(dp, (WEB_A,), type="NodePort", node_port=NODEPORT),  # fewer endpoints
        web(dp, (WEB_C,), name="new", vip="10.96.0.41", type="NodePort", node_port=30082),
        web(dp, (WEB_B,), name="other", vip="10.96.0.40", external_ips=[LB_IP]),  # moved
    ):
        agent.set(*objects)
        assert agent.sync(full=False) and not agent.results[-1].full
    dp.delete("Service", "default", "other")
    assert agent.sync(full=False)
    partial = listed(dp, NODE1)
    assert dp.agent(NODE1).sync(full=True)
    assert partial == listed(dp, NODE1)
    assert tally(dp.lab.http(EXTERNAL, ip_of(dp, NODE1), NODEPORT, count=3)) == {WEB_A: 3}
    assert tally(dp.lab.http(EXTERNAL, ip_of(dp, NODE1), 30082, count=3)) == {WEB_C: 3}


def test_partial_syncs_of_an_affinity_service_leave_what_a_full_sync_writes(
    dp: DataplaneCluster,
) -> None:
    """The kernel takes each partial transaction: a set added before the rule that uses it,
    one deleted after, one with a new timeout made again between its chain's flush and
    rules."""

    def sticky(pods: tuple[str, ...], timeout: int = 600) -> list[dict[str, Any]]:
        return web(dp, pods, type="NodePort", node_port=NODEPORT, session_affinity="ClientIP",
                   affinity_timeout=timeout)  # fmt: skip

    synced(dp, *sticky((WEB_A, WEB_B)))
    agent = dp.agent(NODE1)
    for objects in (sticky(WEBS), sticky((WEB_B, WEB_C)), sticky((WEB_B, WEB_C), timeout=60)):
        agent.set(*objects)
        assert agent.sync(full=False) and not agent.results[-1].full
    partial = listed(dp, NODE1)
    assert sum("timeout 1m" in line for line in partial) == 2, partial
    assert agent.sync(full=True)
    assert partial == listed(dp, NODE1)
    answers = dp.lab.http(EXTERNAL, ip_of(dp, NODE1), NODEPORT, count=6)
    assert all_ok(answers) and len(tally(answers)) == 1 and set(tally(answers)) <= {WEB_B, WEB_C}


def test_a_full_sync_puts_back_a_deleted_table_and_cleanup_removes_it(
    dp: DataplaneCluster,
) -> None:
    synced(dp, *web(dp, type="NodePort", node_port=NODEPORT))
    assert "table ip kubeplex-ebpf" in tables(dp, NODE1)
    dp.lab.exec(NODE1, ["nft", "delete", "table", "ip", "kubeplex-ebpf"])
    [lost] = dp.lab.http(EXTERNAL, ip_of(dp, NODE1), NODEPORT, timeout=1.0)
    assert not lost.ok
    assert dp.agent(NODE1).sync(full=True)
    assert all_ok(dp.lab.http(EXTERNAL, ip_of(dp, NODE1), NODEPORT, count=3))

    agent = dp.agent(NODE1)
    assert "nftables table ip kubeplex-ebpf" in agent.backend.leftovers()
    report = agent.cleanup()
    assert "nftables table ip kubeplex-ebpf" in report.removed
    assert "kubeplex-ebpf" not in tables(dp, NODE1)
    assert agent.backend.leftovers() == []


def test_source_ranges_filter_the_external_host(dp: DataplaneCluster) -> None:
    external = ip_of(dp, EXTERNAL)
    lb = {"type": "LoadBalancer", "node_port": 30081, "load_balancer_ips": [LB_IP]}
    synced(dp, *web(dp, **lb, load_balancer_source_ranges=["203.0.113.0/24"]))
    dp.lab.add_route(EXTERNAL, f"{LB_IP}/32", ip_of(dp, NODE1))
    try:
        [dropped] = dp.lab.http(EXTERNAL, LB_IP, 80, timeout=1.0)
        assert dropped.outcome == "timeout", dropped
        # Its NodePort is not filtered (upstream filters the LoadBalancer IPs only).
        assert all_ok(dp.lab.http(EXTERNAL, ip_of(dp, NODE1), 30081, count=3))
        synced(dp, *web(dp, **lb, load_balancer_source_ranges=["203.0.113.0/24", f"{external}/32"]))
        answers = dp.lab.http(EXTERNAL, LB_IP, 80, count=6)
        assert all_ok(answers) and set(tally(answers)) <= set(WEBS), tally(answers)
    finally:
        dp.lab.exec(EXTERNAL, ["ip", "route", "del", f"{LB_IP}/32"])


def test_an_external_udp_flow_leaves_a_removed_endpoint(dp: DataplaneCluster) -> None:
    """The flows of entry points for other hosts are the kernel's NAT: the daemon's conntrack
    cleaner (the mode ``uses_conntrack``) moves a UDP flow off an endpoint that left, as
    upstream does, instead of leaving it on the stale entry until it times out."""
    cleaners = {}
    for name, agent in dp.agents.items():
        cleaners[name] = ConntrackCleaner(agent.netns, enabled=agent.backend.uses_conntrack)
        agent.proxier.listeners.append(cleaners[name])
    pods = (WEB_A, WEB_B, WEB_C)

    def dns(*serving: str) -> tuple[dict[str, Any], dict[str, Any]]:
        return (
            service("dns", DNS_VIP, 53, target_port=UDP_PORT, protocol="UDP", type="NodePort",
                    node_port=DNS_NODEPORT),
            endpoint_slice("dns", dp.endpoints(*serving), port=UDP_PORT, protocol="UDP"),
        )  # fmt: skip

    def answers() -> list[str]:
        results = dp.lab.udp(
            EXTERNAL, ip_of(dp, NODE1), DNS_NODEPORT, count=3, source_port=SOURCE_PORT
        )
        return [r.body or "" if r.ok else r.outcome for r in results]

    synced(dp, *dns(*pods))
    first = answers()
    assert len(set(first)) == 1 and first[0] in pods, first  # one flow, one endpoint
    dp.set(*dns(*(p for p in pods if p != first[0])))
    dp.sync_or_raise()
    after = answers()
    assert len(set(after)) == 1 and after[0] in pods and after[0] != first[0], after
    assert cleaners[NODE1].deleted[IPFamily.IPv4] >= 1


def test_a_nodeport_without_endpoints_is_refused_to_the_external_host(
    dp: DataplaneCluster,
) -> None:
    """Rejected at the input hook (not in the nat chain, as upstream's nftables mode), as the
    socket programs refuse the node's own connections."""
    # The kernel sends one ICMP error a second to a peer (icmp_ratelimit): an earlier test's
    # error to the external host must not hold back this one.
    dp.lab.exec(NODE1, ["sysctl", "-qw", "net.ipv4.icmp_ratelimit=0"])
    synced(dp, service("empty", "10.96.0.31", 80, type="NodePort", node_port=30031))
    [r] = dp.lab.http(EXTERNAL, ip_of(dp, NODE1), 30031, timeout=3.0)
    assert r.outcome == "refused" and r.ms < 500, r
    [r] = dp.lab.http(CLIENT_POD, ip_of(dp, NODE1), 30031, timeout=3.0)
    assert r.outcome == "refused" and r.ms < 500, r
