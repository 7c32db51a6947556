"""``kubeplex migrate --to ipvs --check`` (and back) without root: what the operator must
accept between the iptables and ipvs modes, read from the backends' capabilities and metric
families, on in-memory kernels (``FakeIptables``, ``FakeIpvs``)."""

from __future__ import annotations

import json

from kits.explain_kit import NODE, NODE_IP, SCENARIOS, IpvsNode, Node

from kubeplex.core.cli import inspecting, preflight
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import Backend, BackendContext
from kubeplex.core.model.types import IPFamily
from kubeplex.testing import fakes

V4 = IPFamily.IPv4


def ipvs_target(n: Node) -> Backend:
    ctx = BackendContext(n.config, NODE, (V4,), kernel=fakes.FakeIpvs(addresses=(NODE_IP,)))
    return plugins.load_backend("ipvs", ctx)


def check(n: Node, target: Backend) -> preflight.Report:
    return preflight.check(n.config, n.config, n.backend, target, n.ports())


def kinds(report: preflight.Report) -> list[tuple[str, str]]:
    return [(d["kind"], d["what"]) for d in report.differences]


def test_iptables_to_ipvs_lists_the_bound_ips_and_the_metrics_that_go() -> None:
    n = Node("iptables", *SCENARIOS["nodeport"])
    n.sync()
    report = check(n, ipvs_target(n))
    doc = report.as_dict()
    assert doc["safe"] is False
    # This machine's kernel may lack IPVS: then that, and only that, blocks the switch.
    assert all("kernel module" in b for b in doc["blockers"]), doc["blockers"]
    found = kinds(report)
    # Service IPs become the node's own addresses on kube-ipvs0: node-wide, once.
    bound = next(d for d in report.differences if d["what"] == "binds-service-ips")
    assert bound["affects"] == [] and "`ip addr`" in bound["message"]
    assert "bound to a link of the node" in bound["message"]
    # IPVS serves no NodePort on 127.0.0.1.
    assert ("capability", "localhost-nodeports") in found
    metrics = {what for kind, what in found if kind == "metric"}
    assert {
        "kubeproxy_iptables_localhost_nodeports_accepted_packets_total",
        "kubeproxy_iptables_ct_state_invalid_dropped_packets_total",
    } <= metrics
    assert "kubeproxy_sync_proxy_rules_iptables_restore_failures_total" not in metrics
    assert not any(kind == "kernel" for kind, _ in found)
    # Nothing here has a Local policy without local endpoints: the fallback is not listed.
    assert ("capability", "local-policy-fallback") not in found
    (svc,) = doc["services"]
    assert svc["endpoints"]["now"] == svc["endpoints"]["after"]
    assert {f["kind"]: (f["now"], f["after"]) for f in svc["frontends"]} == {
        "ClusterIP": (["forward"], "forward"),
        "NodePort": (["forward"], "forward"),
    }
    out = preflight.text(report)
    assert "metric kubeproxy_iptables_localhost_nodeports_accepted_packets_total disappears" in out
    json.dumps(doc)


def test_a_local_policy_without_local_endpoints_is_a_difference_to_accept() -> None:
    n = Node("iptables", *SCENARIOS["external-local-without-local"])
    n.sync()
    report = check(n, ipvs_target(n))
    fallback = next(d for d in report.differences if d["what"] == "local-policy-fallback")
    assert fallback["affects"] == ["default/web (IPv4)"]
    assert "instead of dropping it" in fallback["message"]
    (svc,) = report.services
    after = {f["kind"]: (f["now"], f["after"]) for f in svc["frontends"]}
    assert after["NodePort"] == (["drop", "forward"], "forward")
    assert not svc["same"] and "local-policy-fallback" in svc["capabilities"]


def test_ipvs_to_iptables_reads_the_ipvs_kernel_back() -> None:
    n = IpvsNode(*SCENARIOS["nodeport"])
    n.sync()
    n.backend = n.fresh()  # as the command makes it
    inspecting.prime(n.backend, n.state())
    target = plugins.load_backend(
        "iptables", BackendContext(n.config, NODE, (V4,), kernel=fakes.FakeIptables())
    )
    report = preflight.check(n.config, n.config, n.backend, target, n.ports())
    found = kinds(report)
    assert not any(kind == "kernel" for kind, _ in found), report.differences
    unbound = next(d for d in report.differences if d["what"] == "binds-service-ips")
    assert "no longer bound" in unbound["message"]
    assert ("capability", "localhost-nodeports") in found  # gained: 127.0.0.1 answers
    (svc,) = report.services
    assert svc["endpoints"]["now"] == svc["endpoints"]["after"]
    assert svc["masquerade"] == {"now": True, "after": True}
    assert any(note.startswith("new metric: kubeproxy_iptables_") for note in report.notes)


def test_ipvs_drift_is_a_difference_before_switching() -> None:
    n = IpvsNode(*SCENARIOS["clusterip"])
    n.sync()
    n.ipvs.delete_link()  # every Service IP gone from the node, the virtual services stay
    key = next(k for k in n.ipvs.dump(V4).virtual)
    t = n.ipvs.types
    n.ipvs.send(V4, [t.Op("del-service", V4, key=key)])
    report = check(n, ipvs_target(n))
    assert ("kernel", "not-programmed") in kinds(report)


def test_after_a_switch_to_ipvs_the_iptables_mode_leaves_only_what_they_share() -> None:
    """The ipvs mode names the jumps inside its chains (KUBE-NODE-PORT -> KUBE-MARK-MASQ)
    as the iptables mode does, so a switch's cleanup and its leftovers agree."""
    n = Node("iptables", *SCENARIOS["nodeport"])
    rules = fakes.FakeIptables(addresses=(NODE_IP,))
    ipvs = plugins.load_backend(
        "ipvs", BackendContext(n.config, NODE, (V4,), kernel=fakes.FakeIpvs(rules))
    )
    ipvs.sync(n.state())
    iptables = plugins.load_backend("iptables", BackendContext(n.config, NODE, (V4,), kernel=rules))
    shared = set(ipvs.leftovers())
    assert "iptables nat jump KUBE-NODE-PORT -> KUBE-MARK-MASQ" in shared
    assert [x for x in iptables.leftovers() if x not in shared] == []
    assert len(shared) == len(ipvs.leftovers())  # each line once
