"""``kubeplex explain`` in ipvs mode without root: the mode-neutral expectation, as a mode with
the ipvs mode's capabilities programs it, against the virtual services of an in-memory IPVS
kernel (``FakeIpvs``); drift after real servers are deleted, added or re-weighted by hand, and
affinity read back as persistence."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kits.explain_kit import NODE_IP, OTHER, SCENARIOS, THREE, IpvsNode, slice_of, spn, web

from kubeplex.core.cli import explain, inspecting
from kubeplex.core.dataplane.drift import compare
from kubeplex.core.model.expectations import FORWARD, LOCAL_POLICY_FALLBACK, REJECT
from kubeplex.core.model.types import IPFamily

V4 = IPFamily.IPv4
VS = "-t 10.96.88.59:80"


def real_op(n: IpvsNode, kind: str, target: str, weight: int = 1) -> Any:
    """An operation on a real server of the ClusterIP's virtual service, as by hand."""
    t = n.ipvs.types
    key = next(k for k in n.held().virtual if str(k) == VS)
    ip, port = target.rsplit(":", 1)
    return t.Op(kind, V4, key=key, real=t.RealServer(t.RealKey(ip, int(port)), weight))


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_ipvs_programs_what_the_expectation_says(scenario: str) -> None:
    n = IpvsNode(*SCENARIOS[scenario])
    n.sync()
    ports = n.ports()
    assert ports and all(p.view is not None for p in ports), ports
    for p in ports:
        assert compare(p.expectation, p.view) == [], (p.expectation, p.view)


def test_a_local_policy_without_local_endpoints_falls_back_as_upstream() -> None:
    """Upstream's ipvs mode sends such traffic to the cluster's endpoints (or, with none,
    leaves the virtual service without real servers: refused), where the other modes drop."""
    assert LOCAL_POLICY_FALLBACK in IpvsNode().backend.capabilities
    n = IpvsNode(*SCENARIOS["external-local-without-local"])
    n.sync()
    (p,) = n.ports()
    assert p.expectation is not None
    assert {f.kind: f.verdict for f in p.expectation.frontends} == {
        "ClusterIP": FORWARD,
        "load-balancer IP": FORWARD,
        "NodePort": FORWARD,
    }
    n = IpvsNode(*SCENARIOS["internal-local-without-local"])
    n.sync()
    (p,) = n.ports()
    assert p.expectation is not None and p.view is not None
    assert [f.verdict for f in p.expectation.frontends] == [REJECT]
    (entry,) = p.view.entries
    assert entry.startswith(f"-A {VS} -s rr") and "refused (REJECT)" in entry
    assert p.view.masquerade is False


def test_a_fresh_backend_reads_the_kernel_once_primed() -> None:
    """``kubeplex explain`` builds a new backend: its render (nothing applied) tells it which
    virtual services are the Service's."""
    n = IpvsNode(*SCENARIOS["nodeport"])
    n.sync()
    sent = len(n.ipvs.sent)
    n.backend = n.fresh()
    inspecting.prime(n.backend, n.state())
    assert len(n.ipvs.sent) == sent  # a render only
    (p,) = n.ports()
    assert p.view is not None
    assert list(p.view.entries) == [f"-A {VS} -s rr", f"-A -t {NODE_IP}:30080 -s rr"]
    assert compare(p.expectation, p.view) == []


def test_explain_text_shows_the_virtual_service_weights_and_shares() -> None:
    n = IpvsNode(*SCENARIOS["clusterip"])
    n.sync()
    reports = [explain.explain(p) for p in n.ports()]
    out = explain.text("ipvs", reports)
    assert f"ClusterIP 10.96.88.59:80/TCP: forwarded to an endpoint\n       -A {VS} -s rr" in out
    assert "address 10.96.88.59 on kube-ipvs0" in out and "ipset KUBE-CLUSTER-IP" in out
    assert "3. endpoint choice: 3 endpoints by weight (of 3 in all)" in out
    assert "10.244.1.2:8080           share 33.3%  weight 1  on this node" in out
    assert "5. masquerade: yes in the kernel" in out
    assert "drift: none" in out
    doc = json.loads(json.dumps(reports))
    assert [e["weight"] for e in doc[0]["endpoints"]] == [1, 1, 1]


def test_a_real_server_deleted_by_hand_is_drift() -> None:
    n = IpvsNode(*SCENARIOS["clusterip"])
    n.sync()
    n.send(real_op(n, "del-real", "10.244.2.3:8080"))
    (p,) = n.ports()
    drift = compare(p.expectation, p.view)
    # The one that went, and the two left each given a half, not a third.
    assert sorted(d.kind for d in drift) == ["missing-endpoint", "share", "share"]
    out = explain.text("ipvs", [explain.explain(p)])
    assert "DRIFT (3)" in out and "10.244.2.3:8080" in out and "NOT PROGRAMMED" in out
    n.sync()
    assert n.drift() == []


def test_a_stale_or_reweighted_real_server_is_drift() -> None:
    n = IpvsNode(*SCENARIOS["clusterip"])
    n.sync()
    n.send(real_op(n, "add-real", "10.244.2.9:8080"))
    kinds = sorted(n.drift())
    assert kinds == ["share", "share", "share", "stale-endpoint"]
    n.sync()
    assert n.drift() == []
    n.send(real_op(n, "edit-real", "10.244.1.2:8080", weight=2))
    assert sorted(n.drift()) == ["share", "share", "share"]


def test_a_draining_real_server_is_no_drift() -> None:
    """An endpoint gone while it still carries connections keeps its real server at weight
    0 (graceful termination): it gets no new connection, so it is no stale endpoint."""
    n = IpvsNode(*SCENARIOS["clusterip"])
    n.sync()
    n.ipvs.set_connections(V4, VS, "10.244.2.3:8080", active=1)
    n.set(slice_of("web", *THREE[:2]))
    n.sync()
    (p,) = n.ports()
    assert p.view is not None
    weights = {e.target: e.weight for e in p.view.endpoints}
    assert weights == {"10.244.1.2:8080": 1, "10.244.2.2:8080": 1, "10.244.2.3:8080": 0}
    assert compare(p.expectation, p.view) == []
    out = explain.text("ipvs", [explain.explain(p)])
    assert "draining: no endpoint now, no new connections" in out


def test_affinity_is_read_back_as_persistence() -> None:
    n = IpvsNode(*SCENARIOS["affinity"])
    n.sync()
    (p,) = n.ports()
    assert p.view is not None and p.view.affinity_seconds == 60
    assert p.view.entries == (f"-A {VS} -s rr -p 60",)
    assert compare(p.expectation, p.view) == []
    # Persistence switched off by hand: the affinity is gone.
    t = n.ipvs.types
    key = next(k for k in n.held().virtual if str(k) == VS)
    n.send(t.Op("edit-service", V4, service=t.VirtualServer(key, "rr", 0)))
    assert n.drift() == ["affinity"]
    # The cluster changes the timeout; the kernel is not synced yet.
    n.sync()
    n.set(web(session_affinity="ClientIP", affinity_timeout=30))
    assert n.drift() == ["affinity"]


def test_no_endpoints_are_refused_where_the_virtual_service_has_no_real_server() -> None:
    n = IpvsNode(*SCENARIOS["no-endpoints"])
    n.sync()
    out = explain.text("ipvs", [explain.explain(p) for p in n.ports()])
    assert "new connections to 10.96.88.59:80/TCP are refused" in out
    assert "new connections to node port 30081/TCP are refused" in out
    assert "3. endpoint choice: no endpoints" in out
    assert "drift: none" in out


def test_endpoints_of_another_node_only_are_programmed_as_the_cluster_says() -> None:
    n = IpvsNode(web(), slice_of("web", ("10.244.2.2", OTHER)))
    n.sync()
    (p,) = n.ports()
    assert p.view is not None and [e.target for e in p.view.endpoints] == ["10.244.2.2:8080"]
    assert n.backend.inspect(spn("nope")) == []
