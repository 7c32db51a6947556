"""Conntrack cleanup after a sync, on real UDP flows in a lab.

The tests pin a client's UDP 5-tuple (fixed source port) so every datagram rides one conntrack
entry, change the Service, sync, and look at who answers the next datagram: with the cleanup
the flow is load-balanced again, without it the stale entry keeps sending it to the old place
(a removed endpoint, or nowhere). Which entries are stale is tested without the kernel in
tests/unit/test_conntrack.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pytest
from dataplane_kit import shared_dataplane

from kubeplex.core.daemon.conntrack import UDP, ConntrackCleaner, NetlinkConntrack
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

VIP = "10.96.0.10"
EP_A = "10.244.1.2"
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
