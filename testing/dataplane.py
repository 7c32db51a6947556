"""A kit for dataplane tests: program lab nodes in-process and drive them sync by sync.

This is the conformance kit for backend (plugin) authors. It builds a namespace cluster
(``kubeplex.testing.netlab``) and puts a :class:`NodeAgent` on every node: the agent owns one
``ClusterState`` and one ``Proxier`` for the whole life of the node, so a test can change
objects and sync again, exactly as the daemon does after a watch event (partial syncs)::

    with cluster("iptables") as c:
        c.set(
            service("web", "10.96.88.59", 80),
            endpoint_slice("web", c.endpoints("web-a", "web-b"), port=8080),
        )
        assert c.sync()
        print(c.lab.http("client", "10.96.88.59", 80, count=10))
        c.set(endpoint_slice("web", c.endpoints("web-a"), port=8080))
        assert c.agent("kind-worker").sync(full=False)

Objects are plain API-form dicts (what the API server or a manifest holds); the builders below
cover what the proxy reads: ClusterIP / NodePort / LoadBalancer Services, traffic policies,
session affinity, protocols, and EndpointSlices with node names and conditions.

Dual-stack: ``cluster(mode, ipv6=True)`` builds the dual-stack lab (``conformance_spec(
ipv6=True)``), runs the agents for both families with ``clusterCIDR`` of both, and
``endpoints(..., family=IPFamily.IPv6)`` gives the pods' IPv6 addresses::

    with cluster("iptables", ipv6=True) as c:
        c.set(
            service("web", "10.96.88.59", 80, secondary_cluster_ip="fd00:96::59"),
            endpoint_slice("web-v6", c.endpoints("web-a", family=IPFamily.IPv6), ...),
        )

Everything a cluster creates lives in the lab's namespaces and goes with them: ``cluster()``
tears the lab down even when the body raises.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from kubeplex.core.config.kubeproxy import (
    API_VERSION,
    KIND,
    KubeProxyConfiguration,
    parse_config,
    with_overrides,
)
from kubeplex.core.daemon.proxier import Proxier
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import Backend, BackendContext, CleanupReport, SyncResult
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.errors import InvalidObject, KubeplexError
from kubeplex.core.model.graph import ProxyState
from kubeplex.core.model.types import IPFamily, family_of
from kubeplex.testing.netlab import (
    NODE2,
    UDP_PORT,
    Lab,
    LabSpec,
    NodeSpec,
    PodSpec,
    default_spec,
    unique_prefix,
)

log = logging.getLogger(__name__)

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
HOSTNAME_LABEL = "kubernetes.io/hostname"
ZONE_LABEL = "topology.kubernetes.io/zone"
CLUSTER_CIDR = "10.244.0.0/16"
#: clusterCIDR of the dual-stack lab (its pod CIDRs are fd00:10:244:{1,2}::/64).
CLUSTER_CIDR_DUAL_STACK = "10.244.0.0/16,fd00:10:244::/56"
DUAL_STACK = (IPFamily.IPv4, IPFamily.IPv6)

#: The fourth web pod of the conformance lab (for scaling from three endpoints to four).
WEB_D = "web-d"
WEB_D_IP = "10.244.2.4"
WEB_D_IP6 = "fd00:10:244:2::4"

__all__ = [
    "CLUSTER_CIDR",
    "CLUSTER_CIDR_DUAL_STACK",
    "DUAL_STACK",
    "WEB_D",
    "DataplaneCluster",
    "DataplaneError",
    "DataplaneUnavailable",
    "NodeAgent",
    "cluster",
    "conformance_spec",
    "endpoint",
    "endpoint_slice",
    "lab_config",
    "node_object",
    "service",
]


class DataplaneError(RuntimeError):
    """An object was rejected, or a kit operation was used wrongly."""


class DataplaneUnavailable(DataplaneError):
    """The mode's backend is not installed, or this machine lacks what it needs."""


# ------------------------------------------------------------------------------------ builders


def _meta(name: str, namespace: str | None, labels: Mapping[str, str] | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    if labels:
        meta["labels"] = dict(labels)
    return meta


def service(
    name: str,
    cluster_ip: str,
    port: int = 80,
    *,
    target_port: int | None = None,
    namespace: str = "default",
    protocol: str = "TCP",
    port_name: str = "",
    type: str = "ClusterIP",
    node_port: int | None = None,
    external_traffic_policy: str | None = None,
    internal_traffic_policy: str | None = None,
    session_affinity: str | None = None,
    affinity_timeout: int | None = None,
    external_ips: Sequence[str] = (),
    load_balancer_ips: Sequence[str] = (),
    load_balancer_source_ranges: Sequence[str] = (),
    health_check_node_port: int | None = None,
    secondary_cluster_ip: str | None = None,
    ip_family_policy: str | None = None,
) -> dict[str, Any]:
    """A v1 Service with one port.

    ``type`` is ClusterIP, NodePort or LoadBalancer; ``node_port`` needs one of the latter two.
    ``load_balancer_ips`` become ``status.loadBalancer.ingress`` (ipMode VIP), as a cloud
    controller would write them. ``session_affinity="ClientIP"`` with ``affinity_timeout``
    (seconds) sets ``sessionAffinityConfig``.

    ``secondary_cluster_ip`` (the other family's address) makes it dual-stack: ``clusterIPs``
    holds both, ``ipFamilies`` follows them and ``ipFamilyPolicy`` is RequireDualStack unless
    ``ip_family_policy`` says otherwise. An IPv6 ``cluster_ip`` alone gives ipFamilies [IPv6].
    """
    svc_port: dict[str, Any] = {
        "port": port,
        "targetPort": target_port if target_port is not None else port,
        "protocol": protocol,
    }
    if port_name:
        svc_port["name"] = port_name
    if node_port is not None:
        svc_port["nodePort"] = node_port
    cluster_ips = (
        [cluster_ip] if secondary_cluster_ip is None else [cluster_ip, secondary_cluster_ip]
    )
    spec: dict[str, Any] = {
        "type": type,
        "clusterIP": cluster_ip,
        "clusterIPs": cluster_ips,
        "ports": [svc_port],
    }
    if secondary_cluster_ip is not None or ":" in cluster_ip:
        spec["ipFamilies"] = [family_of(ip).value for ip in cluster_ips]
    if ip_family_policy is not None or secondary_cluster_ip is not None:
        spec["ipFamilyPolicy"] = ip_family_policy or "RequireDualStack"
    if external_traffic_policy is not None:
        spec["externalTrafficPolicy"] = external_traffic_policy
    if internal_traffic_policy is not None:
        spec["internalTrafficPolicy"] = internal_traffic_policy
    if session_affinity is not None:
        spec["sessionAffinity"] = session_affinity
        if affinity_timeout is not None:
            spec["sessionAffinityConfig"] = {"clientIP": {"timeoutSeconds": affinity_timeout}}
    if external_ips:
        spec["externalIPs"] = list(external_ips)
    if load_balancer_source_ranges:
        spec["loadBalancerSourceRanges"] = list(load_balancer_source_ranges)
    if health_check_node_port is not None:
        spec["healthCheckNodePort"] = health_check_node_port
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(name, namespace, None),
        "spec": spec,
    }
    if load_balancer_ips:
        obj["status"] = {
            "loadBalancer": {"ingress": [{"ip": ip, "ipMode": "VIP"} for ip in load_balancer_ips]}
        }
    return obj


def endpoint(
    ip: str,
    node: str | None = None,
    *,
    ready: bool = True,
    serving: bool | None = None,
    terminating: bool = False,
    zone: str | None = None,
) -> dict[str, Any]:
    """One EndpointSlice endpoint; ``serving`` defaults to ``ready`` (as for a live pod)."""
    ep: dict[str, Any] = {
        "addresses": [ip],
        "conditions": {
            "ready": ready,
            "serving": ready if serving is None else serving,
            "terminating": terminating,
        },
    }
    if node is not None:
        ep["nodeName"] = node
    if zone is not None:
        ep["zone"] = zone
    return ep


def endpoint_slice(
    service_name: str,
    endpoints: Iterable[Mapping[str, Any]],
    port: int = 8080,
    *,
    namespace: str = "default",
    name: str | None = None,
    protocol: str = "TCP",
    port_name: str = "",
    address_type: str = "IPv4",
) -> dict[str, Any]:
    """A discovery.k8s.io/v1 EndpointSlice of ``service_name`` (named ``<service>-slice``)."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": _meta(
            name or f"{service_name}-slice", namespace, {SERVICE_NAME_LABEL: service_name}
        ),
        "addressType": address_type,
        "ports": [{"name": port_name, "port": port, "protocol": protocol}],
        "endpoints": [dict(ep) for ep in endpoints],
    }


def node_object(
    name: str,
    host_ip: str,
    pod_cidr: str,
    *,
    zone: str | None = None,
    host_ip6: str | None = None,
    pod_cidr6: str | None = None,
) -> dict[str, Any]:
    """A v1 Node as the kubelet reports it: InternalIP, podCIDR, hostname (and zone) labels.

    A dual-stack node also has ``host_ip6`` (a second InternalIP) and ``pod_cidr6``.
    """
    labels = {HOSTNAME_LABEL: name}
    if zone is not None:
        labels[ZONE_LABEL] = zone
    pod_cidrs = [pod_cidr] + ([pod_cidr6] if pod_cidr6 else [])
    addresses = [{"type": "InternalIP", "address": host_ip}]
    if host_ip6:
        addresses.append({"type": "InternalIP", "address": host_ip6})
    addresses.append({"type": "Hostname", "address": name})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": _meta(name, None, labels),
        "spec": {"podCIDR": pod_cidr, "podCIDRs": pod_cidrs},
        "status": {"addresses": addresses},
    }


def lab_config(
    mode: str,
    *,
    cluster_cidr: str = CLUSTER_CIDR,
    extra: Mapping[str, Any] | None = None,
) -> KubeProxyConfiguration:
    """A KubeProxyConfiguration as a kind node has it; ``extra`` adds top-level fields."""
    doc: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "mode": mode,
        "clusterCIDR": cluster_cidr,
        **(extra or {}),
    }
    return parse_config(yaml.safe_dump(doc), "<dataplane lab config>", plugins.known_modes())


def conformance_spec(*, ipv6: bool = False) -> LabSpec:
    """The seed lab plus a fourth web pod ``web-d`` (10.244.2.4 on kind-worker2).

    Every web pod serves HTTP on 8080 and UDP on 8081; which of them are endpoints of which
    Service is up to the test's EndpointSlices. ``ipv6=True``: the dual-stack lab
    (``default_spec(ipv6=True)``), web-d also has fd00:10:244:2::4.
    """
    base = default_spec(ipv6=ipv6)
    extra = PodSpec(WEB_D, NODE2, WEB_D_IP, udp_ports=(UDP_PORT,), ip6=WEB_D_IP6 if ipv6 else None)
    return replace(base, pods=(*base.pods, extra))


# ---------------------------------------------------------------------------------------- agent


def _zone_of(spec: LabSpec, node: NodeSpec) -> str:
    return f"zone-{'abcdefghijklmnopqrstuvwxyz'[spec.nodes.index(node) % 26]}"


class NodeAgent:
    """kube-proxy of one lab node, in-process: a ClusterState and a Proxier that persist.

    Objects are fed with ``set``/``delete`` (like watch events); ``sync`` runs one sync as the
    daemon would (the first one, and the one after a failure, are full). The node's own Node
    object (addresses, pod CIDR, zone label) is set at construction from the lab spec.
    """

    def __init__(
        self,
        lab: Lab,
        node: str,
        mode: str,
        *,
        config: KubeProxyConfiguration | None = None,
        families: tuple[IPFamily, ...] = (IPFamily.IPv4,),
    ) -> None:
        self.lab = lab
        self.node = node
        self.mode = mode
        self.netns = lab.namespace_of(node)
        if mode not in plugins.available():
            installed = ", ".join(sorted(plugins.available())) or "none"
            raise DataplaneUnavailable(f"mode {mode!r}: no backend installed ({installed})")
        base = config if config is not None else lab_config(mode)
        # Re-defaulted for the mode (e.g. nftables' nodePortAddresses), as --proxy-mode does.
        self.config = with_overrides(
            base, mode=mode, hostname_override=node, known_modes=plugins.known_modes()
        )
        try:
            self.backend: Backend = plugins.load_backend(
                mode,
                BackendContext(
                    self.config,
                    node,
                    families,
                    netns=self.netns,
                    cgroup=lab.cgroup_of(node),
                    bpffs=lab.bpffs_of(node),
                ),
            )
        except KubeplexError as err:
            raise DataplaneUnavailable(str(err)) from err
        missing = self.backend.missing_requirements()
        if missing:
            raise DataplaneUnavailable(f"mode {mode}: {'; '.join(missing)}")
        self.state = ClusterState(node, families)
        self.proxier = Proxier(self.state, self.backend)
        #: Every successful sync's result, oldest first.
        self.results: list[SyncResult] = []
        self.proxier.listeners.append(self._record)
        self._prepared = False
        spec_node = lab.spec.node(node)
        self.set(
            node_object(
                node,
                spec_node.host_ip,
                spec_node.pod_cidr,
                zone=_zone_of(lab.spec, spec_node),
                host_ip6=spec_node.host_ip6,
                pod_cidr6=spec_node.pod_cidr6,
            )
        )

    def _record(self, state: ProxyState, result: SyncResult, elapsed: float) -> None:
        self.results.append(result)

    def __repr__(self) -> str:
        return f"NodeAgent({self.node!r}, mode={self.mode!r}, netns={self.netns!r})"

    # --- objects ------------------------------------------------------------------------------

    def set(self, *objects: Mapping[str, Any]) -> None:
        """Add or update Services, EndpointSlices and Nodes; a rejected object raises."""
        for obj in objects:
            kind = obj.get("kind")
            if kind == "Service":
                self.state.set_service(obj)
            elif kind == "EndpointSlice":
                self.state.set_endpoint_slice(obj)
            elif kind == "Node":
                self.state.set_node(obj)
            else:
                raise DataplaneError(f"cannot set a {kind!r}: Service, EndpointSlice or Node")
            meta = obj.get("metadata") or {}
            key = (
                f"Node {meta.get('name')}"
                if kind == "Node"
                else f"{kind} {meta.get('namespace', 'default')}/{meta.get('name')}"
            )
            err: InvalidObject | None = self.state.invalid.get(key)
            if err is not None:
                raise DataplaneError(f"{self.node}: rejected {err}")

    def delete(self, kind: str, namespace: str, name: str) -> None:
        """Delete a Service or an EndpointSlice."""
        if kind == "Service":
            self.state.delete_service(namespace, name)
        elif kind == "EndpointSlice":
            self.state.delete_endpoint_slice(namespace, name)
        else:
            raise DataplaneError(f"cannot delete a {kind!r}: Service or EndpointSlice")

    # --- syncing ------------------------------------------------------------------------------

    def sync(self, full: bool = False) -> bool:
        """One sync; False if it failed (the previous rules then stay, ``last_error`` says why).

        A sync with nothing pending does nothing and returns True.
        """
        if not self._prepared:
            self.backend.prepare()
            self._prepared = True
        return bool(self.proxier.sync(full=full))

    @property
    def last_result(self) -> SyncResult | None:
        """The result of the last successful sync (``.full``: was it a full one)."""
        return self.results[-1] if self.results else None

    @property
    def last_error(self) -> str:
        return str(self.proxier.status.last_error)

    def cleanup(self, keep: Collection[str] = (), drain: bool = False) -> CleanupReport:
        """Remove everything the backend programmed on this node (``kubeplex cleanup``), and
        say what was removed.

        The agent keeps its objects; ``sync(full=True)`` programs them all again.
        """
        return self.backend.cleanup()


# -------------------------------------------------------------------------------------- cluster


@dataclass
class DataplaneCluster:
    """A lab plus one NodeAgent per node, all in ``mode``."""

    lab: Lab
    mode: str
    config: KubeProxyConfiguration | None = None
    families: tuple[IPFamily, ...] = (IPFamily.IPv4,)
    agents: dict[str, NodeAgent] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.agents:
            self.agents = self._new_agents()

    def _new_agents(self) -> dict[str, NodeAgent]:
        return {
            n.name: NodeAgent(
                self.lab, n.name, self.mode, config=self.config, families=self.families
            )
            for n in self.lab.spec.nodes
        }

    def agent(self, node: str) -> NodeAgent:
        try:
            return self.agents[node]
        except KeyError:
            raise DataplaneError(f"no node {node!r} (nodes: {sorted(self.agents)})") from None

    # --- objects on every node ------------------------------------------------------------

    def endpoints(
        self, *pods: str, family: IPFamily = IPFamily.IPv4, **conditions: Any
    ) -> list[dict[str, Any]]:
        """Endpoint dicts of lab pods (their IP and node); ``conditions`` go to ``endpoint``.

        ``family=IPFamily.IPv6`` gives the pods' IPv6 addresses (a dual-stack lab's), for an
        EndpointSlice with ``address_type="IPv6"``.
        """
        out = []
        for name in pods:
            pod = self.lab.spec.pod(name)
            node = self.lab.spec.node(pod.node)
            ip = pod.ip
            if family is IPFamily.IPv6:
                if pod.ip6 is None:
                    raise DataplaneError(f"pod {name} has no IPv6 address (lab is IPv4-only)")
                ip = pod.ip6
            out.append(endpoint(ip, pod.node, zone=_zone_of(self.lab.spec, node), **conditions))
        return out

    def set(self, *objects: Mapping[str, Any]) -> None:
        for a in self.agents.values():
            a.set(*objects)

    def delete(self, kind: str, namespace: str, name: str) -> None:
        for a in self.agents.values():
            a.delete(kind, namespace, name)

    def sync(self, full: bool = False) -> bool:
        """Sync every node (all of them, even after one fails); True if every sync succeeded."""
        results = [a.sync(full=full) for a in self.agents.values()]
        return all(results)

    def sync_or_raise(self, full: bool = False) -> None:
        for a in self.agents.values():
            if not a.sync(full=full):
                raise DataplaneError(f"sync of {a.node} failed: {a.last_error}")

    # --- lifecycle ----------------------------------------------------------------------------

    def close(self) -> list[str]:
        """Run every agent's cleanup; returns the errors instead of raising (teardown path)."""
        errors = []
        for a in self.agents.values():
            try:
                a.cleanup()
            except Exception as err:  # keep cleaning the other nodes
                errors.append(f"{a.node}: {err}")
        return errors

    def reset(self) -> None:
        """Back to a blank dataplane with fresh agents, keeping the lab (for a shared lab).

        The agents' own cleanup runs first; then every node's netfilter ruleset and conntrack
        table are flushed, so a test that broke its agent cannot leak rules into the next one.
        """
        errors = self.close()
        for err in errors:
            log.warning("cleanup before reset failed on %s", err)
        for node in self.lab.spec.nodes:
            if shutil.which("nft"):
                self.lab.exec(node.name, ["nft", "flush", "ruleset"])
            if shutil.which("conntrack"):
                # Exit 1 with "0 flow entries" when conntrack was never used: fine.
                self.lab.exec(node.name, ["conntrack", "-F"], check=False)
                if IPFamily.IPv6 in self.families:
                    self.lab.exec(node.name, ["conntrack", "-F", "-f", "ipv6"], check=False)
        self.agents = self._new_agents()


@contextlib.contextmanager
def cluster(
    mode: str,
    spec: LabSpec | None = None,
    *,
    prefix: str | None = None,
    config: KubeProxyConfiguration | None = None,
    families: tuple[IPFamily, ...] | None = None,
    ipv6: bool = False,
) -> Iterator[DataplaneCluster]:
    """A fresh lab (``conformance_spec()`` by default) with an agent per node in ``mode``.

    The lab gets a unique prefix unless one is given; everything goes when the block ends,
    also when it raises. Raises ``DataplaneUnavailable`` if the mode cannot run here.

    ``ipv6=True`` makes it dual-stack: ``conformance_spec(ipv6=True)``, agents for IPv4 and
    IPv6 (unless ``families`` says otherwise) and, unless ``config`` is given, the lab config
    with ``clusterCIDR`` of both families. ``families`` defaults to IPv4 only otherwise.
    """
    if families is None:
        families = DUAL_STACK if ipv6 else (IPFamily.IPv4,)
    if ipv6 and config is None:
        config = lab_config(mode, cluster_cidr=CLUSTER_CIDR_DUAL_STACK)
    with Lab(spec or conformance_spec(ipv6=ipv6), prefix or unique_prefix()) as lab:
        dc = DataplaneCluster(lab, mode, config=config, families=families)
        try:
            yield dc
        finally:
            for err in dc.close():
                log.warning("cleanup at teardown failed on %s", err)
