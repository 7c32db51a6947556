"""Conntrack cleanup: deleting tens of thousands of stale UDP entries, against ``conntrack -D``.

In a throw-away network namespace (root): a UDP Service ``dns`` (cluster IP 10.96.0.10, 10
endpoints) whose clients hold ``--stale`` flows pinned to the endpoint that leaves and
``--live`` flows pinned to the others, plus ``--other`` flows to an address that is no
Service. For each way of deleting the stale flows the table is filled afresh (as
``conntrack -I`` does, over ctnetlink) and the time is the median of ``--repeat`` runs:

* ``conntrack -D`` of exactly those entries (a filtered dump-and-delete in C): the floor;
* with ``--before``, what kubeplex did before: a pyroute2 listing and one request per entry
  (about a minute for 40,000 entries, so once);
* kubeplex: the cleanup after the sync that lost the endpoint, a full reconciliation (the
  first sync after a start), and the ctnetlink listing alone;
* how long the sync that lost the endpoint spends in the cleaner, with the cleanup inline and
  with it on the cleaner's thread (the daemon's way).

Each run checks that the stale entries, and only they, are gone.

Usage: python bench/conntrack_cleanup.py [--stale 40000] [--live 1000] [--other 1000]
       [--repeat 3] [--before]
"""

from __future__ import annotations

import argparse
import resource
import socket
import statistics
import subprocess
import time
from collections.abc import Callable
from typing import Any

from common import Netns

from kubeplex.core.daemon.conntrack import UDP, ConntrackCleaner
from kubeplex.core.daemon.ctnetlink import Flow, NetlinkConntrack
from kubeplex.core.dataplane.backend import SyncResult
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.graph import ProxyState
from kubeplex.core.model.types import IPFamily
from kubeplex.testing.dataplane import endpoint, endpoint_slice, service

NODE = "bench-node"
VIP, PORT, TARGET = "10.96.0.10", 53, 8081
PODS = [f"10.128.0.{j + 2}" for j in range(10)]
LEAVING = PODS[-1]


def flows(stale: int, live: int, other: int) -> tuple[list[Flow], list[Flow]]:
    """(the stale flows, the ones that stay): clients 10.244.x.y, one source port each."""

    def flow(n: int, dst: str, to: str) -> Flow:
        client = f"10.244.{n // 60000}.{n % 250 + 2}"
        sport = 1024 + n % 60000
        return Flow(UDP, client, dst, sport, PORT, to, client, TARGET, sport)

    gone = [flow(n, VIP, LEAVING) for n in range(stale)]
    stay = [flow(stale + n, VIP, PODS[n % 9]) for n in range(live)]
    stay += [flow(stale + live + n, "10.96.0.99", "10.128.1.2") for n in range(other)]
    return gone, stay


def states() -> tuple[ProxyState, ProxyState]:
    """(the first sync's state, the sync's that lost ``LEAVING``)."""
    state = ClusterState(NODE, (IPFamily.IPv4,))
    state.set_service(service("dns", VIP, PORT, target_port=TARGET, protocol="UDP"))

    def endpoints(pods: list[str]) -> dict[str, Any]:
        return endpoint_slice("dns", [endpoint(p, NODE) for p in pods], port=TARGET, protocol="UDP")

    state.set_endpoint_slice(endpoints(PODS))
    first = state.checkout(full=True)
    state.set_endpoint_slice(endpoints(PODS[:-1]))
    return first, state.checkout()


def fill(ns: str, entries: list[Flow]) -> None:
    with NetlinkConntrack(IPFamily.IPv4, ns) as table:
        table.delete(table.flows(UDP))
        assert table.add(entries, timeout=3600) == len(entries)


def remaining(ns: str) -> set[Flow]:
    with NetlinkConntrack(IPFamily.IPv4, ns) as table:
        return {
            Flow(f.proto, f.orig_src, f.orig_dst, f.orig_sport, f.orig_dport, f.reply_src,
                 f.reply_dst, f.reply_sport, f.reply_dport)
            for f in table.flows(UDP)
        }  # fmt: skip


def conntrack_tool(ns: str) -> None:
    argv = ["conntrack", "-D", "-p", "udp", "--orig-dst", VIP, "--reply-src", LEAVING]
    subprocess.run(["ip", "netns", "exec", ns, *argv], check=True, capture_output=True)


def pyroute2_one_by_one(ns: str) -> None:
    """The cleanup as it was: a pyroute2 listing, then one delete request per stale entry."""
    from pyroute2 import Conntrack
    from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple

    ct = Conntrack(netns=ns, flags=0)
    try:
        for msg in list(ct.dump(tuple_orig=NFCTAttrTuple(socket.AF_INET, proto=UDP))):
            orig, reply = msg.get_attr("CTA_TUPLE_ORIG"), msg.get_attr("CTA_TUPLE_REPLY")
            oip, oproto = orig.get_attr("CTA_TUPLE_IP"), orig.get_attr("CTA_TUPLE_PROTO")
            rip = reply.get_attr("CTA_TUPLE_IP")
            dst, to = oip.get_attr("CTA_IP_V4_DST"), rip.get_attr("CTA_IP_V4_SRC")
            if dst == VIP and to == LEAVING:
                tup = NFCTAttrTuple(
                    socket.AF_INET,
                    saddr=oip.get_attr("CTA_IP_V4_SRC"),
                    daddr=dst,
                    proto=UDP,
                    sport=oproto.get_attr("CTA_PROTO_SRC_PORT"),
                    dport=oproto.get_attr("CTA_PROTO_DST_PORT"),
                )
                ct.entry("del", tuple_orig=tup)
    finally:
        ct.close()


def median_s(
    ns: str,
    entries: list[Flow],
    expect: set[Flow],
    prepare: Callable[[], Callable[[], object]],
    repeat: int,
) -> float:
    """Fill, prepare, run, check what is left; the median (wall, CPU) seconds of the run."""
    walls, cpus = [], []
    for _ in range(repeat):
        fill(ns, entries)
        run = prepare()
        start, cpu = time.perf_counter(), cpu_seconds()
        run()
        walls.append(time.perf_counter() - start)
        cpus.append(cpu_seconds() - cpu)
        left = remaining(ns)
        assert left == expect, f"{len(left)} entries left, {len(expect)} expected"
    return statistics.median(walls), statistics.median(cpus)


def cpu_seconds() -> float:
    """User and system CPU of this process and its finished children (the kernel's work
    for a netlink request is done in the requester's time, so this is a figure that other
    load on the machine does not inflate as it does wall time)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def figure(what: str, took: tuple[float, float], floor: tuple[float, float] | None) -> None:
    ratio = f"  ({took[0] / floor[0]:5.1f}x, CPU {took[1] / floor[1]:5.1f}x)" if floor else ""
    print(f"  {what + ':':34} {took[0]:8.3f} s  CPU {took[1]:7.3f} s{ratio}")


def in_sync_s(ns: str, entries: list[Flow], background: bool, repeat: int) -> float:
    """How long the sync that lost the endpoint spends in the cleaner (median)."""
    first, lost = states()
    times = []
    for _ in range(repeat):
        fill(ns, entries)
        cleaner = ConntrackCleaner(ns, background=background)
        try:
            cleaner(first, SyncResult(full=True), 0.0)
            assert cleaner.wait_idle(600)
            start = time.perf_counter()
            cleaner(lost, SyncResult(full=False), 0.0)
            times.append(time.perf_counter() - start)
            assert cleaner.wait_idle(600)
        finally:
            cleaner.close()
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stale", type=int, default=40_000)
    ap.add_argument("--live", type=int, default=1_000)
    ap.add_argument("--other", type=int, default=1_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--before", action="store_true", help="also time the pyroute2 way (slow)")
    args = ap.parse_args()

    gone, stay = flows(args.stale, args.live, args.other)
    entries, expect = [*gone, *stay], set(stay)
    first, lost = states()
    print(f"{args.stale} stale UDP entries, {len(stay)} that stay; median of {args.repeat}")
    with Netns() as ns:
        floor = median_s(ns, entries, expect, lambda: lambda: conntrack_tool(ns), args.repeat)
        figure("conntrack -D (the floor)", floor, None)
        if args.before:
            took = median_s(ns, entries, expect, lambda: lambda: pyroute2_one_by_one(ns), 1)
            figure("before: pyroute2, one by one", took, floor)

        def partial() -> Callable[[], None]:
            cleaner = ConntrackCleaner(ns)
            cleaner(first, SyncResult(full=True), 0.0)  # (the first sync: nothing stale yet)

            def run() -> None:
                cleaner(lost, SyncResult(full=False), 0.0)
                assert cleaner.deleted == {IPFamily.IPv4: len(gone)}, cleaner.deleted

            return run

        figure("the sync that lost it", median_s(ns, entries, expect, partial, args.repeat), floor)

        def full() -> Callable[[], None]:
            cleaner = ConntrackCleaner(ns)  # a fresh one reconciles

            def run() -> None:
                cleaner(lost, SyncResult(full=True), 0.0)
                assert cleaner.deleted == {IPFamily.IPv4: len(gone)}, cleaner.deleted

            return run

        figure("a full reconciliation", median_s(ns, entries, expect, full, args.repeat), floor)

        fill(ns, entries)
        walls, cpus = [], []
        for _ in range(args.repeat):
            start, cpu = time.perf_counter(), cpu_seconds()
            with NetlinkConntrack(IPFamily.IPv4, ns) as table:
                assert len(table.flows(UDP)) == len(entries)
            walls.append(time.perf_counter() - start)
            cpus.append(cpu_seconds() - cpu)
        figure("the listing alone", (statistics.median(walls), statistics.median(cpus)), floor)
        for background in (False, True):
            took = in_sync_s(ns, entries, background, args.repeat)
            how = "on its own thread" if background else "inline"
            print(f"  the sync's wait for it, {how + ':':18}{took * 1000:8.1f} ms")


if __name__ == "__main__":
    main()
