"""ebpf mode, traffic from other hosts: request latency from the external host to a NodePort on
node1's address, through the mode's kernel-NAT entry points (an nftables verdict map lookup,
then DNAT), against the floor of the same request sent straight to the pod (routed by node1,
no NAT), at N Services.

For each size, in one run (root; everything in a throw-away namespace lab): program node1 in
ebpf mode with N Services, each with a NodePort and an externalIP (so both verdict maps hold
N entries) and 10 endpoints that no packet reaches, the measured one last: a NodePort to
web-a's HTTP server on node1. Then, from the external host (in no node's cgroup: no socket
program sees its connections), alternate, request by request:
* a TCP connect, and a whole HTTP/1.0 GET (connect, request, answer to the close), to
  node1's NodePort;
* the same to web-a's address and port, routed through node1 (the floor: what a request
  costs with no translation at all);
and print the median and p99 of each. The difference between the two is the most a tc BPF
entry point could save over the kernel NAT while conntrack tracks the node's traffic anyway;
the floor measured again in blocks with node1's netfilter tables flushed (so conntrack tracks
nothing) against blocks with them says what one that also does without conntrack could.
Also printed: the first full sync's time and a one-endpoint partial sync's (median of five).

Usage: python bench/ebpf_entry_points.py [--sizes 1,1000,10000] [--requests 2000]
       [--modes ebpf] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

from kubeplex.core.daemon.proxier import collector_paused
from kubeplex.core.dataplane import plugins
from kubeplex.testing.dataplane import cluster, endpoint, endpoint_slice, service
from kubeplex.testing.netlab import EXTERNAL, HTTP_PORT, NODE1, NODE2, WEB_A

NODEPORT = 32000
PROBE = """
import json, socket, statistics, sys, time
targets = [(sys.argv[1], int(sys.argv[2])), (sys.argv[3], int(sys.argv[4]))]
count = int(sys.argv[5])
connect = [[], []]
request = [[], []]
for i in range(2 * count):
    which = i % 2
    t = time.perf_counter()
    s = socket.create_connection(targets[which], timeout=2)
    t1 = time.perf_counter()
    s.sendall(b"GET /hostname HTTP/1.0\\r\\n\\r\\n")
    while s.recv(4096):
        pass
    t2 = time.perf_counter()
    s.close()
    connect[which].append((t1 - t) * 1e6)
    request[which].append((t2 - t) * 1e6)
out = {}
for which, name in enumerate(("entry", "floor")):
    for kind, times in (("connect", connect[which]), ("request", request[which])):
        times.sort()
        out[f"{name}_{kind}_median_us"] = statistics.median(times)
        out[f"{name}_{kind}_p99_us"] = times[int(len(times) * 0.99)]
print(json.dumps(out))
"""


def filler(n: int) -> list[dict[str, Any]]:
    """n NodePort Services with an externalIP and 10 endpoints each that no packet reaches."""
    objs: list[dict[str, Any]] = []
    for i in range(n):
        name = f"fill-{i:05d}"
        objs.append(
            service(
                name,
                f"10.96.{i // 250}.{i % 250 + 1}",
                80,
                target_port=8080,
                type="NodePort",
                node_port=20000 + i,
                external_ips=[f"198.18.{i // 250}.{i % 250 + 1}"],
            )
        )
        ks = range(i * 10, i * 10 + 10)
        eps = [endpoint(f"10.{200 + k // 65536}.{(k // 256) % 256}.{k % 256}", NODE2) for k in ks]
        objs.append(endpoint_slice(name, eps, 8080))
    return objs


def changed(n: int, k: int) -> dict[str, Any]:
    """The middle filler Service's slice with its first endpoint moved (k-th time)."""
    i = max(n // 2 - 1, 0)
    eps = [endpoint(f"10.{250}.{k}.{j}", NODE2) for j in range(10)]
    return endpoint_slice(f"fill-{i:05d}", eps, 8080)


def measure(mode: str, n: int, requests: int) -> dict[str, float]:
    with cluster(mode) as c:
        svc = service(
            "zz-measured", "10.96.255.254", 80, target_port=HTTP_PORT, type="NodePort",
            node_port=NODEPORT,
        )  # fmt: skip
        objs = [*filler(n - 1), svc, endpoint_slice("zz-measured", c.endpoints(WEB_A), HTTP_PORT)]
        agent = c.agent(NODE1)
        agent.set(*objs)
        with collector_paused():
            start = time.perf_counter()
            assert agent.sync(full=True), agent.last_error
            programmed = time.perf_counter() - start
            partial = []
            for k in range(5):  # one endpoint of one filler Service changes, five times
                agent.set(changed(n, k))
                start = time.perf_counter()
                assert agent.sync(full=False), agent.last_error
                partial.append(time.perf_counter() - start)
        spec = c.lab.spec
        node1, pod = spec.ip_of(NODE1), spec.ip_of(WEB_A)
        c.lab.add_route(EXTERNAL, spec.node(NODE1).pod_cidr, node1)
        argv = [sys.executable, "-c", PROBE, node1, str(NODEPORT), pod, str(HTTP_PORT)]
        out = c.lab.exec(EXTERNAL, [*argv, str(requests)], timeout=600)
        result: dict[str, float] = json.loads(out.stdout)
        result["program_s"] = programmed
        result["partial_ms"] = statistics.median(partial) * 1000
        # The floor again, in blocks, with node1's tables and without any (no conntrack).
        floors: dict[str, list[float]] = {"tables": [], "bare": []}
        pods = [pod, str(HTTP_PORT)] * 2
        block = [*argv[:3], *pods, str(max(requests // 6, 50))]
        for _ in range(3):
            for kind in ("tables", "bare"):
                if kind == "bare":
                    c.lab.exec(NODE1, ["nft", "flush", "ruleset"])
                out = c.lab.exec(EXTERNAL, block, timeout=600)
                floors[kind].append(json.loads(out.stdout)["entry_connect_median_us"])
            agent.backend.invalidate()
            assert agent.sync(full=True), agent.last_error
        result["floor_tables_us"] = statistics.median(floors["tables"])
        result["floor_bare_us"] = statistics.median(floors["bare"])
        return result


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--modes", default="ebpf")
    p.add_argument("--sizes", default="1,1000,10000")
    p.add_argument("--requests", type=int, default=2000, help="per target")
    p.add_argument("--rounds", type=int, default=1)
    args = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (network namespaces)")
    modes = [m for m in args.modes.split(",") if m in plugins.available()]
    for n in (int(s) for s in args.sizes.split(",")):
        for _ in range(args.rounds):
            for mode in modes:
                r = measure(mode, n, args.requests)
                load = os.getloadavg()[0]
                print(
                    f"{mode:>9} {n:>6} services | NodePort connect median"
                    f" {r['entry_connect_median_us']:6.1f} us p99 {r['entry_connect_p99_us']:6.1f}"
                    f" | floor {r['floor_connect_median_us']:6.1f} us"
                    f" p99 {r['floor_connect_p99_us']:6.1f} | HTTP request median"
                    f" {r['entry_request_median_us']:6.1f} us p99 {r['entry_request_p99_us']:6.1f}"
                    f" | floor {r['floor_request_median_us']:6.1f} us"
                    f" p99 {r['floor_request_p99_us']:6.1f} | programmed in"
                    f" {r['program_s']:.2f} s, one-endpoint partial sync {r['partial_ms']:.0f} ms"
                    f" | floor connect in blocks {r['floor_tables_us']:.1f} us, without any"
                    f" netfilter table {r['floor_bare_us']:.1f} us"
                    f" | load {load:.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
