"""``kubeplex explain`` and ``kubeplex migrate --check`` in ebpf mode without root (every
scenario and dual-stack are in test_explain.py, for every mode): the mode-neutral expectation,
as a mode that load-balances at the socket programs it, against the maps of ``FakeEbpfMaps``;
drift after entries and slots are deleted by hand; the switch from and to a netfilter mode,
read from the two backends' capabilities and metric families."""

from __future__ import annotations

import json

from kits.explain_kit import NODE, OTHER, SCENARIOS, THREE, V4, Node, slice_of, web

from kubeplex.backends.ebpf import layout
from kubeplex.core.cli import explain, inspecting, preflight
from kubeplex.core.cli.inspecting import PortState
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import Backend, BackendContext
from kubeplex.core.dataplane.drift import compare, read_entry
from kubeplex.core.model.expectations import REJECT, SOCKET_LOAD_BALANCING
from kubeplex.testing import fakes
from kubeplex.testing.dataplane import endpoint_slice


class EbpfNode(Node):
    def __init__(self, *objects: object, dual: bool = False) -> None:
        super().__init__("ebpf", *objects, dual=dual)  # type: ignore[arg-type]

    @property
    def maps(self) -> fakes.FakeEbpfMaps:
        assert isinstance(self.kernel, fakes.FakeEbpfMaps)
        return self.kernel

    def ports(self) -> list[PortState]:
        return explain.for_mode(super().ports(), self.backend.capabilities)

    def fresh(self) -> Backend:
        """A backend as the commands make one: nothing rendered yet, on the same maps."""
        ctx = BackendContext(self.config, NODE, self.backend.ctx.families, kernel=self.kernel)
        return plugins.load_backend("ebpf", ctx)


def web_entry() -> bytes:
    """The key of web's ClusterIP entry in kpx_svc4."""
    return layout.SVC4_KEY.pack(bytes([10, 96, 88, 59]), (80).to_bytes(2, "big"), 6)


def test_the_socket_neither_masquerades_nor_drops() -> None:
    assert SOCKET_LOAD_BALANCING in EbpfNode().backend.capabilities
    n = EbpfNode(*SCENARIOS["internal-local-without-local"])
    n.sync()
    (p,) = n.ports()
    assert p.expectation is not None and p.view is not None
    # Upstream drops it; the program refuses the connect.
    assert [f.verdict for f in p.expectation.frontends] == [REJECT]
    assert p.expectation.masquerade is False and p.expectation.masquerade_reasons == ()
    (entry,) = p.view.entries
    assert entry.endswith("count 0 refused (REJECT)") and read_entry(entry).verdict == REJECT


def test_the_ipv6_entries_are_in_their_own_map() -> None:
    n = EbpfNode(web(secondary_cluster_ip="fd00:96::59"), slice_of("web", *THREE), dual=True)
    n.sync()
    v4, v6 = n.ports()
    assert v4.view is not None and v6.view is not None
    assert v4.view.entries[0].startswith("kpx_svc4 10.96.88.59:80/tcp -> svc ")
    assert v6.view.entries[0].startswith("kpx_svc6 [fd00:96::59]:80/tcp -> svc ")
    assert v6.view.objects != v4.view.objects  # an id per family


def test_a_fresh_backend_reads_the_maps_once_primed() -> None:
    n = EbpfNode(*SCENARIOS["nodeport"])
    n.sync()
    sent = len(n.maps.sent)
    n.backend = n.fresh()
    inspecting.prime(n.backend, n.state())
    assert len(n.maps.sent) == sent  # a render only
    (p,) = n.ports()
    assert p.view is not None and len(p.view.entries) == 2
    assert compare(p.expectation, p.view) == []


def test_an_entry_or_a_slot_deleted_by_hand_is_drift() -> None:
    n = EbpfNode(*SCENARIOS["clusterip"])
    n.sync()
    (p,) = n.ports()
    assert p.view is not None
    svc_id = int(p.view.objects[0].split()[1], 16)
    n.maps.delete(layout.BACKENDS.name, layout.backend_key(svc_id, 2))
    assert n.drift() == ["missing-endpoint"]
    n.maps.delete(layout.SVC4.name, web_entry())
    assert n.drift() == ["not-programmed"]


def test_endpoints_changed_and_not_synced_are_drift() -> None:
    n = EbpfNode(*SCENARIOS["clusterip"])
    n.sync()
    n.set(slice_of("web", *THREE[:2], ("10.244.2.9", OTHER)))
    assert sorted(n.drift()) == ["missing-endpoint", "stale-endpoint"]
    n.set(endpoint_slice("web", [], port=8080))
    assert sorted(set(n.drift())) == ["stale-endpoint", "wrong-verdict"]
    n.sync()
    assert n.drift() == []


def test_explain_text_in_ebpf_mode() -> None:
    n = EbpfNode(*SCENARIOS["affinity"])
    n.sync()
    reports = [explain.explain(p) for p in n.ports()]
    out = explain.text("ebpf", reports)
    assert "default/web (TCP, IPv4), mode ebpf" in out
    assert "kpx_svc4 10.96.88.59:80/tcp -> svc 0x" in out and "timeout 60" in out
    assert "2. the Service's own objects: svc 0x" in out
    assert "3. endpoint choice: 3 endpoints" in out and "share 33.3%" in out
    assert "5. masquerade: no in the kernel; kubeplex masquerades: never" in out
    assert "drift: none" in out
    json.dumps(reports)

    empty = EbpfNode(*SCENARIOS["no-endpoints"])
    empty.sync()
    out = explain.text("ebpf", [explain.explain(p) for p in empty.ports()])
    assert "new connections to 10.96.88.59:80/TCP are refused" in out
    assert "new connections to node port 30081/TCP are refused" in out


# --- migrate --check -----------------------------------------------------------------------


def backend_of(n: Node, mode: str) -> Backend:
    ctx = BackendContext(n.config, NODE, (V4,), kernel=fakes.for_mode(mode))
    return plugins.load_backend(mode, ctx)


def check(n: Node, target: Backend) -> preflight.Report:
    """The comparison as the command makes it: of the expectations as they are (the check
    applies each mode's capabilities itself)."""
    return preflight.check(n.config, n.config, n.backend, target, Node.ports(n))


def test_iptables_to_ebpf_lists_the_socket_the_lost_capabilities_and_metrics() -> None:
    n = Node("iptables", *SCENARIOS["source-ranges"])
    n.sync()
    report = check(n, backend_of(n, "ebpf"))
    found = {(d["kind"], d["what"]): d for d in report.differences}
    socket = found["capability", SOCKET_LOAD_BALANCING]
    assert "neither DNATed nor masqueraded" in socket["message"]
    assert socket["affects"] == ["default/web (IPv4)"]
    for lost in ("localhost-nodeports", "load-balancer-source-ranges"):
        assert ("capability", lost) in found
    assert ("metric", "kubeproxy_sync_proxy_rules_iptables_total") in found
    assert not [k for k in found if k[0] == "kernel"]
    assert "new metric: kubeproxy_sync_proxy_rules_ebpf_map_entries" in report.notes
    assert not any("conntrack" in note for note in report.notes)  # both clean it
    (svc,) = report.services
    assert svc["masquerade"] == {"now": True, "after": False}
    assert svc["endpoints"]["now"] == svc["endpoints"]["after"] and not svc["same"]


def test_ebpf_to_nftables_reads_the_maps_back() -> None:
    n = EbpfNode(*SCENARIOS["external-local-without-local"])
    n.sync()
    n.backend = n.fresh()
    report = check(n, backend_of(n, "nftables"))
    found = {(d["kind"], d["what"]): d for d in report.differences}
    assert not [k for k in found if k[0] == "kernel"], report.differences
    assert (
        "DNATed by the kernel's rules again"
        in found["capability", SOCKET_LOAD_BALANCING]["message"]
    )
    assert ("metric", "kubeproxy_sync_proxy_rules_ebpf_map_entries") in found
    (svc,) = report.services
    assert svc["masquerade"] == {"now": False, "after": True}
    after = {f["kind"]: (f["now"], f["after"]) for f in svc["frontends"]}
    # The node's own connections to the NodePort went to the cluster's endpoints; nftables
    # drops outside traffic there (Local policy, no local endpoint).
    assert after["NodePort"] == (["forward"], "drop")
    assert preflight.text(report).count("DIFFERS") == 1
