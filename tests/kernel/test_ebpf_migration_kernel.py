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
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from kits.cli_kit import LAB, kubeplex
from kits.ebpf_kit import missing as ebpf_missing
from kits.migration_kit import SETTLE, StepFigures, Traffic, figures, lab_manifests

from kubeplex.backends.ebpf.drain import DRAIN_SECONDS, REVERSE_PROGRAMS
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


def reverse_path(left: list[str], draining: list[str]) -> list[str]:
    """Of what the ebpf mode left after a switch, what is not its draining reverse path (the
    recvmsg and getpeername programs and the maps they read, which the switch listed)."""
    shown = {f"attached {PROGRAM_PREFIX}{p}" for p in REVERSE_PROGRAMS}
    return [line for line in left if line not in draining and line not in shown]


def without_nodeports(manifests: Path) -> None:
    """Only ClusterIP Services left: the ebpf mode then has no entry point for other hosts,
    and the established flows NATed by the old mode must keep their NAT all the same."""
    web = manifests / "web.yaml"
    docs = [d for d in yaml.safe_load_all(web.read_text()) if d]
    kept = [d for d in docs if not d["metadata"]["name"].startswith("web-nodeport")]
    assert len(kept) < len(docs)
    web.write_text(yaml.safe_dump_all(kept))


def end_the_drain(node: Node, mode: str) -> Switch:
    """The next switch cleanup once the drain's time is over (its start moved back by that
    much): the reverse path goes too."""
    marker = node.bpffs / PIN_FOLDER / DRAINING
    assert marker.is_dir(), "the switch left no drain"
    past = time.time() - DRAIN_SECONDS - 1
    os.utime(marker, (past, past))
    return migrate(node, mode)


@pytest.mark.parametrize(
    ("start", "targets", "nodeports"),
    [
        ("nftables", [EBPF, "nftables"], True),
        ("iptables", [EBPF], True),
        (EBPF, ["nftables"], True),
        ("nftables", [EBPF], False),
    ],
    ids=["nftables-ebpf-nftables", "iptables-ebpf", "ebpf-nftables", "clusterip-only"],
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
                found = reverse_path(found, switch.draining)
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
    drained = end_the_drain(node, mode) if left_ebpf else None
    report(start, rows, switches, seen, time.monotonic() - began, nodeports, drained)
    assert all(not r.leftovers for r in rows), [(r.step, r.leftovers[:5]) for r in rows]
    assert [r.new_failed for r in rows] == [0] * len(rows)
    assert all(r.new_total > 0 for r in rows)
    long = seen["long"]
    assert all(f["broken"] is None and f["pod"] for f in long), long
    assert [r.long_stalled for r in rows] == [0] * len(rows)
    assert [(r.udp_lost, r.udp_moved, r.udp_wrong_source) for r in rows] == [(0, 0, 0)] * len(rows)
    # While the reverse path drains, connections made in ebpf mode still see the Service.
    assert [f["peer"] for f in long] == [f["peer_end"] for f in long]
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
