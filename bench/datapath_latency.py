"""Data path: TCP connect latency to one ClusterIP while the node holds N Services.

For each mode and size, in one run (root; everything in a throw-away namespace lab): program
node1 with N Services x 10 endpoints (only the measured Service's endpoint is a live pod), then
time C TCP connects from the client pod to the measured ClusterIP. The measured Service sorts
last, so in iptables mode its KUBE-SERVICES rule is the last one a packet is matched against.

Usage: python bench/datapath_latency.py [--modes iptables,nftables] [--sizes 1,1000,10000]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from kubeplex.core.daemon.proxier import collector_paused
from kubeplex.core.dataplane import plugins
from kubeplex.testing.dataplane import cluster, endpoint, endpoint_slice, service
from kubeplex.testing.netlab import CLIENT_POD, NODE1, NODE2

MEASURED_IP = "10.96.255.254"
PROBE = """
import json, socket, statistics, sys, time
ip, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
times = []
for _ in range(count):
    t = time.perf_counter()
    s = socket.create_connection((ip, port), timeout=2)
    times.append((time.perf_counter() - t) * 1e6)
    s.close()
times.sort()
print(json.dumps({"median_us": statistics.median(times), "p99_us": times[int(len(times) * 0.99)]}))
"""


def filler(n: int) -> list[dict[str, Any]]:
    """n Services with 10 endpoints each that no packet of the benchmark ever reaches."""
    objs: list[dict[str, Any]] = []
    for i in range(n):
        name = f"fill-{i:05d}"
        objs.append(service(name, f"10.96.{i // 250}.{i % 250 + 1}", 80))
        ks = range(i * 10, i * 10 + 10)
        eps = [endpoint(f"10.{200 + k // 65536}.{(k // 256) % 256}.{k % 256}", NODE2) for k in ks]
        objs.append(endpoint_slice(name, eps, 8080))
    return objs


def measure(mode: str, n: int, connects: int) -> dict[str, float]:
    with cluster(mode) as c:
        objs = [
            *filler(n - 1),
            service("zz-measured", MEASURED_IP, 80),
            endpoint_slice("zz-measured", c.endpoints("web-a"), 8080),
        ]
        agent = c.agent(NODE1)
        agent.set(*objs)
        with collector_paused():
            start = time.perf_counter()
            assert agent.sync(full=True), agent.last_error
            programmed = time.perf_counter() - start
        client = c.lab.namespace_of(CLIENT_POD)
        out = c.lab.exec(client, [sys.executable, "-c", PROBE, MEASURED_IP, "80", str(connects)])
        result: dict[str, float] = json.loads(out.stdout)
        result["program_s"] = programmed
        return result


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--modes", default="iptables,nftables")
    p.add_argument("--sizes", default="1,1000,10000")
    p.add_argument("--connects", type=int, default=2000)
    args = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (network namespaces)")
    modes = [m for m in args.modes.split(",") if m in plugins.available()]
    for n in (int(s) for s in args.sizes.split(",")):
        for mode in modes:
            r = measure(mode, n, args.connects)
            print(
                f"{mode:>9} {n:>6} services | connect median {r['median_us']:7.1f} us"
                f" p99 {r['p99_us']:7.1f} us | programmed in {r['program_s']:.2f} s",
                flush=True,
            )


if __name__ == "__main__":
    main()
