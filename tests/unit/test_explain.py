"""``kubeplex explain`` without root: the mode-neutral expectation against what each mode
programs into its in-memory kernel, drift after hand edits and stale state, and the output."""

from __future__ import annotations

import json

import pytest
from kits.explain_kit import OTHER, SCENARIOS, THREE, V4, V6, Node, slice_of, spn, web

from kubeplex.core.cli import explain
from kubeplex.core.dataplane.drift import compare, read_entry
from kubeplex.core.model.expectations import DROP, FORWARD, REJECT, expect
from kubeplex.testing import fakes
from kubeplex.testing.dataplane import (
    endpoint,
    endpoint_slice,
)

MODES = ("iptables", "nftables")
#: The modes whose kernel is read back by ``inspect`` in the same words for every scenario.
EVERY_MODE = (*MODES, "ebpf")


@pytest.mark.parametrize("mode", EVERY_MODE)
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_mode_programs_what_the_expectation_says(mode: str, scenario: str) -> None:
    n = Node(mode, *SCENARIOS[scenario])
    n.sync()
    # As the command compares them: the expectation as a mode of these capabilities programs it.
    ports = explain.for_mode(n.ports(), n.backend.capabilities)
    assert ports and all(p.view is not None for p in ports), ports
    for p in ports:
        assert compare(p.expectation, p.view) == [], (p.expectation, p.view)


@pytest.mark.parametrize("mode", EVERY_MODE)
def test_dual_stack_is_expected_per_family(mode: str) -> None:
    n = Node(
        mode,
        web(secondary_cluster_ip="fd00:96::59"),
        slice_of("web", *THREE),
        endpoint_slice(
            "web",
            [endpoint("fd00:10:244:2::2", OTHER)],
            port=8080,
            name="web-v6",
            address_type="IPv6",
        ),
        dual=True,
    )
    n.sync()
    ports = explain.for_mode(n.ports(), n.backend.capabilities)
    assert [p.family for p in ports] == [V4, V6]
    assert all(compare(p.expectation, p.view) == [] for p in ports), ports
    assert [e.target for e in ports[1].expectation.endpoints] == ["[fd00:10:244:2::2]:8080"]


def test_the_expectation_states_the_shared_decisions() -> None:
    n = Node("iptables", *SCENARIOS["external-local-without-local"])
    graph = n.state().graphs[V4]
    exp = expect(graph, spn(), local_traffic="from 10.244.0.0/16")
    verdicts = {f.kind: (f.verdict, f.also) for f in exp.frontends}
    assert verdicts["ClusterIP"] == (FORWARD, frozenset())
    # Local policy, no local endpoint: outside traffic dropped, the node's own forwarded.
    assert verdicts["NodePort"] == (DROP, frozenset({FORWARD}))
    assert verdicts["load-balancer IP"] == (DROP, frozenset({FORWARD}))
    assert [e.share for e in exp.endpoints] == [0.5, 0.5]
    assert exp.health_check_node_port == 32000

    empty = Node("iptables", *SCENARIOS["no-endpoints"])
    exp = expect(empty.state().graphs[V4], spn())
    assert {f.verdict for f in exp.frontends} == {REJECT}
    assert (exp.endpoints, exp.masquerade, exp.affinity_seconds) == ((), False, None)


def test_entry_lines_are_read_for_addresses_ports_and_verdicts() -> None:
    rule = read_entry(
        '-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m comment --comment "ns/reject 99 DROP"'
        " -m tcp --dport 443 -j KUBE-SVC-X"
    )
    assert (rule.addresses, rule.ports, rule.verdict) == ({"10.96.0.1"}, {443}, FORWARD)
    element = read_entry(
        'element ip kube-proxy no-endpoint-services { 10.96.0.2 . tcp . 81 comment "ns/x"'
        " : goto reject-chain }"
    )
    assert (element.addresses, element.ports, element.verdict) == ({"10.96.0.2"}, {81}, REJECT)
    virtual = read_entry("TCP [fd00::1]:8443 rr")
    assert (virtual.addresses, virtual.ports) == ({"fd00::1"}, {8443})
    local = read_entry("-A KUBE-NODEPORTS -d 127.0.0.0/8 -p tcp --dport 30080 -j KUBE-EXT-X")
    assert local.loopback and local.ports == {30080} and not local.addresses


# --- drift ---------------------------------------------------------------------------------


def _without_iptables_rule(n: Node, needle: str) -> str:
    assert isinstance(n.kernel, fakes.FakeIptables)
    rule = next(r for r in n.kernel.rules(V4, "nat", "KUBE-SERVICES") if needle in r)
    n.kernel.restore(V4, f"*nat\n{rule.replace('-A ', '-D ', 1)}\nCOMMIT\n")
    return rule


def test_a_rule_deleted_by_hand_is_drift_iptables() -> None:
    n = Node("iptables", *SCENARIOS["nodeport"])
    n.sync()
    _without_iptables_rule(n, "cluster IP")
    (p,) = n.ports()
    (d,) = compare(p.expectation, p.view)
    assert (d.kind, d.subject) == ("missing-entry", "10.96.88.59:80/TCP")
    assert "deleted by hand" in d.message


def test_an_element_deleted_by_hand_is_drift_nftables() -> None:
    n = Node("nftables", *SCENARIOS["nodeport"])
    n.sync()
    assert isinstance(n.kernel, fakes.FakeNftables)
    (p,) = n.ports()
    assert p.view is not None
    element = next(e for e in p.view.entries if "service-nodeports" in e)
    n.kernel.run(element.replace("element ", "delete element ", 1) + "\n")
    assert n.drift() == ["missing-entry"]


@pytest.mark.parametrize("mode", MODES)
def test_stale_and_missing_endpoints_and_affinity_are_drift(mode: str) -> None:
    n = Node(mode, *SCENARIOS["clusterip"])
    n.sync()
    # The cluster changes; the kernel is not synced: it still holds the old endpoints.
    n.set(slice_of("web", *THREE[:2], ("10.244.2.9", OTHER)))
    kinds = n.drift()
    assert sorted(k for k in kinds if not k.endswith("-rule")) == [
        "missing-endpoint",
        "stale-endpoint",
    ]
    # The same, rule by rule: the gone endpoint's chain holds rules kubeplex would not write
    # now, the new one's lacks them, and the Service's chain jumps elsewhere.
    assert sorted(k for k in kinds if k.endswith("-rule")) == [
        "changed-rule",
        "extra-rule",
        "extra-rule",
        "missing-rule",
        "missing-rule",
    ]
    n.sync()
    assert n.drift() == []
    n.set(web(session_affinity="ClientIP", affinity_timeout=30))
    kinds = n.drift()
    assert [k for k in kinds if not k.endswith("-rule")] == ["affinity"]
    assert "missing-rule" in kinds  # the affinity rules kubeplex would write


@pytest.mark.parametrize("mode", MODES)
def test_endpoints_gone_is_drift_of_the_verdict(mode: str) -> None:
    n = Node(mode, *SCENARIOS["clusterip"])
    n.sync()
    n.set(endpoint_slice("web", [], port=8080))
    kinds = n.drift()
    assert "wrong-verdict" in kinds and kinds.count("stale-endpoint") == 3 and "masquerade" in kinds


@pytest.mark.parametrize("mode", MODES)
def test_a_deleted_service_still_programmed_is_drift(mode: str) -> None:
    n = Node(mode, *SCENARIOS["clusterip"])
    n.sync()
    n.cluster.delete_service("default", "web")
    found = n.backend.inspect(spn())
    assert found
    assert [d.kind for d in compare(None, found[0])] == ["not-expected"]


# --- the command's output ------------------------------------------------------------------


def test_explain_text_walks_the_path_with_counters() -> None:
    n = Node("iptables", *SCENARIOS["nodeport"])
    n.sync()
    assert isinstance(n.kernel, fakes.FakeIptables)
    rule = next(r for r in n.kernel.rules(V4, "nat", "KUBE-SERVICES") if "cluster IP" in r)
    n.kernel.set_counters(V4, "nat", rule, packets=7, bytes=420)
    reports = [explain.explain(p) for p in n.ports()]
    out = explain.text("iptables", reports)
    assert "1. entry, 7 packets counted there" in out
    assert "ClusterIP 10.96.88.59:80/TCP: forwarded to an endpoint" in out
    assert "NodePort node port 30080/TCP" in out
    assert "2. the Service's own objects: KUBE-SVC-" in out
    assert "probability 0.33333 of the rest" in out and "probability 0.50000" in out
    assert "share 33.3%" in out and "on this node" in out
    assert "4. DNAT" in out and "5. masquerade: yes" in out
    assert "drift: none" in out
    doc = json.loads(json.dumps(reports))
    assert doc[0]["programmed"]["packets"] == 7 and doc[0]["drift"] == []


def test_explain_says_where_connections_are_refused() -> None:
    n = Node("nftables", *SCENARIOS["no-endpoints"])
    n.sync()
    out = explain.text("nftables", [explain.explain(p) for p in n.ports()])
    assert "new connections to 10.96.88.59:80/TCP are refused" in out
    assert "no-endpoint-services" in out
    assert "new connections to node port 30081/TCP are refused" in out
    assert "3. endpoint choice: no endpoints" in out


def test_explain_text_flags_drift() -> None:
    n = Node("iptables", *SCENARIOS["clusterip"])
    n.sync()
    _without_iptables_rule(n, "cluster IP")
    n.set(slice_of("web", *THREE[:2]))
    reports = [explain.explain(p) for p in n.ports()]
    out = explain.text("iptables", reports)
    # The entry, the endpoint that went, and the two left each given a third, not a half;
    # then the same rule by rule, after them.
    drift = reports[0]["drift"]
    assert f"DRIFT ({len(drift)})" in out
    assert "(no entry in the kernel)" in out
    assert "STALE: no endpoint now" in out
    assert "gets 33.3% of new connections, not 50.0%" in out
    kinds = [d["kind"] for d in drift]
    assert sorted(kinds[:4]) == ["missing-entry", "share", "share", "stale-endpoint"]
    assert sorted(kinds[4:]) == ["changed-rule", "changed-rule", "extra-rule"] + ["extra-rule"] * 2
    stale = next(d for d in drift if d["kind"] == "extra-rule" and "-j KUBE-SEP" in d["found"])
    assert "10.244.2.3:8080" in stale["found"]
    assert f"holds a rule kubeplex would not write: {stale['found']}" in out


def test_select_names_the_unknown_service() -> None:
    n = Node("iptables", *SCENARIOS["nodeport"])
    state = n.state()
    known = n.cluster.service_keys()
    assert explain.select(state, known, "default/web") == [spn()]
    assert explain.select(state, known, "default/web:80") == [spn()]
    with pytest.raises(explain.UnknownService, match=r"no Service default/nope .*web"):
        explain.select(state, known, "default/nope")
    with pytest.raises(explain.UnknownService, match="has no port '81'"):
        explain.select(state, known, "default/web:81")
    with pytest.raises(explain.UnknownService, match="is not NS/NAME"):
        explain.select(state, known, "web")
