"""Data path: TCP connect latency to one ClusterIP while the node holds N Services, a bulk
transfer through it, and the NAT entries conntrack holds for node-started connections.

For each size, one throw-away namespace lab per mode, all up at once (root): node1 programmed
with N Services x 10 endpoints (only the measured Service's endpoint is live: web-a, on node1).
Then, in rounds, each mode in turn (the first to go rotating), from the client pod (a process
of node1's cgroup, where the ebpf mode translates at the socket):
* C / R TCP connects to the measured ClusterIP, the connect call alone timed (median, p99 of
  all C: many short rounds, so that a burst of the machine's other work weighs on few);
* in the first T rounds, one transfer of B MB to a sink on web-a through the ClusterIP's
  second port (median MB/s);
and, at the end, the entries node1's conntrack holds, and those NATed, after these connections
and 100 more started on node1 itself. Turns spread the machine's load over every mode alike.
The measured Service sorts last, so in iptables mode its KUBE-SERVICES rule is the last one a
packet is matched against.

Usage: python bench/datapath_latency.py [--modes ebpf,nftables,iptables] [--sizes 1,1000,10000]
       [--connects 3000] [--rounds 20] [--bulk-mb 200] [--transfers 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

from kubeplex.core.daemon.proxier import collector_paused
from kubeplex.core.dataplane import plugins
from kubeplex.testing import labkernel
from kubeplex.testing.dataplane import DataplaneCluster, cluster, endpoint, endpoint_slice, service
from kubeplex.testing.netlab import CLIENT_POD, NODE1, NODE2, WEB_A

MEASURED_IP = "10.96.255.254"
BULK_PORT = 9000
#: Times count connects to ip:port (the connect call alone: the socket is made before) and
#: prints each, in microseconds.
PROBE = """
import json, socket, sys, time
ip, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
times = []
for _ in range(count):
    s = socket.socket()
    s.settimeout(2)
    t = time.perf_counter()
    s.connect((ip, port))
    times.append((time.perf_counter() - t) * 1e6)
    s.close()
print(json.dumps(times))
"""
#: Reads each connection to its end, then answers how many bytes it read.
SINK = """
import socket, sys, threading
srv = socket.create_server(("0.0.0.0", int(sys.argv[1])), backlog=16)
def drain(conn):
    total = 0
    with conn:
        while chunk := conn.recv(1 << 20):
            total += len(chunk)
        conn.sendall(str(total).encode())
print("ready", flush=True)
while True:
    threading.Thread(target=drain, args=(srv.accept()[0],), daemon=True).start()
"""
#: Sends megabytes to ip:port, and prints MB/s once the sink has counted them all.
BULK = """
import json, socket, sys, time
ip, port, mb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
chunk = b"x" * (1 << 20)
t = time.perf_counter()
s = socket.create_connection((ip, port), timeout=10)
for _ in range(mb):
    s.sendall(chunk)
s.shutdown(socket.SHUT_WR)
counted = int(s.recv(64))
seconds = time.perf_counter() - t
assert counted == mb << 20, counted
print(json.dumps({"mb_s": mb / seconds}))
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


def measured(c: DataplaneCluster) -> list[dict[str, Any]]:
    """The measured Service: port 80 to web-a's HTTP server, BULK_PORT to the sink."""
    svc = service("zz-measured", MEASURED_IP, 80, target_port=8080, port_name="http")
    bulk = {"name": "bulk", "port": BULK_PORT, "targetPort": BULK_PORT, "protocol": "TCP"}
    svc["spec"]["ports"].append(bulk)
    eps = endpoint_slice("zz-measured", c.endpoints(WEB_A), 8080, port_name="http")
    eps["ports"].append({"name": "bulk", "port": BULK_PORT, "protocol": "TCP"})
    return [svc, eps]


@contextmanager
def sink(c: DataplaneCluster) -> Iterator[None]:
    """The bulk sink, listening on web-a's BULK_PORT (in its node's cgroup, as the pod's
    server)."""
    argv = ["ip", "netns", "exec", c.lab.namespace_of(WEB_A)]
    argv += [sys.executable, "-c", SINK, str(BULK_PORT)]
    proc = subprocess.Popen(
        labkernel.in_cgroup(c.lab.cgroup_of(WEB_A), argv), stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield
    finally:
        proc.kill()
        proc.wait()


def conntrack_entries(c: DataplaneCluster, node: str) -> tuple[int, int]:
    """(entries, NATed entries) of the node's IPv4 conntrack table: an entry is NATed when
    its reply tuple is not its original one reversed."""
    out = c.lab.exec(node, ["conntrack", "-L", "-f", "ipv4"], check=False).stdout
    total = nated = 0
    for line in out.splitlines():
        values: dict[str, list[str]] = {}
        for word in line.split():
            key, eq, value = word.partition("=")
            if eq:
                values.setdefault(key, []).append(value)
        if len(values.get("src", [])) < 2:
            continue
        total += 1
        orig = [values[k][0] for k in ("src", "dst", "sport", "dport") if k in values]
        reply = [values[k][1] for k in ("dst", "src", "dport", "sport") if k in values]
        nated += orig != reply
    return total, nated


@dataclass
class Run:
    """One mode's lab, programmed with the size's Services, and what was measured in it."""

    mode: str
    dataplane: DataplaneCluster
    program_s: float
    connects_us: list[float] = field(default_factory=list)
    bulk_mb_s: list[float] = field(default_factory=list)
    conntrack: tuple[int, int] = (0, 0)

    def probe(self, connects: int, bulk_mb: int) -> None:
        py = sys.executable
        out = self.dataplane.lab.exec(
            CLIENT_POD, [py, "-c", PROBE, MEASURED_IP, "80", str(connects)]
        )
        self.connects_us += json.loads(out.stdout)
        if bulk_mb:
            argv = [py, "-c", BULK, MEASURED_IP, str(BULK_PORT), str(bulk_mb)]
            out = self.dataplane.lab.exec(CLIENT_POD, argv)
            self.bulk_mb_s.append(json.loads(out.stdout)["mb_s"])

    def report(self, n: int) -> str:
        times = sorted(self.connects_us)
        total, nated = self.conntrack
        return (
            f"{self.mode:>9} {n:>6} services | connect median {statistics.median(times):6.1f} us"
            f" p99 {times[int(len(times) * 0.99)]:7.1f} us ({len(times)})"
            f" | bulk {statistics.median(self.bulk_mb_s):5.0f} MB/s"
            f" ({min(self.bulk_mb_s):.0f}-{max(self.bulk_mb_s):.0f})"
            f" | node1 conntrack {total:>5} entries, {nated:>5} NAT"
            f" | programmed in {self.program_s:.2f} s"
        )


def programmed(stack: ExitStack, mode: str, n: int) -> Run:
    """A lab in ``mode`` whose node1 holds n Services (the measured one last), with the sink."""
    c = stack.enter_context(cluster(mode))
    stack.enter_context(sink(c))
    agent = c.agent(NODE1)
    agent.set(*filler(n - 1), *measured(c))
    with collector_paused():
        start = time.perf_counter()
        assert agent.sync(full=True), agent.last_error
    return Run(mode, c, time.perf_counter() - start)


def measure(
    modes: list[str], n: int, connects: int, rounds: int, bulk_mb: int, transfers: int
) -> list[Run]:
    """Every mode's lab up at once, probed in turns (the first to go rotating each round), so
    that the machine's load weighs on every mode alike."""
    with ExitStack() as stack:
        runs = [programmed(stack, mode, n) for mode in modes]
        for r in range(rounds):
            for run in runs[r % len(runs) :] + runs[: r % len(runs)]:
                run.probe(connects // rounds, bulk_mb if r < transfers else 0)
        for run in runs:
            # Connections started on node1 itself (its host network), besides its pod's.
            run.dataplane.lab.exec(NODE1, [sys.executable, "-c", PROBE, MEASURED_IP, "80", "100"])
            run.conntrack = conntrack_entries(run.dataplane, NODE1)
        return runs


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--modes", default="ebpf,nftables,iptables")
    p.add_argument("--sizes", default="1,1000,10000")
    p.add_argument("--connects", type=int, default=3000, help="per mode and size")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--bulk-mb", type=int, default=200, help="per transfer")
    p.add_argument("--transfers", type=int, default=5, help="one in each of the first rounds")
    args = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (network namespaces)")
    wanted = args.modes.split(",")
    modes = [m for m in wanted if m in plugins.available()]
    if len(modes) < len(wanted):
        print(f"not installed: {', '.join(m for m in wanted if m not in modes)}", flush=True)
    for n in (int(s) for s in args.sizes.split(",")):
        runs = measure(modes, n, args.connects, args.rounds, args.bulk_mb, args.transfers)
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"-- {n} services, load average after: {load}", flush=True)
        for run in runs:
            print(run.report(n), flush=True)


if __name__ == "__main__":
    main()
