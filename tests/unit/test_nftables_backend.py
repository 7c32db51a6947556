"""The nftables backend as a plugin: its registration and capabilities, a render that
never touches the kernel, and the cleanup-failures metric.
"""

from __future__ import annotations

from typing import Any

from kits.nftables_kit import NODE, UPSTREAM, Harness, config, many_services, overall_objects
from kits.render_kit import V4, endpoint_slice, ep

from kubeplex.backends.nftables import NftablesBackend
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import BackendContext
from kubeplex.core.model.cluster import ClusterState


class NoKernel:
    """A kernel seam that must not be used (render is pure)."""

    writes = ("run", "run_stages")

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the kernel was used: {name}")


def test_backend_registration_and_capabilities() -> None:
    assert "nftables" in plugins.available()
    backend = plugins.load_backend("nftables", BackendContext(config(UPSTREAM), NODE))
    assert isinstance(backend, NftablesBackend)
    assert backend.required_tools == ("nft",)
    assert "localhost-nodeports" not in backend.capabilities
    assert {
        "session-affinity",
        "sctp",
        "ipv6",
        "load-balancer-source-ranges",
    } <= backend.capabilities
    assert any("kube-proxy" in line for line in backend.describe())


def test_render_is_pure() -> None:
    # No kernel is touched by render: a backend without any kernel renders fine.
    backend = NftablesBackend(BackendContext(config(UPSTREAM), NODE, (V4,), kernel=NoKernel()))
    cluster = ClusterState(NODE, (V4,))
    for obj in overall_objects():
        {
            "Service": cluster.set_service,
            "EndpointSlice": cluster.set_endpoint_slice,
            "Node": cluster.set_node,
        }[obj["kind"]](obj)
    assert "service-ULMVA6XW-ns1/svc1/tcp/p80" in str(backend.render(cluster.checkout(full=True)))


def test_cleanup_failures_reach_the_metric() -> None:
    """nftables_cleanup_failures_total counts stale chains that could not be deleted and
    listings of the table that failed (no leftovers removed), per family, through the next
    successful sync's samples."""
    from kubeplex.core.daemon.metrics import ProxyMetrics
    from kubeplex.core.daemon.proxier import Proxier

    h = Harness(many_services(3))
    metrics = ProxyMetrics(h.backend, process_collectors=False)
    proxier = Proxier(h.cluster, h.backend)
    proxier.listeners.append(metrics.sync_listener)
    name = "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total"
    assert proxier.sync()
    assert not metrics.value(name, {"ip_family": "IPv4"})  # (unset: never counted)
    # A listing that fails on a full sync.
    h.kernel.fail_listing = True
    assert proxier.sync(full=True)
    assert metrics.value(name, {"ip_family": "IPv4"}) == 1
    h.kernel.fail_listing = False
    # Stale chains whose deletion the kernel refuses (kept for the next sync).
    renderer = h.backend.renderers[V4]
    renderer.pending_chain_deletes = {"endpoint-GONE"}
    h.feed([endpoint_slice("ns1", "web", [ep("10.0.1.7", NODE)])])
    h.kernel.refuse = "nft -f failed: Device or resource busy"
    assert proxier.sync()
    assert metrics.value(name, {"ip_family": "IPv4"}) == 2
    assert renderer.pending_chain_deletes == {"endpoint-GONE"}
    renderer.pending_chain_deletes.clear()
    assert proxier.sync(full=True)  # nothing failed: nothing counted
    assert metrics.value(name, {"ip_family": "IPv4"}) == 2
