"""One node's cluster state and a backend on an in-memory kernel, and the scenarios every mode
must program as the mode-neutral expectation says: what ``kubeplex explain`` and ``kubeplex
migrate --check`` are tested on."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kubeplex.core.cli import explain
from kubeplex.core.cli.inspecting import PortState, port_states, served_ports
from kubeplex.core.config.kubeproxy import KubeProxyConfiguration
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import Backend, BackendContext
from kubeplex.core.dataplane.drift import compare
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.graph import ProxyState
from kubeplex.core.model.types import IPFamily, ServicePortName
from kubeplex.testing import fakes
from kubeplex.testing.dataplane import (
    CLUSTER_CIDR_DUAL_STACK,
    endpoint,
    endpoint_slice,
    lab_config,
    node_object,
    service,
)
from kubeplex.testing.fakes import FakeIpvs

NODE = "kind-worker"
OTHER = "kind-worker2"
V4, V6 = IPFamily.IPv4, IPFamily.IPv6


def node() -> dict[str, Any]:
    return node_object(
        NODE,
        "172.18.0.5",
        "10.244.1.0/24",
        zone="zone-a",
        host_ip6="fd00:18::5",
        pod_cidr6="fd00:10:244:1::/64",
    )


def web(name: str = "web", ip: str = "10.96.88.59", **kw: Any) -> dict[str, Any]:
    return service(name, ip, 80, target_port=8080, **kw)


def slice_of(name: str, *ips: tuple[str, str], **kw: Any) -> dict[str, Any]:
    return endpoint_slice(name, [endpoint(ip, n, **kw) for ip, n in ips], port=8080)


THREE = (("10.244.1.2", NODE), ("10.244.2.2", OTHER), ("10.244.2.3", OTHER))
REMOTE = (("10.244.2.2", OTHER), ("10.244.2.3", OTHER))

#: Scenarios every mode must program as the expectation says (name -> objects).
SCENARIOS: dict[str, Sequence[Mapping[str, Any]]] = {
    "clusterip": [web(), slice_of("web", *THREE)],
    "nodeport": [
        web(type="NodePort", node_port=30080),
        slice_of("web", *THREE),
    ],
    "no-endpoints": [web(type="NodePort", node_port=30081)],
    "affinity": [
        web(session_affinity="ClientIP", affinity_timeout=60),
        slice_of("web", *THREE),
    ],
    "external-local-with-local": [
        web(type="NodePort", node_port=30082, external_traffic_policy="Local"),
        slice_of("web", *THREE),
    ],
    "external-local-without-local": [
        web(
            type="LoadBalancer",
            node_port=30083,
            external_traffic_policy="Local",
            load_balancer_ips=["192.0.2.10"],
            health_check_node_port=32000,
        ),
        slice_of("web", *REMOTE),
    ],
    "internal-local-without-local": [
        web(internal_traffic_policy="Local"),
        slice_of("web", *REMOTE),
    ],
    "external-ips": [web(external_ips=["192.0.2.20"]), slice_of("web", *THREE)],
    "source-ranges": [
        web(
            type="LoadBalancer",
            node_port=30084,
            load_balancer_ips=["192.0.2.30"],
            load_balancer_source_ranges=["203.0.113.0/24"],
        ),
        slice_of("web", *THREE),
    ],
    "terminating-only": [
        web(),
        slice_of("web", *REMOTE, ready=False, serving=True, terminating=True),
    ],
    "udp": [
        service("dns", "10.96.0.10", 53, protocol="UDP"),
        endpoint_slice("dns", [endpoint("10.244.2.2", OTHER)], port=53, protocol="UDP"),
    ],
}


class Node:
    """One node's cluster state and a backend on an in-memory kernel."""

    def __init__(self, mode: str, *objects: Mapping[str, Any], dual: bool = False) -> None:
        families = (V4, V6) if dual else (V4,)
        cidr = CLUSTER_CIDR_DUAL_STACK if dual else "10.244.0.0/16"
        self.config: KubeProxyConfiguration = lab_config(mode, cluster_cidr=cidr)
        self.kernel = fakes.for_mode(mode)
        ctx = BackendContext(self.config, NODE, families, kernel=self.kernel)
        self.backend: Backend = plugins.load_backend(mode, ctx)
        self.cluster = ClusterState(NODE, families)
        self.set(node(), *objects)

    def set(self, *objects: Mapping[str, Any]) -> None:
        for obj in objects:
            {
                "Service": self.cluster.set_service,
                "EndpointSlice": self.cluster.set_endpoint_slice,
                "Node": self.cluster.set_node,
            }[obj["kind"]](obj)

    def state(self) -> ProxyState:
        return self.cluster.checkout(full=True)

    def sync(self) -> None:
        self.backend.sync(self.state())

    def ports(self) -> list[PortState]:
        state = self.state()
        found = port_states(self.config, state, self.backend, served_ports(state))
        assert found is not None
        return found

    def drift(self) -> list[str]:
        return [d.kind for p in self.ports() for d in compare(p.expectation, p.view)]


def spn(name: str = "web", protocol: str = "TCP") -> ServicePortName:
    return ServicePortName("default", name, "", protocol)  # type: ignore[arg-type]


NODE_IP = "172.18.0.5"


class IpvsNode(Node):
    """A node in ipvs mode whose kernel has the Node's address (NodePorts are served on the
    node's addresses, so a kernel without one would have none)."""

    def __init__(self, *objects: Mapping[str, Any]) -> None:
        super().__init__("ipvs", *objects)
        self.kernel = FakeIpvs(addresses=(NODE_IP,))
        self.backend = self.fresh()

    def fresh(self) -> Backend:
        """A backend as ``kubeplex explain`` makes one: nothing rendered yet."""
        ctx = BackendContext(self.config, NODE, (V4,), kernel=self.kernel)
        return plugins.load_backend("ipvs", ctx)

    @property
    def ipvs(self) -> FakeIpvs:
        assert isinstance(self.kernel, FakeIpvs)
        return self.kernel

    def ports(self) -> list[PortState]:
        state = self.state()
        found = port_states(self.config, state, self.backend, served_ports(state))
        assert found is not None
        return explain.for_mode(found, self.backend.capabilities)

    def send(self, *ops: Any) -> None:
        self.ipvs.send(V4, list(ops))

    def held(self) -> Any:
        return self.ipvs.dump(V4)
