"""Shared pieces of the render tests (iptables, nftables, kernelspace): object builders, a
harness that feeds objects into a ClusterState and renders through a backend, golden files.

The builders write the objects upstream kube-proxy's tests use; each test module keeps thin
wrappers where its defaults differ (node name, namespace, endpoint conditions, ...).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

import pytest
import yaml

import kubeplex.testing
from kubeplex.core.config.kubeproxy import DEFAULT_KNOWN_MODES, KubeProxyConfiguration, parse_config
from kubeplex.core.dataplane.backend import Backend, BackendContext
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.types import IPFamily
from kubeplex.core.sources.manifests import ManifestSource

V4, V6 = IPFamily.IPv4, IPFamily.IPv6
#: upstream's fake proxier's node (iptables and winkernel tests; nftables uses "test-node").
NODE = "test-hostname"
NODE_IP = "192.168.0.2"
LAB = Path(kubeplex.testing.__file__).parent / "lab"
UPDATE_GOLDEN = os.environ.get("KUBEPLEX_UPDATE_GOLDEN") == "1"


# --- objects ------------------------------------------------------------------------------------


def config(
    fields: Mapping[str, Any], *, known_modes: Iterable[str] = DEFAULT_KNOWN_MODES
) -> KubeProxyConfiguration:
    doc = {"apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration"}
    return parse_config(yaml.safe_dump({**doc, **fields}), "test config", known_modes)


def port(
    port: int = 80, name: str = "p80", protocol: str = "TCP", node_port: int | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "port": port, "protocol": protocol}
    if node_port is not None:
        out["nodePort"] = node_port
    return out


def service(
    ns: str,
    name: str,
    cluster_ip: str,
    ports: Sequence[dict[str, Any]],
    *,
    ingress: Sequence[str] = (),
    **spec: Any,
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"clusterIP": cluster_ip, "ports": list(ports), **spec},
    }
    if ingress:
        obj["status"] = {"loadBalancer": {"ingress": [{"ip": ip} for ip in ingress]}}
    return obj


def ep(
    ip: str,
    node: str | None = None,
    *,
    ready: bool | None = None,
    serving: bool | None = None,
    terminating: bool | None = None,
) -> dict[str, Any]:
    """An endpoint; only the conditions given (not None) are written."""
    out: dict[str, Any] = {"addresses": [ip]}
    conditions = {
        k: v
        for k, v in (("ready", ready), ("serving", serving), ("terminating", terminating))
        if v is not None
    }
    if conditions:
        out["conditions"] = conditions
    if node is not None:
        out["nodeName"] = node
    return out


def endpoint_slice(
    ns: str,
    svc: str,
    endpoints: Sequence[dict[str, Any]],
    ports: Sequence[dict[str, Any]] = (port(),),
    *,
    family: str = "IPv4",
    name: str | None = None,
) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name or f"{svc}-1",
            "namespace": ns,
            "labels": {"kubernetes.io/service-name": svc},
        },
        "addressType": family,
        "ports": [{k: v for k, v in p.items() if k != "nodePort"} for p in ports],
        "endpoints": list(endpoints),
    }


def service_cidr(cidrs: Sequence[str], name: str = "kubernetes") -> dict[str, Any]:
    """A networking.k8s.io/v1 ServiceCIDR ("kubernetes" is the one the API server makes)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "ServiceCIDR",
        "metadata": {"name": name},
        "spec": {"cidrs": list(cidrs)},
    }


def node_obj(
    addresses: Sequence[str] = (NODE_IP,), pod_cidrs: Sequence[str] = (), name: str = NODE
) -> dict[str, Any]:
    spec: dict[str, Any] = {"podCIDRs": list(pod_cidrs)} if pod_cidrs else {}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
        "spec": spec,
        "status": {"addresses": [{"type": "InternalIP", "address": a} for a in addresses]},
    }


# --- harness ------------------------------------------------------------------------------------

BackendT = TypeVar("BackendT", bound=Backend)
RenderedT = TypeVar("RenderedT")


class RenderHarness(Generic[BackendT, RenderedT]):
    """ClusterState + a backend's render, without a kernel.

    ``make_backend`` builds the backend from the context; ``make_config`` turns a mapping of
    KubeProxyConfiguration fields into a configuration (a configuration passes through).
    """

    def __init__(
        self,
        make_backend: Callable[[BackendContext], BackendT],
        objects: Iterable[Mapping[str, Any]],
        cfg: Mapping[str, Any] | KubeProxyConfiguration,
        families: tuple[IPFamily, ...],
        node: str,
        make_config: Callable[[Mapping[str, Any]], KubeProxyConfiguration] = config,
    ) -> None:
        self.cfg = cfg if isinstance(cfg, KubeProxyConfiguration) else make_config(cfg)
        self.cluster = ClusterState(node, families)
        self.backend = make_backend(BackendContext(self.cfg, node, families))
        self.feed(objects)

    def feed(self, objects: Iterable[Mapping[str, Any]]) -> None:
        for obj in objects:
            kind = obj["kind"]
            if kind == "Service":
                self.cluster.set_service(obj)
            elif kind == "EndpointSlice":
                self.cluster.set_endpoint_slice(obj)
            elif kind == "Node":
                self.cluster.set_node(obj)
            elif kind == "ServiceCIDR":
                self.cluster.set_service_cidr(obj)
            else:
                raise AssertionError(f"unexpected kind {kind}")

    def render(self, full: bool = False) -> RenderedT:
        return cast(RenderedT, self.backend.render(self.cluster.checkout(full=full)))


# --- golden files -------------------------------------------------------------------------------


def seed_lab_cluster(node: str = "kind-worker") -> ClusterState:
    """The seed lab's manifests (testing/lab/manifests) loaded for ``node``, dual-stack."""
    cluster = ClusterState(node, (IPFamily.IPv4, IPFamily.IPv6))
    source = ManifestSource(LAB / "manifests", cluster)
    source.load()
    assert not source.problems
    return cluster


def assert_golden_file(path: Path, text: str, differs: str, *, lineterm: str = "") -> None:
    """``text`` must equal the golden file at ``path`` (``KUBEPLEX_UPDATE_GOLDEN=1`` rewrites
    it); on a mismatch the test fails with ``differs`` ("rendered rules differ", ...) and a
    unified diff."""
    if UPDATE_GOLDEN:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    assert path.exists(), f"{path} is missing: run with KUBEPLEX_UPDATE_GOLDEN=1 and review it"
    expected = path.read_text()
    if text != expected:
        diff = "\n".join(
            difflib.unified_diff(
                expected.splitlines(), text.splitlines(), str(path), "rendered", lineterm=lineterm
            )
        )
        pytest.fail(f"{differs} from {path.name}:\n{diff}")


# --- upstream's scenarios (shared by the iptables and nftables tests) ---------------------------


def svc1(
    service_type: str | None = None,
    *,
    ports: Sequence[dict[str, Any]] = (port(node_port=3001),),
    **spec: Any,
) -> dict[str, Any]:
    """ns1/svc1 at 172.30.0.41, port 80 with NodePort 3001: most upstream proxier tests' Service
    (a ``service_type`` of None writes no ``type``)."""
    if service_type is not None:
        spec = {"type": service_type, **spec}
    return service("ns1", "svc1", "172.30.0.41", ports, **spec)


def lb_source_ranges_objects(node: Mapping[str, Any]) -> list[dict[str, Any]]:
    """TestLoadBalancer: two ingress IPs and source ranges, one of them holding the node IP."""
    return [
        dict(node),
        svc1(
            "LoadBalancer",
            loadBalancerSourceRanges=["192.168.0.0/24", " 203.0.113.0/25"],
            ingress=["1.2.3.4", "5.6.7.8"],
        ),
        endpoint_slice("ns1", "svc1", [ep("10.180.0.1")]),
    ]


def overall_objects(
    node: Mapping[str, Any], node_name: str, **svc5_spec: Any
) -> list[dict[str, Any]]:
    """TestOverall{IPTables,NFTables}Rules: ClusterIP, LB (Local), NodePort, ExternalIP, LB with
    source ranges (plus ``svc5_spec``), and a Service without endpoints."""
    return [
        dict(node),
        service("ns1", "svc1", "172.30.0.41", [port()]),
        service(
            "ns2",
            "svc2",
            "172.30.0.42",
            [port(node_port=3001)],
            type="LoadBalancer",
            externalTrafficPolicy="Local",
            externalIPs=["192.168.99.22"],
            healthCheckNodePort=30000,
            ingress=["1.2.3.4"],
        ),
        service("ns3", "svc3", "172.30.0.43", [port(node_port=3003)], type="NodePort"),
        service(
            "ns4", "svc4", "172.30.0.44", [port()], type="NodePort", externalIPs=["192.168.99.33"]
        ),
        service(
            "ns5",
            "svc5",
            "172.30.0.45",
            [port(node_port=3002)],
            type="LoadBalancer",
            externalTrafficPolicy="Cluster",
            healthCheckNodePort=30000,
            # Extra whitespace must not break anything (upstream trims it).
            loadBalancerSourceRanges=[" 203.0.113.0/25"],
            **svc5_spec,
            ingress=["5.6.7.8"],
        ),
        service("ns6", "svc6", "172.30.0.46", [port()]),
        endpoint_slice("ns1", "svc1", [ep("10.180.0.1")]),
        # Not local (no nodeName): svc2 has no local endpoint.
        endpoint_slice("ns2", "svc2", [ep("10.180.0.2")]),
        endpoint_slice("ns3", "svc3", [ep("10.180.0.3")]),
        endpoint_slice("ns4", "svc4", [ep("10.180.0.4"), ep("10.180.0.5", node_name)]),
        endpoint_slice("ns5", "svc5", [ep("10.180.0.3")]),
    ]


def etp_local_objects(node: Mapping[str, Any], node_name: str) -> list[dict[str, Any]]:
    """TestExternalTrafficPolicyLocal: LB + externalIP + NodePort, one local endpoint."""
    return [
        dict(node),
        svc1(
            "LoadBalancer",
            externalTrafficPolicy="Local",
            healthCheckNodePort=30000,
            externalIPs=["192.168.99.11"],
            ingress=["1.2.3.4"],
        ),
        endpoint_slice("ns1", "svc1", [ep("10.180.0.1"), ep("10.180.2.1", node_name)]),
    ]


def terminating_objects(
    node: Mapping[str, Any],
    policy: str,
    endpoints: Sequence[dict[str, Any]],
    *,
    health_check_node_port: int | None = None,
) -> list[dict[str, Any]]:
    """TestTerminatingEndpointsTrafficPolicy{Local,Cluster}: LB with ClientIP affinity (and a
    health check NodePort when given)."""
    hc = {} if health_check_node_port is None else {"healthCheckNodePort": health_check_node_port}
    return [
        dict(node),
        service(
            "ns1",
            "svc1",
            "172.30.1.1",
            [port(name="")],
            type="LoadBalancer",
            externalTrafficPolicy=policy,
            **hc,
            sessionAffinity="ClientIP",
            sessionAffinityConfig={"clientIP": {"timeoutSeconds": 10800}},
            ingress=["1.2.3.4"],
        ),
        endpoint_slice("ns1", "svc1", endpoints, [port(name="")]),
    ]


def dual_stack_svc1() -> list[dict[str, Any]]:
    """ns1/svc1 (port p80) on 172.30.0.41 and fd00:10:96::41, one endpoint in each family."""
    return [
        service(
            "ns1",
            "svc1",
            "172.30.0.41",
            [port()],
            clusterIPs=["172.30.0.41", "fd00:10:96::41"],
            ipFamilies=["IPv4", "IPv6"],
            ipFamilyPolicy="RequireDualStack",
        ),
        endpoint_slice("ns1", "svc1", [ep("10.180.0.1")]),
        endpoint_slice("ns1", "svc1", [ep("fd00:10:180::1")], family="IPv6", name="v6"),
    ]
