"""``kubeplex migrate --to MODE --check`` without root: the comparison of a mode's kernel with
what a target mode would program, from the backends' capabilities and metric families."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import ClassVar

from kits.explain_kit import SCENARIOS, Node

from kubeplex.core.cli import preflight
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import Backend, BackendContext, MetricFamily
from kubeplex.testing import fakes


def target_of(n: Node, mode: str) -> Backend:
    ctx = BackendContext(n.config, n.backend.ctx.node_name, kernel=fakes.for_mode(mode))
    return plugins.load_backend(mode, ctx)


def check(n: Node, target: Backend) -> preflight.Report:
    return preflight.check(n.config, n.config, n.backend, target, n.ports())


def kinds(report: preflight.Report) -> list[tuple[str, str]]:
    return [(d["kind"], d["what"]) for d in report.differences]


def test_iptables_to_nftables_lists_localhost_nodeports_and_metrics() -> None:
    n = Node("iptables", *SCENARIOS["nodeport"])
    n.sync()
    report = check(n, target_of(n, "nftables"))
    doc = report.as_dict()
    assert doc["safe"] is False and doc["blockers"] == []
    found = kinds(report)
    assert ("capability", "localhost-nodeports") in found
    local = next(d for d in report.differences if d["what"] == "localhost-nodeports")
    assert local["affects"] == ["default/web (IPv4)"]
    assert "127.0.0.1" in local["message"]
    # nftables rejects traffic to unused ClusterIP ports: node-wide, the Service is the same.
    assert ("capability", "reject-unused-clusterip-ports") in found
    metrics = {what for kind, what in found if kind == "metric"}
    assert "kubeproxy_iptables_localhost_nodeports_accepted_packets_total" in metrics
    assert "kubeproxy_iptables_ct_state_invalid_dropped_packets_total" in metrics
    assert not any(kind == "kernel" for kind, _ in found)
    (svc,) = doc["services"]
    assert svc["endpoints"]["now"] == svc["endpoints"]["after"]
    assert svc["masquerade"] == {"now": True, "after": True}
    assert svc["capabilities"] == ["localhost-nodeports"] and not svc["same"]
    out = preflight.text(report)
    assert "NodePorts no longer answer on 127.0.0.1" in out
    assert "metric kubeproxy_iptables_localhost_nodeports_accepted_packets_total disappears" in out
    json.dumps(doc)


def test_a_clusterip_only_cluster_is_the_same_service_for_service() -> None:
    n = Node("nftables", *SCENARIOS["clusterip"])
    n.sync()
    report = check(n, target_of(n, "iptables"))
    assert [s["same"] for s in report.services] == [True]
    # Going back to iptables: unused ports are no longer rejected; nftables' metrics go.
    assert ("capability", "reject-unused-clusterip-ports") in kinds(report)
    assert ("capability", "localhost-nodeports") not in kinds(report)  # no NodePort here


def test_the_same_mode_with_a_clean_kernel_is_safe() -> None:
    n = Node("iptables", *SCENARIOS["affinity"])
    n.sync()
    report = check(n, target_of(n, "iptables"))
    assert report.as_dict()["safe"] is True, report.differences
    assert "safe: no difference in behaviour" in preflight.text(report)


def test_drift_of_the_current_kernel_is_a_difference() -> None:
    n = Node("iptables", *SCENARIOS["clusterip"])
    n.sync()
    n.set(SCENARIOS["udp"][0], SCENARIOS["udp"][1])  # not programmed yet
    report = check(n, target_of(n, "iptables"))
    assert ("kernel", "not-programmed") in kinds(report)
    assert [s["same"] for s in report.services] == [False, True]


class _Bare(Backend):
    """A backend that declares one capability nobody knows and no metric."""

    mode = "bare"
    capabilities: ClassVar[frozenset[str]] = frozenset({"warp-drive"})  # type: ignore[misc]

    def render(self, state: object, observed: object = None) -> object:  # type: ignore[override]
        raise NotImplementedError

    def apply(self, rendered: object) -> object:  # type: ignore[override]
        raise NotImplementedError

    def metric_families(self) -> Sequence[MetricFamily]:
        return ()


def test_unknown_capabilities_are_listed_by_name() -> None:
    n = Node("iptables", *SCENARIOS["nodeport"])
    n.sync()
    bare = _Bare(BackendContext(n.config, "kind-worker", kernel=object()))
    report = check(n, bare)
    found = kinds(report)
    assert ("capability", "warp-drive") in found
    assert ("capability", "session-affinity") not in found  # no Service uses affinity
    assert ("capability", "localhost-nodeports") in found
