"""Switching a namespace node into the ebpf mode and out of it with ``kubeplex migrate --to``,
under steady traffic from a pod of the node (run in the node's cgroup, as the lab runs its pod
processes) and, where the mode serves them, from a host outside to the NodePort: new TCP
connections every 20 ms, long-lived TCP connections, a connected and an unconnected UDP flow.
Per step: failed new connections, broken long-lived connections and those that stalled (had to
retransmit), lost UDP exchanges, unconnected replies from another address than the Service's,
and what of the old mode is left (its own ``leftovers()``, its nftables tables, its pins and
its programs on the node's cgroup); printed with the switch's times."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kits.cli_kit import LAB, free_port, kubeplex, wait_until
from kits.ebpf_kit import missing as ebpf_missing
from kits.migration_kit import SETTLE, StepFigures, Traffic, figures, lab_manifests

from kubeplex.backends.ebpf.drain import DRAIN_SECONDS, REVERSE_MAPS, REVERSE_PROGRAMS
from kubeplex.backends.ebpf.layout import PIN_FOLDER, PROGRAM_PREFIX
from kubeplex.backends.ebpf.loader import DRAINING
from kubeplex.core.config.kubeproxy import load_config, with_overrides
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import BackendContext
from kubeplex.testing.netlab import NODE1, Lab

pytestmark = pytest.mark.kernel

EBPF = "ebpf"


@dataclass(frozen=True)
class Node:
    """The lab's first node, as the commands and the test's own reading see it."""

    lab: Lab
    netns: str
    cgroup: Path
    bpffs: Path
    trust: Path
    manifests: Path

    def context(self, mode: str) -> BackendContext:
        cfg = with_overrides(
            load_config(LAB / "config.yaml"), mode=mode, known_modes=plugins.known_modes()
        )
        return BackendContext(
            config=cfg, node_name=NODE1, netns=self.netns, cgroup=self.cgroup, bpffs=self.bpffs
        )

    def args(self) -> tuple[str, ...]:
        return (
            "--plugins",
            str(self.trust),
            "--config",
            str(LAB / "config.yaml"),
            "--netns",
            self.netns,
            "--manifests",
            str(self.manifests),
        )


def trust_list(folder: Path, cgroup: Path, bpffs: Path) -> Path:
    """The packaged trust list with the ebpf mode's options set to the node's cgroup and bpffs
    (what an operator writes in /etc/kubeplex/plugins.toml)."""
    text = Path(plugins.packaged_trust_file()).read_text()
    if "[backends.ebpf]" not in text:
        pytest.skip("the ebpf mode is not in the packaged trust list")
    options = f'[backends.ebpf.options]\ncgroup = "{cgroup}"\nbpffs = "{bpffs}"\n'
    path = folder / "plugins.toml"
    path.write_text(f"{text.rstrip()}\n\n{options}")
    path.chmod(0o644)
    return path


@pytest.fixture
def node(netlab: Lab, tmp_path: Path) -> Iterator[Node]:
    reason = ebpf_missing() or netlab.no_cgroups or netlab.no_bpffs
    cgroup, bpffs = netlab.cgroup_of(NODE1), netlab.bpffs_of(NODE1)
    if reason or cgroup is None or bpffs is None:
        pytest.skip(reason or "the lab has no node cgroup or bpffs")
    found = Node(
        netlab,
        netlab.namespace_of(NODE1),
        cgroup,
        bpffs,
        trust_list(tmp_path, cgroup, bpffs),
        lab_manifests(tmp_path),
    )
    try:
        yield found
    finally:
        done = kubeplex("cleanup", *found.args()[:6])
        assert done.returncode == 0, done.stdout + done.stderr


def left_of(node: Node, mode: str) -> list[str]:
    """What of ``mode`` is on the node: its backend's own reading, the programs attached to
    the node's cgroup (ebpf) and the mode's nftables tables, read by the tools themselves."""
    found = list(plugins.load_backend(mode, node.context(mode)).leftovers())
    if mode == EBPF:
        shown = subprocess.run(
            ["bpftool", "-j", "cgroup", "show", str(node.cgroup)],
            capture_output=True,
            text=True,
            check=True,
        )
        found += [f"attached {p['name']}" for p in json.loads(shown.stdout.strip() or "[]")]
    # Each mode's own nftables tables (the ebpf mode's entry points for outside traffic).
    own = {"nftables": "kube-proxy", EBPF: "kubeplex-ebpf"}.get(mode)
    if own:
        tables = subprocess.run(
            ["ip", "netns", "exec", node.netns, "nft", "list", "tables"],
            capture_output=True,
            text=True,
            check=True,
        )
        found += [line for line in tables.stdout.splitlines() if line.split()[-1:] == [own]]
    return found


@dataclass
class Switch:
    """One ``migrate --to``: the target's full sync and the command's whole run, in ms; what
    the other modes' cleanup removed and left draining."""

    step: str
    sync_ms: float
    command_ms: float
    removed: list[str]
    draining: list[str]


def migrate(node: Node, to: str) -> Switch:
    start = time.monotonic()
    done = kubeplex("migrate", "--to", to, "-o", "json", *node.args())
    elapsed = (time.monotonic() - start) * 1000
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["programmed"] and not doc["services_failed"], doc
    assert not any(m["error"] for m in doc["modes"]), doc["modes"]
    removed = [line for m in doc["modes"] for line in m["removed"]]
    draining = [line for m in doc["modes"] for line in m["draining"]]
    return Switch(f"migrate --to {to}", doc["sync_ms"], elapsed, removed, draining)


def not_draining(left: list[str]) -> list[str]:
    """Of what the ebpf mode left after a switch, what is not its draining reverse path (the
    recvmsg and getpeername programs, their pinned links and the maps they read)."""
    shown = {f"attached {PROGRAM_PREFIX}{p}" for p in REVERSE_PROGRAMS}
    pins = {*(f"links/{p}" for p in REVERSE_PROGRAMS), *REVERSE_MAPS}
    return [
        line
        for line in left
        if line not in shown and not any(line.endswith(f"/{PIN_FOLDER}/{pin}") for pin in pins)
    ]


def no_harm(rows: list[StepFigures], seen: dict[str, Any]) -> None:
    """Nothing of the old mode left after any step, no new connection failed, no long-lived
    one broke or stalled, no UDP exchange was lost or answered from another address, and the
    long-lived connections made in ebpf mode still see the Service while its reverse path
    drains."""
    assert all(not r.leftovers for r in rows), [(r.step, r.leftovers[:5]) for r in rows]
    assert [r.new_failed for r in rows] == [0] * len(rows)
    assert all(r.new_total > 0 for r in rows)
    long = seen["long"]
    assert all(f["broken"] is None and f["pod"] for f in long), long
    assert [r.long_stalled for r in rows] == [0] * len(rows)
    assert [(r.udp_lost, r.udp_moved, r.udp_wrong_source) for r in rows] == [(0, 0, 0)] * len(rows)
    assert [f["peer"] for f in long] == [f["peer_end"] for f in long]


def without_nodeports(manifests: Path) -> None:
    """Only ClusterIP Services left: the ebpf mode then has no entry point for other hosts,
    and the established flows NATed by the old mode must keep their NAT all the same."""
    web = manifests / "web.yaml"
    docs = [d for d in yaml.safe_load_all(web.read_text()) if d]
    kept = [d for d in docs if not d["metadata"]["name"].startswith("web-nodeport")]
    assert len(kept) < len(docs)
    web.write_text(yaml.safe_dump_all(kept))


def drain_over(node: Node) -> None:
    """Moves the drain's start back by its whole time."""
    marker = node.bpffs / PIN_FOLDER / DRAINING
    assert marker.is_dir(), "the switch left no drain"
    past = time.time() - DRAIN_SECONDS - 1
    os.utime(marker, (past, past))


def end_the_drain(node: Node, mode: str) -> Switch:
    """The next switch cleanup once the drain's time is over: the reverse path goes too."""
    drain_over(node)
    return migrate(node, mode)


@pytest.mark.parametrize(
    ("start", "targets", "nodeports"),
    [
        ("nftables", [EBPF, "nftables"], True),
        ("iptables", [EBPF], True),
        (EBPF, ["nftables"], True),
        ("nftables", [EBPF], False),
        # Back while the reverse path still drains: the mode adopts it.
        (EBPF, ["nftables", EBPF], True),
    ],
    ids=[
        "nftables-ebpf-nftables",
        "iptables-ebpf",
        "ebpf-nftables",
        "clusterip-only",
        "ebpf-nftables-ebpf",
    ],
)
def test_migrate_into_and_out_of_ebpf_under_traffic(
    node: Node, tmp_path: Path, start: str, targets: list[str], nodeports: bool
) -> None:
    if not nodeports:
        without_nodeports(node.manifests)
    first = kubeplex("run", "--once", "--proxy-mode", start, *node.args())
    assert first.returncode == 0, first.stderr
    began = time.monotonic()
    traffic = Traffic(node.lab, tmp_path, external=nodeports, unconnected=True)
    steps: list[tuple[str, float, float]] = []
    switches: list[Switch] = []
    left: dict[str, list[str]] = {}
    try:
        time.sleep(SETTLE)
        mode = start
        for to in targets:
            t0 = time.monotonic()
            switch = migrate(node, to)
            switches.append(switch)
            time.sleep(SETTLE)
            found = left_of(node, mode)
            if mode == EBPF:
                # Everything but the reverse path went; the reverse path drains.
                assert switch.draining and set(switch.draining) <= set(found), found
                found = not_draining(found)
            else:
                assert not switch.draining, switch.draining
            left[switch.step] = found
            assert left_of(node, to), f"{switch.step}: {to} not programmed"
            steps.append((switch.step, t0, time.monotonic()))
            mode = to
    finally:
        seen = traffic.stop() if all(p.poll() is None for p in traffic.procs) else None
        traffic.kill()
    assert seen is not None
    rows = figures(seen, steps)
    for row in rows:
        row.leftovers = left[row.step]
    left_ebpf = EBPF in [start, *targets[:-1]] and targets[-1] != EBPF
    if targets[-1] == EBPF:  # back in the mode: no drain goes on (a later one starts anew)
        assert not (node.bpffs / PIN_FOLDER / DRAINING).exists()
    drained = end_the_drain(node, mode) if left_ebpf else None
    report(start, rows, switches, seen, time.monotonic() - began, nodeports, drained)
    no_harm(rows, seen)
    if drained is not None:
        assert set(drained.removed) >= set(switches[-1].draining) and not drained.draining
        assert left_of(node, EBPF) == []


def report(
    start: str,
    rows: list[StepFigures],
    switches: list[Switch],
    seen: dict[str, object],
    seconds: float,
    outside: bool,
    drained: Switch | None,
) -> None:
    long = seen["long"]
    assert isinstance(long, list)
    moved_peers = sum(1 for f in long if f.get("peer") != f.get("peer_end"))
    lines = [f"from {start}, under traffic ({seconds:.1f} s; NodePort from outside: {outside}):"]
    for row, switch in zip(rows, switches, strict=True):
        lines.append("  " + row.row())
        lines.append(
            f"  {'':<34} sync {switch.sync_ms:.1f} ms, command {switch.command_ms:.0f} ms, "
            f"{len(switch.removed)} removed, {len(switch.draining)} draining"
        )
    if drained is not None:
        lines.append(f"  drain over, next switch: {len(drained.removed)} removed")
    lines.append(f"  long-lived connections whose getpeername changed: {moved_peers}/{len(long)}")
    text = "\n".join(lines)
    print(text)
    out = os.environ.get("KUBEPLEX_EBPF_MIGRATION_FIGURES")
    if out:
        with Path(out).open("a") as f:
            f.write(text + "\n")


def start_daemon(node: Node, tmp: Path, mode: str) -> subprocess.Popen[str]:
    """``kubeplex run`` in ``mode`` on the node (what a restart with a new mode does), syncing
    every 2 s so that its recheck of a drain comes soon."""
    cfg = yaml.safe_load((LAB / "config.yaml").read_text())
    cfg.update(mode=mode, iptables={"syncPeriod": "2s"}, nftables={"syncPeriod": "2s"})
    cfg["healthzBindAddress"] = f"127.0.0.1:{free_port()}"
    cfg["metricsBindAddress"] = f"127.0.0.1:{free_port()}"
    config = tmp / f"config-{mode}.yaml"
    config.write_text(yaml.safe_dump(cfg))
    argv = [sys.executable, "-m", "kubeplex.core.cli.main", "run", "--plugins", str(node.trust)]
    argv += ["--config", str(config), "--netns", node.netns, "--manifests", str(node.manifests)]
    log = (tmp / f"daemon-{mode}.log").open("w")
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, text=True)


def stop_daemon(daemon: subprocess.Popen[str] | None) -> None:
    if daemon is not None and daemon.poll() is None:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=15) == 0


def test_daemon_restarts_into_and_out_of_ebpf_under_traffic(node: Node, tmp_path: Path) -> None:
    """nftables -> ebpf -> nftables by restarting the daemon with a new mode; the running
    daemon removes the drained reverse path itself once the drain's time is over."""
    first = kubeplex("run", "--once", "--proxy-mode", "nftables", *node.args())
    assert first.returncode == 0, first.stderr
    began = time.monotonic()
    traffic = Traffic(node.lab, tmp_path, unconnected=True)
    steps: list[tuple[str, float, float]] = []
    left: dict[str, list[str]] = {}
    daemon: subprocess.Popen[str] | None = None
    try:
        time.sleep(SETTLE)
        for mode, old in ((EBPF, "nftables"), ("nftables", EBPF)):
            name = f"daemon restart, mode {mode}"
            t0 = time.monotonic()
            stop_daemon(daemon)
            daemon = start_daemon(node, tmp_path, mode)
            wait_until(lambda o=old: not not_draining(left_of(node, o)), what=name)
            time.sleep(SETTLE)
            left[name] = not_draining(left_of(node, old))
            assert left_of(node, mode), f"{name}: {mode} not programmed"
            steps.append((name, t0, time.monotonic()))
        # The reverse path stays while it drains, and the daemon removes it after.
        assert left_of(node, EBPF)
        drain_over(node)
        wait_until(lambda: not left_of(node, EBPF), what="the end of the drain", timeout=30)
    finally:
        seen = traffic.stop() if all(p.poll() is None for p in traffic.procs) else None
        traffic.kill()
        stop_daemon(daemon)
    assert seen is not None
    rows = figures(seen, steps)
    for row in rows:
        row.leftovers = left[row.step]
    lines = [f"daemon restarts, under traffic ({time.monotonic() - began:.1f} s):"]
    text = "\n".join(lines + ["  " + r.row() for r in rows])
    print(text)
    no_harm(rows, seen)
