"""Steady traffic for mode-switch tests, and what it saw.

Run inside a lab namespace as a script (standard library only)::

    python tests/kits/migration_kit.py --http 10.96.88.59:80 --udp 10.96.0.53:53 --stop FILE

until FILE exists: a new TCP connection (HTTP GET) to every ``--http`` target every
``--interval`` seconds; ``--long`` long-lived TCP connections per target, each a request
whose header line grows by one byte every 100 ms (the pod answers once it ends, so the
connection lives as long as the run); one long-lived UDP flow per ``--udp`` target (one
source port, an exchange every ``--interval``), and one unconnected UDP socket per
``--udp-unconnected`` target (sendto and recvfrom, the reply's source address kept: the
Service's, as the client sent to). Prints one JSON document: every attempt with its monotonic
start time (CLOCK_MONOTONIC is the machine's, the same in every namespace); each long-lived
connection's peer (getpeername) when it opened and before it ended.

The test side (``Figures``) reads it per step of the switch: failed new connections, the
longest gap between successful ones, broken long-lived connections (and those that had to
retransmit: stalled, then recovered), lost UDP exchanges.
"""

from __future__ import annotations

import argparse
import itertools
import json
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# --- the generator (runs in the namespace) ------------------------------------------------------


def _get(ip: str, port: int, timeout: float) -> str:
    with socket.create_connection((ip, port), timeout=timeout) as s:
        s.sendall(b"GET /hostname HTTP/1.0\r\n\r\n")
        return _response(s)


def _address(peer: Any) -> str:
    return f"{peer[0]}:{peer[1]}"


def _response(s: socket.socket) -> str:
    data = b""
    while chunk := s.recv(4096):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.0 200"):
        raise OSError(f"bad response {head[:40]!r}")
    return body.decode()


def _new_connections(target: str, interval: float, stop: threading.Event, out: list[Any]) -> None:
    ip, port = target.rsplit(":", 1)
    while not stop.is_set():
        start = time.monotonic()
        try:
            out.append([start, _get(ip, int(port), 1.0)])
        except OSError as err:
            out.append([start, None, str(err)])
        stop.wait(max(0.0, start + interval - time.monotonic()))


def _retransmitted(s: socket.socket) -> int:
    """The connection's retransmitted segments so far (struct tcp_info's tcpi_total_retrans,
    at byte 100): a segment lost on the way, as when a NAT binding stops being applied."""
    info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    return int.from_bytes(info[100:104], sys.byteorder)


def _long_tcp(target: str, stop: threading.Event, out: dict[str, Any]) -> None:
    ip, port = target.rsplit(":", 1)
    out.update(target=target, opened=time.monotonic(), broken=None, pod=None, stalled=None)
    try:
        s = socket.create_connection((ip, int(port)), timeout=2.0)
        out["peer"] = _address(s.getpeername())
        s.sendall(b"GET /hostname HTTP/1.0\r\nX-Keep: ")
    except OSError as err:
        out["broken"] = [time.monotonic(), f"open: {err}"]
        return
    with s:
        while not stop.wait(0.1):
            try:
                s.sendall(b"a")
                if out["stalled"] is None and _retransmitted(s):
                    out["stalled"] = time.monotonic()  # TCP recovers what a short stall lost
            except OSError as err:
                out["broken"] = [time.monotonic(), f"send: {err}"]
                return
        try:
            out["peer_end"] = _address(s.getpeername())
            s.settimeout(3.0)
            s.sendall(b"\r\n\r\n")
            out["pod"] = _response(s)
        except OSError as err:
            out["broken"] = [time.monotonic(), f"end: {err}"]


def _udp_flow(target: str, interval: float, stop: threading.Event, out: list[Any]) -> None:
    ip, port = target.rsplit(":", 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(0.5)
        s.connect((ip, int(port)))  # one source port: one conntrack flow for the whole run
        while not stop.is_set():
            start = time.monotonic()
            try:
                s.send(b"hostname")
                out.append([start, s.recv(512).decode()])
            except OSError as err:
                out.append([start, None, str(err)])
            stop.wait(max(0.0, start + interval - time.monotonic()))


def _unconnected_udp(target: str, interval: float, stop: threading.Event, out: list[Any]) -> None:
    ip, port = target.rsplit(":", 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(0.5)
        while not stop.is_set():
            start = time.monotonic()
            try:
                s.sendto(b"hostname", (ip, int(port)))
                data, peer = s.recvfrom(512)
                out.append([start, data.decode(), _address(peer)])
            except OSError as err:
                out.append([start, None, str(err)])
            stop.wait(max(0.0, start + interval - time.monotonic()))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--http", action="append", default=[])
    p.add_argument("--udp", action="append", default=[])
    p.add_argument("--udp-unconnected", action="append", default=[])
    p.add_argument("--long", type=int, default=2)
    p.add_argument("--interval", type=float, default=0.02)
    p.add_argument("--stop", type=Path, required=True)
    p.add_argument("--ready", type=Path)
    args = p.parse_args(argv)
    stop = threading.Event()
    new: dict[str, list[Any]] = {t: [] for t in args.http}
    udp: dict[str, list[Any]] = {t: [] for t in args.udp}
    unconnected: dict[str, list[Any]] = {t: [] for t in args.udp_unconnected}
    long: list[dict[str, Any]] = [{} for _ in args.http for _ in range(args.long)]
    threads = [
        threading.Thread(target=_new_connections, args=(t, args.interval, stop, new[t]))
        for t in args.http
    ]
    threads += [
        threading.Thread(target=_long_tcp, args=(t, stop, long[i * args.long + j]))
        for i, t in enumerate(args.http)
        for j in range(args.long)
    ]
    threads += [
        threading.Thread(target=_udp_flow, args=(t, args.interval, stop, udp[t])) for t in args.udp
    ]
    threads += [
        threading.Thread(target=_unconnected_udp, args=(t, args.interval, stop, unconnected[t]))
        for t in args.udp_unconnected
    ]
    for t in threads:
        t.start()
    if args.ready:
        args.ready.write_text("ready")
    while not args.stop.exists():
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join()
    doc = {"new": new, "long": long, "udp": udp, "unconnected": unconnected}
    json.dump(doc, sys.stdout)
    return 0


# --- the test side --------------------------------------------------------------------------------

KIT = Path(__file__).resolve()
#: How long the traffic runs steadily after each step before the next one.
SETTLE = 1.5
CLUSTER_IP = "10.96.88.59:80"
NODE_PORT = "172.18.0.5:30080"
UDP_SERVICE = "10.96.0.53:53"
#: A UDP Service on the web pods' echo port, beside the lab's two HTTP Services.
UDP_MANIFESTS = """
apiVersion: v1
kind: Service
metadata: {name: echo, namespace: default}
spec:
  type: ClusterIP
  clusterIP: 10.96.0.53
  clusterIPs: [10.96.0.53]
  ports: [{name: dns, port: 53, protocol: UDP, targetPort: 8081}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: echo-1
  namespace: default
  labels: {kubernetes.io/service-name: echo}
addressType: IPv4
ports: [{name: dns, port: 8081, protocol: UDP}]
endpoints:
- addresses: [10.244.1.2]
  conditions: {ready: true}
  nodeName: kind-worker
- addresses: [10.244.2.2]
  conditions: {ready: true}
  nodeName: kind-worker2
"""


def lab_manifests(tmp: Path) -> Path:
    """The lab's manifests and the UDP Service, in a folder under ``tmp``."""
    from kits.cli_kit import LAB

    folder = tmp / "manifests"
    folder.mkdir()
    for f in (LAB / "manifests").iterdir():
        (folder / f.name).write_text(f.read_text())
    (folder / "echo.yaml").write_text(UDP_MANIFESTS)
    return folder


class Traffic:
    """The generators in the client pod (in its node's cgroup, as the pod's processes) and the
    external host, until stopped. ``external=False`` leaves the external host out;
    ``unconnected`` adds an unconnected UDP socket to the UDP Service."""

    def __init__(
        self,
        lab: Any,
        tmp: Path,
        udp: bool = True,
        external: bool = True,
        unconnected: bool = False,
    ) -> None:
        from kits.cli_kit import wait_until
        from kubeplex.testing import labkernel
        from kubeplex.testing.netlab import CLIENT_POD, EXTERNAL

        self.stop_file = tmp / "stop"
        self.procs: list[subprocess.Popen[str]] = []
        client = ["--http", CLUSTER_IP, *(["--udp", UDP_SERVICE] if udp else [])]
        client += ["--udp-unconnected", UDP_SERVICE] if unconnected else []
        sources = [(CLIENT_POD, client)] + ([(EXTERNAL, ["--http", NODE_PORT])] if external else [])
        for ns, args in sources:
            ready = tmp / f"ready-{ns}"
            cmd = ["ip", "netns", "exec", lab.namespace_of(ns), sys.executable, str(KIT)]
            cmd += [*args, "--stop", str(self.stop_file), "--ready", str(ready)]
            cmd = labkernel.in_cgroup(lab.cgroup_of(ns), cmd)
            self.procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
            wait_until(ready.exists, what=f"traffic from {ns}")

    def stop(self) -> dict[str, Any]:
        """Stop every generator; what they saw, merged."""
        self.stop_file.write_text("stop")
        seen: dict[str, Any] = {"new": {}, "long": [], "udp": {}, "unconnected": {}}
        for proc in self.procs:
            out, _ = proc.communicate(timeout=15)
            doc = json.loads(out)
            seen["new"].update(doc["new"])
            seen["long"] += doc["long"]
            seen["udp"].update(doc["udp"])
            seen["unconnected"].update(doc["unconnected"])
        return seen

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@dataclass
class StepFigures:
    """What the traffic saw during one step (from its start to the next step's)."""

    step: str
    new_failed: int = 0
    new_total: int = 0
    #: The longest time without a successful new connection to one target, in ms.
    longest_gap_ms: float = 0.0
    long_broken: int = 0
    #: Long-lived connections that first had to retransmit in this step (TCP hides a stall).
    long_stalled: int = 0
    udp_lost: int = 0
    #: UDP replies from another pod than the flow's first: its NAT was lost.
    udp_moved: int = 0
    #: Unconnected UDP replies whose source was not the Service the datagram was sent to.
    udp_wrong_source: int = 0
    leftovers: list[str] = field(default_factory=list)

    def row(self) -> str:
        return (
            f"{self.step:<34} new {self.new_failed:>3}/{self.new_total:<4} failed  "
            f"gap {self.longest_gap_ms:>6.1f} ms  long broken {self.long_broken} "
            f"stalled {self.long_stalled}  "
            f"udp lost {self.udp_lost} moved {self.udp_moved} "
            f"wrong source {self.udp_wrong_source}  leftovers {len(self.leftovers)}"
        )


def figures(seen: dict[str, Any], steps: list[tuple[str, float, float]]) -> list[StepFigures]:
    """Per step (name, start, end): the traffic's figures."""
    out = []
    for name, start, end in steps:
        f = StepFigures(name)
        for attempts in seen["new"].values():
            inside = [a for a in attempts if start <= a[0] < end]
            f.new_total += len(inside)
            f.new_failed += sum(1 for a in inside if a[1] is None)
            ok = [start] + [a[0] for a in inside if a[1] is not None] + [end]
            f.longest_gap_ms = max(
                f.longest_gap_ms, max(b - a for a, b in itertools.pairwise(ok)) * 1000
            )
        for flow in seen["long"]:
            broken = flow.get("broken")
            if broken and start <= broken[0] < end:
                f.long_broken += 1
            stalled = flow.get("stalled")
            if stalled is not None and start <= stalled < end:
                f.long_stalled += 1
        for exchanges in seen["udp"].values():
            first = next((e[1] for e in exchanges if e[1] is not None), None)
            inside = [e for e in exchanges if start <= e[0] < end]
            f.udp_lost += sum(1 for e in inside if e[1] is None)
            f.udp_moved += sum(1 for e in inside if e[1] is not None and e[1] != first)
        for target, exchanges in seen.get("unconnected", {}).items():
            inside = [e for e in exchanges if start <= e[0] < end]
            f.udp_lost += sum(1 for e in inside if e[1] is None)
            f.udp_wrong_source += sum(1 for e in inside if e[1] is not None and e[2] != target)
        out.append(f)
    return out


if __name__ == "__main__":
    raise SystemExit(main())
