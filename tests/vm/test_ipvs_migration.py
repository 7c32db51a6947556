"""A live switch through the ipvs mode under load (runs in the test VM; skipped without IPVS).

The lab's node goes iptables -> ipvs -> nftables with ``kubeplex migrate --to`` while the
traffic of tests/kits/migration_kit.py runs: new TCP connections to a ClusterIP (from a pod) and a
NodePort (from a host outside), long-lived TCP connections and a long-lived UDP flow opened
in the iptables mode, and long-lived TCP connections opened once the node is in ipvs mode
(IPVS itself forwards those: they meet the switch away from it). Per step: failed new
connections, broken long-lived ones, the longest gap, and what the other modes left. A
foreign IPVS virtual service, a foreign ipset and foreign iptables rules are held through
every step and through ``kubeplex cleanup`` at the end, which leaves nothing of kubeplex.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from kits.cli_kit import LAB, in_netns, kubeplex, wait_until
from kits.migration_kit import (
    CLUSTER_IP,
    KIT,
    NODE_PORT,
    SETTLE,
    UDP_SERVICE,
    StepFigures,
    Traffic,
    figures,
    lab_manifests,
)

from kubeplex.core.config.kubeproxy import load_config, with_overrides
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import BackendContext
from kubeplex.testing.netlab import CLIENT_POD, EXTERNAL, NODE1, Lab

MODES = ("iptables", "ipvs", "nftables")
#: Another load balancer's virtual service on an address of its own, with a real server.
FOREIGN_VS = "192.0.2.200:8080"
FOREIGN_SET = "foreign-allow"
FOREIGN_IPTABLES = """*filter
:FOREIGN-FW - [0:0]
-A INPUT -s 192.0.2.99/32 -m comment --comment "foreign guard" -j FOREIGN-FW
-A FOREIGN-FW -j DROP
COMMIT
*nat
:FOREIGN-NAT - [0:0]
-A PREROUTING -d 192.0.2.98/32 -j FOREIGN-NAT
-A FOREIGN-NAT -j RETURN
COMMIT
"""


@pytest.fixture
def manifests(tmp_path: Path) -> Path:
    return lab_manifests(tmp_path)


def backend_of(netns: str, mode: str) -> Any:
    cfg = with_overrides(
        load_config(LAB / "config.yaml"), mode=mode, known_modes=plugins.known_modes()
    )
    return plugins.load_backend(mode, BackendContext(config=cfg, node_name=NODE1, netns=netns))


def drained(migrate_stdout: str) -> set[str]:
    """What ``kubeplex migrate`` left draining, in the words of ``leftovers``."""
    out = set()
    for line in migrate_stdout.splitlines():
        _, sep, what = line.partition(": draining ")
        if sep:
            out.add(re.sub(r" \(\d+ active connections\)$", "", what))
    return out


def active_connections(netns: str) -> int:
    """Established connections IPVS counts in ``netns`` (``ipvsadm -Ln``'s ActiveConn)."""
    total = 0
    for line in in_netns(netns, "ipvsadm", "-Ln").splitlines():
        parts = line.split()
        if parts and parts[0] == "->" and len(parts) >= 6 and parts[4].isdigit():
            total += int(parts[4])
    return total


def leftovers(netns: str, active: str) -> dict[str, list[str]]:
    """What each other mode has on the node, but what it shares with the active mode."""
    mine = set(backend_of(netns, active).leftovers())
    assert mine, f"{active} is not programmed"
    return {
        m: [x for x in backend_of(netns, m).leftovers() if x not in mine]
        for m in MODES
        if m != active
    }


def add_foreign(netns: str) -> None:
    in_netns(netns, "ipvsadm", "-A", "-t", FOREIGN_VS, "-s", "wlc")
    in_netns(netns, "ipvsadm", "-a", "-t", FOREIGN_VS, "-r", "10.244.1.2:8080", "-m", "-w", "3")
    in_netns(netns, "ipset", "create", FOREIGN_SET, "hash:ip")
    in_netns(netns, "ipset", "add", FOREIGN_SET, "192.0.2.99")
    subprocess.run(
        ["ip", "netns", "exec", netns, "iptables-restore", "--noflush"],
        input=FOREIGN_IPTABLES, text=True, check=True,
    )  # fmt: skip


def foreign(netns: str) -> dict[str, Any]:
    """The foreign objects as the kernel's tools print them."""
    rules = sorted(
        line
        for line in in_netns(netns, "iptables-save").splitlines()
        if "FOREIGN" in line and not line.startswith("#")
    )
    return {
        "ipvs": in_netns(netns, "ipvsadm", "-Ln", "-t", FOREIGN_VS),
        "ipset": in_netns(netns, "ipset", "list", FOREIGN_SET),
        "iptables": [r.split(" [")[0] for r in rules],
    }


#: The guest runs Python many times slower on one vCPU: the kit's traffic, scaled
#: down from a new connection every 20 ms to one every 100 ms per target, one long-lived TCP
#: connection per target (the guest's scheduler, not the switch, made gaps at full rate).
INTERVAL = "0.1"


class GuestTraffic(Traffic):
    """The kit's generators (a pod to the ClusterIP and the UDP Service, a host outside to
    the NodePort), at the guest's rate."""

    def __init__(self, lab: Lab, tmp: Path) -> None:
        self.stop_file = tmp / "stop"
        self.procs: list[subprocess.Popen[str]] = []
        for ns, args in (
            (CLIENT_POD, ["--http", CLUSTER_IP, "--udp", UDP_SERVICE]),
            (EXTERNAL, ["--http", NODE_PORT]),
        ):
            ready = tmp / f"ready-{ns}"
            cmd = ["ip", "netns", "exec", lab.namespace_of(ns), sys.executable, str(KIT)]
            cmd += [*args, "--interval", INTERVAL, "--long", "1"]
            cmd += ["--stop", str(self.stop_file), "--ready", str(ready)]
            self.procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
            wait_until(ready.exists, what=f"traffic from {ns}", timeout=60)


class LongLived:
    """Long-lived TCP connections to the ClusterIP opened now (the kit, with new connections
    once a second only), until stopped."""

    def __init__(self, lab: Lab, tmp: Path) -> None:
        self.stop_file = tmp / "stop-late"
        ready = tmp / "ready-late"
        cmd = ["ip", "netns", "exec", lab.namespace_of(CLIENT_POD), sys.executable, str(KIT)]
        cmd += ["--http", CLUSTER_IP, "--long", "2", "--interval", "1.0"]
        cmd += ["--stop", str(self.stop_file), "--ready", str(ready)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        wait_until(ready.exists, what="the late long-lived connections", timeout=60)

    def stop(self) -> list[dict[str, Any]]:
        self.stop_file.write_text("stop")
        out, _ = self.proc.communicate(timeout=60)
        return list(json.loads(out)["long"])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def test_live_switch_through_ipvs_under_load(netlab: Lab, manifests: Path, tmp_path: Path) -> None:
    node = netlab.namespace_of(NODE1)
    add_foreign(node)
    held = foreign(node)
    base = ("--config", str(LAB / "config.yaml"), "--netns", node, "--manifests", str(manifests))
    first = kubeplex("run", *base, "--once", timeout=600)
    assert first.returncode == 0, first.stderr
    started = time.monotonic()
    traffic = GuestTraffic(netlab, tmp_path)
    late: LongLived | None = None
    steps: list[tuple[str, float, float]] = []
    left: dict[str, dict[str, list[str]]] = {}
    switch_ms: dict[str, str] = {}
    draining: dict[str, set[str]] = {}
    try:
        time.sleep(SETTLE)
        for to in ("ipvs", "nftables"):
            name = f"migrate --to {to}"
            t0 = time.monotonic()
            proc = kubeplex("migrate", "--to", to, *base, timeout=600)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            assert f"{to}: programmed" in proc.stdout, proc.stdout
            switch_ms[name] = proc.stdout.splitlines()[0]
            draining[name] = drained(proc.stdout)
            time.sleep(SETTLE)
            left[name] = {
                m: [x for x in xs if x not in draining[name]]
                for m, xs in leftovers(node, to).items()
            }
            assert foreign(node) == held, name
            steps.append((name, t0, time.monotonic()))
            if to == "ipvs":
                late = LongLived(netlab, tmp_path)
                time.sleep(SETTLE)
    finally:
        seen = traffic.stop() if all(p.poll() is None for p in traffic.procs) else None
        traffic.kill()
        late_flows = late.stop() if late is not None and late.proc.poll() is None else None
        if late is not None:
            late.kill()
    assert seen is not None and late_flows is not None
    rows = figures(seen, steps)
    for row in rows:
        row.leftovers = [f"{m}: {x}" for m, xs in left[row.step].items() for x in xs]
    broken_late = [f for f in late_flows if f["broken"] is not None or not f["pod"]]
    # The connections ipvs forwarded kept its virtual services draining; they are closed now,
    # and the next switch cleanup (a restart, another migrate) removes what drained. IPVS
    # counts a connection whose end it did not see as active until its own timeout (900 s):
    # what it still counts so may drain on, and nothing else may be left.
    assert draining["migrate --to nftables"], "nothing drained: the late flows were idle?"
    deadline = time.monotonic() + 30
    while active_connections(node) and time.monotonic() < deadline:
        time.sleep(1)
    again = kubeplex("migrate", "--to", "nftables", *base, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    still = drained(again.stdout)
    assert still <= draining["migrate --to nftables"], again.stdout
    assert bool(still) == bool(active_connections(node)), (again.stdout, active_connections(node))
    rest = {m: [x for x in xs if x not in still] for m, xs in leftovers(node, "nftables").items()}
    assert all(not xs for xs in rest.values()), rest

    # The end: every mode cleaned up, the foreign objects still there.
    cleanup = kubeplex("cleanup", "--config", str(LAB / "config.yaml"), "--netns", node)
    assert cleanup.returncode == 0, cleanup.stdout + cleanup.stderr
    after = {
        "link": subprocess.run(
            ["ip", "netns", "exec", node, "ip", "link", "show", "kube-ipvs0"], capture_output=True
        ).returncode,
        "sets": [s for s in in_netns(node, "ipset", "list", "-n").split() if s.startswith("KUBE-")],
        "virtual": [
            line.split()[1]
            for line in in_netns(node, "ipvsadm", "-Ln").splitlines()
            if line.startswith(("TCP", "UDP", "SCTP"))
        ],
        "iptables": [x for x in in_netns(node, "iptables-save").splitlines() if "KUBE-" in x],
        "nft": "kube-proxy" in in_netns(node, "nft", "list", "tables"),
    }
    report(rows, steps, late_flows, switch_ms, cleanup.stdout, time.monotonic() - started)
    assert after == {"link": 1, "sets": [], "virtual": [FOREIGN_VS], "iptables": [], "nft": False}
    assert foreign(node) == held
    assert all(not r.leftovers for r in rows), [(r.step, r.leftovers[:5]) for r in rows]
    assert all(r.long_broken == 0 for r in rows), [r.row() for r in rows]
    assert all(f["broken"] is None and f["pod"] for f in seen["long"]), seen["long"]
    assert all(r.udp_moved == 0 for r in rows)
    # A connection ipvs itself forwards (its own connection table and NAT, not conntrack's)
    # lives on through the switch away from it: its virtual service drained.
    assert broken_late == [], broken_late
    assert sum(r.new_total for r in rows) > 0


def report(
    rows: list[StepFigures],
    steps: list[tuple[str, float, float]],
    late: list[dict[str, Any]],
    switch: dict[str, str],
    cleanup: str,
    seconds: float,
) -> None:
    lines = [f"live switch through ipvs under load, in the VM ({seconds:.1f} s of traffic):"]
    lines += ["  " + r.row() for r in rows]
    lines += [f"  {step}: {line}" for step, line in switch.items()]
    opened = len(late)
    broken = sum(1 for f in late if f["broken"] is not None or not f["pod"])
    lines.append(
        f"  long-lived TCP opened in ipvs mode: {broken}/{opened} broken through the switch away"
    )
    for f in late:
        if f["broken"] is not None:
            at, why = f["broken"]
            during = next((n for n, t0, t1 in steps if t0 <= at < t1), "after the last step")
            lines.append(f"    {why} ({during})")
    lines.append("  kubeplex cleanup at the end:")
    lines += [
        f"    {line}" for line in cleanup.splitlines() if "nothing" in line or "removed" in line
    ][:8]
    text = "\n".join(lines)
    print(text)
    out = os.environ.get("KUBEPLEX_MIGRATION_FIGURES")
    if out:
        Path(out).write_text(text + "\n")
