"""``kubeplex explain`` and ``kubeplex migrate --check`` on the seed lab's node: the packet
path with counters after real traffic, drift after a rule is deleted by hand, and the
pre-flight check of iptables -> nftables naming the localhost NodePort difference."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from typing import Any

import pytest
from kits.cli_kit import LAB, in_netns, kubeplex

from kubeplex.testing.netlab import CLIENT_POD, NODE1, Lab

pytestmark = pytest.mark.kernel

CLUSTER_IP = "10.96.88.59"


@pytest.fixture
def node(netlab: Lab) -> Iterator[str]:
    """The client's node, cleaned of every mode's rules afterwards (the lab is shared)."""
    ns = netlab.namespace_of(NODE1)
    try:
        yield ns
    finally:
        kubeplex("cleanup", "--config", str(LAB / "config.yaml"), "--netns", ns)


def args(ns: str, *extra: str) -> tuple[str, ...]:
    return (
        "--config",
        str(LAB / "config.yaml"),
        "--manifests",
        str(LAB / "manifests"),
        "--netns",
        ns,
        *extra,
    )


def explain(ns: str, service: str, *extra: str) -> tuple[int, str, dict[str, Any] | None]:
    proc = kubeplex("explain", service, *args(ns, *extra))
    doc = json.loads(proc.stdout) if "json" in extra else None
    return proc.returncode, proc.stdout + proc.stderr, doc


def traffic(lab: Lab, count: int) -> None:
    results = lab.http(CLIENT_POD, CLUSTER_IP, 80, count=count, timeout=2.0)
    assert all(r.ok for r in results), results


def test_iptables_path_counters_and_a_rule_deleted_by_hand(netlab: Lab, node: str) -> None:
    proc = kubeplex("run", *args(node), "--once")
    assert proc.returncode == 0, proc.stderr
    traffic(netlab, 12)

    code, out, _ = explain(node, "default/web")
    assert code == 0, out
    assert f"ClusterIP {CLUSTER_IP}:80/TCP: forwarded to an endpoint" in out
    assert "-j KUBE-SVC-LOLE4ISW44XBNF3G" in out
    assert "probability 0.33333 of the rest" in out
    assert "drift: none" in out

    code, _, doc = explain(node, "default/web", "-o", "json")
    assert code == 0 and doc is not None
    (svc,) = doc["services"]
    # Counters of real traffic: the entry saw the connections' first packets, and the
    # endpoints share them.
    assert svc["programmed"]["packets"] >= 12
    assert sum(e["packets"] for e in svc["endpoints"]) >= 12
    assert {e["target"] for e in svc["endpoints"]} == {
        "10.244.1.2:8080",
        "10.244.2.2:8080",
        "10.244.2.3:8080",
    }

    saved = in_netns(node, "iptables-save", "-t", "nat")
    rule = next(
        line
        for line in saved.splitlines()
        if line.startswith("-A KUBE-SERVICES") and "KUBE-SVC-LOLE4ISW44XBNF3G" in line
    )
    in_netns(node, "iptables", "-t", "nat", *shlex.split(rule.replace("-A ", "-D ", 1)))
    code, out, _ = explain(node, "default/web")
    assert code == 1, out
    assert "DRIFT (1)" in out and "deleted by hand" in out
    code, _, doc = explain(node, "default/web", "-o", "json")
    assert code == 1 and doc is not None
    assert [d["kind"] for d in doc["services"][0]["drift"]] == ["missing-entry"]

    code, out, _ = explain(node, "default/nope")
    assert code == 2 and "no Service default/nope" in out


def test_migrate_check_iptables_to_nftables(node: str) -> None:
    assert kubeplex("run", *args(node), "--once").returncode == 0
    proc = kubeplex("migrate", "--to", "nftables", "--check", *args(node), "-o", "json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert (doc["from"], doc["to"], doc["safe"]) == ("iptables", "nftables", False)
    local = next(d for d in doc["differences"] if d["what"] == "localhost-nodeports")
    assert local["affects"] == ["default/web-nodeport (IPv4)"]
    assert not [d for d in doc["differences"] if d["kind"] == "kernel"]
    assert [s["service"] for s in doc["services"]] == ["default/web", "default/web-nodeport"]
    text = kubeplex("migrate", "--to", "nftables", "--check", *args(node))
    assert text.returncode == 1
    assert "NodePorts no longer answer on 127.0.0.1" in text.stdout
    # Nothing was switched.
    assert "KUBE-SVC-LOLE4ISW44XBNF3G" in in_netns(node, "iptables-save", "-t", "nat")
    assert "kube-proxy" not in in_netns(node, "nft", "list", "tables")


def test_nftables_path_and_an_element_deleted_by_hand(netlab: Lab, node: str) -> None:
    mode = ("--proxy-mode", "nftables")
    proc = kubeplex("run", *args(node, *mode), "--once")
    assert proc.returncode == 0, proc.stderr
    traffic(netlab, 6)
    code, out, _ = explain(node, "default/web-nodeport", *mode)
    assert code == 0, out
    assert "service-nodeports" in out and "weight 1" in out and "drift: none" in out

    in_netns(
        node,
        "nft",
        "delete element ip kube-proxy service-nodeports { tcp . 30080 }",
    )
    code, _, doc = explain(node, "default/web-nodeport", *mode, "-o", "json")
    assert code == 1 and doc is not None
    drift = doc["services"][0]["drift"]
    assert [(d["kind"], d["subject"]) for d in drift] == [("missing-entry", "node port 30080/TCP")]
