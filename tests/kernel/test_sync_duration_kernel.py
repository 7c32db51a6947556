"""Each IP family's sync duration is its own, as upstream's proxier per family observes it:
on a single-stack IPv4 cluster the IPv6 histogram does not repeat the IPv4 value."""

from __future__ import annotations

import pytest

from kubeplex.core.config.kubeproxy import default_config
from kubeplex.core.daemon.metrics import ProxyMetrics
from kubeplex.core.daemon.proxier import Proxier
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import BackendContext
from kubeplex.core.model.cluster import ClusterState
from kubeplex.testing.dataplane import endpoint, endpoint_slice, node_object, service

pytestmark = pytest.mark.kernel

NODE = "node-a"
SERVICES = 300
DURATION = "kubeproxy_sync_proxy_rules_duration_seconds"


@pytest.mark.parametrize("mode", ["iptables", "nftables"])
def test_the_ipv6_sync_duration_is_its_own(netns: str, mode: str) -> None:
    cluster = ClusterState(NODE)
    cluster.set_node(node_object(NODE, "192.168.0.10", "10.244.0.0/24"))
    for i in range(SERVICES):
        name = f"svc{i}"
        cluster.set_service(service(name, f"10.96.{i // 250}.{i % 250 + 1}"))
        cluster.set_endpoint_slice(endpoint_slice(name, [endpoint(f"10.244.1.{i % 250 + 1}")]))
    cfg = default_config()
    backend = plugins.load_backend(mode, BackendContext(cfg, NODE, netns=netns))
    metrics = ProxyMetrics(backend, process_collectors=False)
    proxier = Proxier(cluster, backend)
    proxier.listeners.append(metrics.sync_listener)
    try:
        backend.prepare()
        assert proxier.sync(full=True)
        v4 = metrics.value(f"{DURATION}_sum", {"ip_family": "IPv4"})
        v6 = metrics.value(f"{DURATION}_sum", {"ip_family": "IPv6"})
        assert v4 is not None and v6 is not None
        # IPv6 has no Service: its part (the fixed chains) is a fraction of IPv4's 300.
        assert v6 < v4 / 2, (v4, v6)
    finally:
        backend.cleanup()
