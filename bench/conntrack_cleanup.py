"""Conntrack cleanup: what a full reconciliation and a partial cleanup cost on a busy table.

In a throw-away network namespace (root), fills the conntrack table with UDP entries to the
cluster IPs of S UDP Services (10 endpoints each), almost all DNATed to a serving endpoint and
one in 100 to an endpoint that is gone, then prints, each the median of --repeat runs:
* one ctnetlink listing of the UDP entries alone (the floor of any cleanup);
* a full reconciliation (what the first sync after a start and every resync do), which must
  delete exactly the stale entries and keep the others;
* a partial sync that lost one endpoint (filters for it only);
* a partial sync with nothing stale, and a resync of an unchanged cluster (no listing).

Usage: python bench/conntrack_cleanup.py [--entries 10000] [--services 1000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import ipaddress
import socket
import statistics
import time
from collections.abc import Callable
from typing import Any

from common import Netns
from pyroute2 import Conntrack
from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple

from kubeplex.core.daemon.conntrack import UDP, ConntrackCleaner, NetlinkConntrack
from kubeplex.core.dataplane.backend import SyncResult
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.graph import ProxyState
from kubeplex.core.model.types import IPFamily
from kubeplex.testing.dataplane import endpoint, endpoint_slice, service

NODE = "bench-node"
CLIENT = "10.244.0.3"
PORT, TARGET = 53, 8081


def vip(i: int) -> str:
    return f"10.96.{i // 250}.{i % 250 + 1}"


def pod(i: int, j: int) -> str:
    """Endpoint j of Service i (j = 10: one that is not in the Service any more)."""
    return str(ipaddress.IPv4Address("10.128.0.2") + i * 11 + j)


def endpoints_of(i: int, gone: int | None = None) -> dict[str, Any]:
    eps = [endpoint(pod(i, j), NODE) for j in range(10) if j != gone]
    return endpoint_slice(f"dns-{i}", eps, port=TARGET, protocol="UDP")


def fill(netns: str, entries: int, services: int) -> int:
    """UDP entries from CLIENT to the Services; every 100th to an endpoint that left (j=10)."""
    ct = Conntrack(netns=netns, flags=0)
    stale = 0
    try:
        for n in range(entries):
            i, sport = n % services, 1024 + n // services
            j = 10 if n % 100 == 99 else n // services % 10
            stale += j == 10
            dst, ep = vip(i), pod(i, j)
            orig = NFCTAttrTuple(
                socket.AF_INET, saddr=CLIENT, daddr=dst, proto=UDP, sport=sport, dport=PORT
            )
            reply = NFCTAttrTuple(
                socket.AF_INET, saddr=ep, daddr=CLIENT, proto=UDP, sport=TARGET, dport=sport
            )
            ct.entry("add", tuple_orig=orig, tuple_reply=reply, timeout=3600)
    finally:
        ct.close()
    return stale


def median_ms(run: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=10_000)
    ap.add_argument("--services", type=int, default=1_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    state = ClusterState(NODE, (IPFamily.IPv4,))
    for i in range(args.services):
        state.set_service(service(f"dns-{i}", vip(i), PORT, target_port=TARGET, protocol="UDP"))
        state.set_endpoint_slice(endpoints_of(i))
    full = state.checkout(full=True)
    state.set_endpoint_slice(endpoints_of(0, gone=3))
    lost_one = state.checkout()
    state.set_endpoint_slice(endpoints_of(0, gone=3))
    nothing: ProxyState = state.checkout()
    resync = state.checkout(full=True)

    with Netns() as ns:
        start = time.perf_counter()
        stale = fill(ns, args.entries, args.services)
        print(f"{args.entries} UDP entries ({stale} stale), {args.services} UDP Services: "
              f"filled in {time.perf_counter() - start:.1f} s")  # fmt: skip

        def listing() -> None:
            with NetlinkConntrack(IPFamily.IPv4, ns) as table:
                table.flows(UDP)

        first = ConntrackCleaner(ns)
        first(full, SyncResult(full=True), 0.0)
        assert first.deleted == {IPFamily.IPv4: stale}, first.deleted
        print(f"  listing alone:              {median_ms(listing, args.repeat):8.1f} ms")

        def reconcile() -> None:  # a fresh cleaner: the first sync after a start
            ConntrackCleaner(ns)(full, SyncResult(full=True), 0.0)

        print(f"  full reconciliation:        {median_ms(reconcile, args.repeat):8.1f} ms")
        for what, proxy_state in (("one endpoint lost", lost_one), ("nothing stale", nothing)):
            ms = median_ms(lambda s=proxy_state: first(s, SyncResult(full=False), 0.0), args.repeat)
            print(f"  partial, {what + ':':18} {ms:8.1f} ms")
        ms = median_ms(lambda: first(resync, SyncResult(full=True), 0.0), args.repeat)
        print(f"  resync, nothing changed:    {ms:8.1f} ms")


if __name__ == "__main__":
    main()
