"""Conntrack cleanup after a sync, on real UDP flows in a lab.

The tests pin a client's UDP 5-tuple (fixed source port) so every datagram rides one conntrack
entry, change the Service, sync, and look at who answers the next datagram: with the cleanup
the flow is load-balanced again, without it the stale entry keeps sending it to the old place
(a removed endpoint, or nowhere). Which entries are stale is tested without the kernel in
tests/unit/test_conntrack.py.

The ctnetlink table is checked against the conntrack tool, and a cleanup of 40,000 stale
entries against a Service change made while it runs: the change is programmed first, then
every stale entry goes and every live one stays the same entry.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import pytest
from kits.dataplane_kit import shared_dataplane

from kubeplex.core.daemon.conntrack import UDP, ConntrackCleaner
from kubeplex.core.daemon.ctnetlink import BATCH, Flow, NetlinkConntrack
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


# ----------------------------------------------------------------------- ctnetlink, in batches


def tool_listing(run: Callable[[list[str]], str], family: str = "ipv4") -> dict[int, str]:
    """The UDP entries as ``conntrack -L`` shows them, by id (the tool is the oracle)."""
    out = run(["conntrack", "-L", "-f", family, "-p", "udp", "-o", "id"])
    return {int(line.rsplit("id=", 1)[1]): line for line in out.splitlines() if " id=" in line}


def in_scratch(netns: str) -> Callable[[list[str]], str]:
    def run(argv: list[str]) -> str:
        cmd = ["ip", "netns", "exec", netns, *argv]
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout

    return run


def udp_flow(i: int, to: str, *, dst: str = VIP, zone: int | None = None) -> Flow:
    """Client 10.244.0.3, source port 1024 + i, to ``dst``:53 DNATed to ``to``:8081."""
    sport = 1024 + i
    return Flow(UDP, "10.244.0.3", dst, sport, 53, to, "10.244.0.3", UDP_PORT, sport, zone)


@pytest.mark.kernel
def test_ctnetlink_lists_and_deletes_the_entries_the_conntrack_tool_sees(netns: str) -> None:
    tool = in_scratch(netns)
    made = [udp_flow(i, EP_A) for i in range(3 * BATCH + 5)]  # several batches
    twin = replace(made[0], zone=7)  # the same tuple in another zone: another entry
    with NetlinkConntrack(IPFamily.IPv4, netns) as table:
        assert table.add([*made, twin], timeout=600) == len(made) + 1
        assert table.add(made[:3], timeout=600) == 0  # there already
        with NetlinkConntrack(IPFamily.IPv6, netns) as table6:
            six = Flow(UDP, "fd00::3", "fd00:96::a", 1024, 53, "fd00:244::2", "fd00::3", 8081, 1024)
            assert table6.add([six], timeout=600) == 1
            listed6 = table6.flows(UDP)
            assert [replace(f, ct_id=None) for f in listed6] == [six]
            assert table6.delete(listed6) == 1 and table6.flows(UDP) == []
        listed = table.flows(UDP)
        seen = tool_listing(tool)
        assert sorted(f.ct_id for f in listed if f.ct_id is not None) == sorted(seen)
        for f in listed:  # every field as the tool prints it
            line = seen[f.ct_id or 0]
            assert (
                f"src={f.orig_src} dst={f.orig_dst} sport={f.orig_sport} dport={f.orig_dport} "
                f"[UNREPLIED] src={f.reply_src} dst={f.reply_dst} sport={f.reply_sport} "
                f"dport={f.reply_dport} "
            ) in line
            assert (f"zone={f.zone} " in line) == (f.zone is not None)
        assert {replace(f, ct_id=None) for f in listed} == {*made, twin}

        gone = [f for f in listed if f.zone is None][: 2 * BATCH]
        assert table.delete(gone) == len(gone)
        assert table.delete(gone) == 0  # deleted already (whole batches refused): not counted
        zoned = [f for f in listed if f.zone == 7]
        assert table.delete(zoned) == 1  # the twin in zone 7 alone
        assert set(tool_listing(tool)) == set(seen) - {f.ct_id for f in [*gone, *zoned]}

        # Deleted by id: the same tuple made again is another entry, which stays.
        old = next(f for f in table.flows(UDP) if f.zone is None)
        assert table.delete([old]) == 1
        assert table.add([replace(old, ct_id=None)], timeout=600) == 1
        assert table.delete([old]) == 0
        again = [f for f in table.flows(UDP) if f.orig_sport == old.orig_sport and not f.zone]
        assert len(again) == 1 and again[0].ct_id != old.ct_id


# ------------------------------------------------------------- a big cleanup, off the sync loop


class HeldAfterListing:
    """The node's real table, whose first cleanup stops between listing and deleting until
    ``go`` is set: a Service change is made while it is under way."""

    def __init__(self, table: NetlinkConntrack, hold: threading.Event, go: threading.Event):
        self.table, self.hold, self.go = table, hold, go

    def flows(self, proto: int) -> list[Flow]:
        listed = self.table.flows(proto)
        if not self.hold.is_set():
            self.hold.set()
            self.go.wait(60)
        return listed

    def delete(self, flows: Sequence[Flow]) -> int:
        return self.table.delete(flows)

    def close(self) -> None:
        self.table.close()


STALE = 40_000


@pytest.mark.kernel
def test_a_service_change_is_programmed_while_a_big_cleanup_runs(dp: DataplaneCluster) -> None:
    netns = dp.agent(NODE1).netns
    node = in_scratch(netns)
    ep_b, ep_c = PODS[WEB_B], PODS[WEB_C]
    events: list[str] = []
    listed, go = threading.Event(), threading.Event()
    cleaner = ConntrackCleaner(
        netns,
        table_factory=lambda family: HeldAfterListing(NetlinkConntrack(family, netns), listed, go),
        on_cleaned=lambda family, took, deleted: events.append(f"cleaned {deleted}"),
        background=True,
    )
    dp.agent(NODE1).proxier.listeners.append(cleaner)
    try:
        dp.set(*dns(WEB_A, WEB_B, WEB_C))
        dp.sync_or_raise()
        go.set()  # (the first cleanup finds nothing to delete)
        assert cleaner.wait_idle(60) and events == ["cleaned 0"]
        listed.clear()
        go.clear()

        # Clients pinned to web-c (stale once it leaves), to web-a and web-b (live), and to
        # an address that is no Service of ours.
        to_c = [udp_flow(i, ep_c) for i in range(STALE)]
        to_a = [udp_flow(STALE + i, EP_A) for i in range(500)]
        to_b = [udp_flow(STALE + 500 + i, ep_b) for i in range(500)]
        other = [udp_flow(i, "10.244.9.9", dst="10.96.0.99") for i in range(500)]
        with NetlinkConntrack(IPFamily.IPv4, netns) as table:
            assert table.add([*to_c, *to_a, *to_b, *other], timeout=600) == STALE + 1500
        before = tool_listing(node)

        dp.set(endpoint_slice("dns", dp_endpoints([WEB_A, WEB_B]), port=UDP_PORT,
                              protocol="UDP"))  # fmt: skip
        dp.sync_or_raise()
        assert listed.wait(60)  # the cleanup of web-c's entries has listed them ...
        # ... and, while it runs, a new Service and web-b's leaving are synced and programmed.
        dp.set(
            service("web2", "10.96.0.20", 80, target_port=8080),
            endpoint_slice("web2", dp_endpoints([WEB_A])),
            endpoint_slice("dns", dp_endpoints([WEB_A]), port=UDP_PORT, protocol="UDP"),
        )
        dp.sync_or_raise()
        events.append("synced web2")
        assert "default/web2" in node(["iptables-save", "-t", "nat"])
        assert len(tool_listing(node)) == len(before)  # nothing deleted yet
        go.set()
        assert cleaner.wait_idle(60)
    finally:
        go.set()
        cleaner.close()
    assert events[1:] == ["synced web2", f"cleaned {STALE}", "cleaned 500"]
    after = tool_listing(node)
    kept = {i: line for i, line in before.items() if f"src={ep_c} " not in line}
    kept = {i: line for i, line in kept.items() if f"src={ep_b} " not in line}
    assert set(after) == set(kept)  # every stale entry gone, every live one the same entry
    assert len(after) == len(to_a) + len(other) and cleaner.errors == 0
