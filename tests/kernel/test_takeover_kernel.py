"""Taking over from upstream kube-proxy: a node whose rules kube-proxy wrote (the golden
captures, loaded with iptables-restore / nft -f: the lab's Services as kube-proxy writes them,
and, for iptables, the stale chains of Services this cluster no longer has, from upstream's
own TestOverallIPTablesRules) is adopted by kubeplex of the same mode under traffic: its
first sync rewrites them without a window, removes what is stale, and keeps the counters of
the chains it does not rewrite."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from kits.cli_kit import LAB, in_netns, kubeplex
from kits.migration_kit import SETTLE, StepFigures, Traffic, figures, lab_manifests

from kubeplex.testing.netlab import NODE1, Lab

pytestmark = pytest.mark.kernel

GOLDEN = Path(__file__).resolve().parents[1] / "unit" / "golden"
#: The jumps kube-proxy ensures into its chains (iptablesJumpChains), as iptables -I does.
UPSTREAM_JUMPS = """*filter
-I INPUT 1 -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-I FORWARD 1 -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-I INPUT 1 -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS
-I FORWARD 1 -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-I OUTPUT 1 -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-I FORWARD 1 -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-I INPUT 1 -j KUBE-FIREWALL
-I OUTPUT 1 -j KUBE-FIREWALL
COMMIT
*nat
-I OUTPUT 1 -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-I PREROUTING 1 -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-I POSTROUTING 1 -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
COMMIT
"""  # noqa: E501
#: A chain of upstream's overall test that this cluster has no Service for.
STALE = "KUBE-SVC-XPGD46QRK7WJZT7O"
PREROUTING_JUMP = re.compile(r"^\[(\d+):\d+\] -A PREROUTING .*-j KUBE-SERVICES$", re.M)


@pytest.fixture
def manifests(tmp_path: Path) -> Path:
    return lab_manifests(tmp_path)


def ipv4_input(golden: Path) -> str:
    """The IPv4 part of a golden render, without its comment lines."""
    text = golden.read_text().split("# ip6tables-restore")[0]
    text = text.split("# nft -f - transaction (IPv6")[0]
    return "".join(ln + "\n" for ln in text.splitlines() if not ln.startswith("#"))


def load(lab: Lab, argv: list[str], text: str) -> None:
    lab.exec(NODE1, argv, input=text)


def takeover(
    lab: Lab, manifests: Path, tmp_path: Path, mode: str
) -> tuple[list[StepFigures], dict[str, Any]]:
    node = lab.namespace_of(NODE1)
    # No UDP flow: kube-proxy's captures hold the lab's two HTTP Services only.
    traffic = Traffic(lab, tmp_path, udp=False)
    try:
        time.sleep(SETTLE)
        t0 = time.monotonic()
        run = kubeplex(
            "run", "--config", str(LAB / "config.yaml"), "--proxy-mode", mode,
            "--netns", node, "--manifests", str(manifests), "--once",
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        time.sleep(SETTLE)
        t1 = time.monotonic()
    finally:
        seen = traffic.stop()
        traffic.kill()
    rows = figures(seen, [(f"kube-proxy -> kubeplex ({mode})", t0, t1)])
    return rows, seen


def test_iptables_takeover_from_kube_proxy(netlab: Lab, manifests: Path, tmp_path: Path) -> None:
    for name in ("localhost_nps_accepted_pkts", "ct_state_invalid_dropped_pkts"):
        netlab.exec(NODE1, ["nfacct", "add", name], check=False)
    restore = ["iptables-restore", "--noflush"]
    load(netlab, restore, ipv4_input(GOLDEN / "iptables" / "upstream-overall.txt"))
    load(netlab, restore, ipv4_input(GOLDEN / "iptables" / "seed-lab.txt"))
    load(netlab, restore, UPSTREAM_JUMPS)
    node = netlab.namespace_of(NODE1)
    assert STALE in in_netns(node, "iptables-save", "-t", "nat")
    assert netlab.http("client", "10.96.88.59", 80)[0].ok  # kube-proxy's rules serve
    before = int(PREROUTING_JUMP.findall(in_netns(node, "iptables-save", "-c", "-t", "nat"))[0])

    (row,), seen = takeover(netlab, manifests, tmp_path, "iptables")
    print(row.row())
    nat = in_netns(node, "iptables-save", "-c", "-t", "nat")
    assert STALE not in nat
    # The built-in chains' jumps are not rewritten: their counters run on.
    (after,) = PREROUTING_JUMP.findall(nat)
    assert int(after) > before
    assert row.long_broken == 0 and row.udp_moved == 0
    assert row.new_failed == 0
    assert all(f["broken"] is None and f["pod"] for f in seen["long"])


def test_nftables_takeover_from_kube_proxy(netlab: Lab, manifests: Path, tmp_path: Path) -> None:
    load(netlab, ["nft", "-f", "-"], ipv4_input(GOLDEN / "nftables" / "seed-lab.txt"))
    node = netlab.namespace_of(NODE1)
    assert netlab.http("client", "10.96.88.59", 80)[0].ok
    (row,), seen = takeover(netlab, manifests, tmp_path, "nftables")
    print(row.row())
    assert "service-PFISGYVC-default/web/tcp/" in in_netns(node, "nft", "list", "ruleset")
    assert row.long_broken == 0 and row.udp_moved == 0
    assert row.new_failed == 0
    assert all(f["broken"] is None and f["pod"] for f in seen["long"])
