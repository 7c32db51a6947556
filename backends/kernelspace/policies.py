"""From the graph to the HNS objects Windows kube-proxy (winkernel) creates: pure, no HNS.

Upstream reference: pkg/proxy/winkernel/proxier.go (newServiceInfo, syncProxyRules),
loadbalancer.go (manageClusterIPLoadbalancer, manageNodePortLoadbalancer,
manageExternalIPLoadbalancers, manageIngressIPLoadbalancers) and hns.go (getLoadBalancer,
createEndpoint), with hcsshim's hcn schema (HostComputeLoadBalancer, HostComputeEndpoint).

Per service port, as upstream's sync loop does:

* the endpoints: with LoadBalancer ingress IPs, "all terminating" / "all non-serving" are
  checked (local endpoints only under externalTrafficPolicy Local); then an endpoint is used if
  it is ready, or serving while every endpoint is terminating. Without ingress IPs only ready
  endpoints are used (upstream's terminating fallback is for LoadBalancer Services only).
  Both traffic policies Local drop the remote endpoints outright. Topology hints are not used
  (winkernel never did). No endpoint left: no load balancer at all for the Service.
* one load balancer per frontend: the cluster IP (internalTrafficPolicy Local: local endpoints
  only; DSR if ``enableDSR``), the NodePort (no frontend VIP, i.e. every node address;
  LocalRoutedVIP|VipExternalIP; local endpoints and DSR under externalTrafficPolicy Local),
  each external IP (VipExternalIP; same Local rule), each LoadBalancer ingress IP
  (VipExternalIP; DSR under Local or preserve-destination, which also sets UseMux and
  PreserveDIP) and, with ``forwardHealthCheckVip``, a health-check load balancer per ingress IP
  that forwards the health check node port (or the healthz port) to the root HNS endpoint.
  Node-facing load balancers are skipped when every endpoint is terminating or non-serving.
* session affinity ClientIP is DistributionType SourceIP (HNS has no affinity timeout); IPv6
  sets load balancer flag 2; protocols are IANA numbers (TCP 6, UDP 17, SCTP 132).

What cannot be known before HNS runs is marked: HNS assigns the endpoint IDs that a load
balancer's ``HostComputeEndpoints`` lists, so they are written as ``local:<ip>`` (the pod's
endpoint, made by the CNI), ``remote:<ip>`` (one of ``remoteEndpoints``, made by kube-proxy)
or ``name:<name>`` (the root endpoint found by name). Everything else is the JSON hcsshim
marshals (Go ``omitempty``: zero fields are left out).
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kubeplex.core.dataplane.backend import Rendered
from kubeplex.core.model.graph import ChangeSet, ServiceGraph
from kubeplex.core.model.types import Endpoint, IPFamily, Protocol, ServicePort, ServicePortName

#: A JSON object as json.dumps takes it.
Json = dict[str, Any]

#: hcn.SchemaVersion{Major: 2, Minor: 0}, set on every object kube-proxy creates.
SCHEMA_VERSION: Json = {"Major": 2, "Minor": 0}

#: winkernel's Enum(v1.Protocol).
PROTOCOL_NUMBERS = {Protocol.TCP: 6, Protocol.UDP: 17, Protocol.SCTP: 132}

# hcn.LoadBalancerPortMappingFlags (VipExternalIP is defined by kube-proxy's hns.go).
PORT_MAPPING_ILB = 1
PORT_MAPPING_LOCAL_ROUTED_VIP = 2
PORT_MAPPING_USE_MUX = 4
PORT_MAPPING_PRESERVE_DIP = 8
PORT_MAPPING_VIP_EXTERNAL_IP = 16
# hcn.LoadBalancerFlags (IPv6 is defined by kube-proxy's hns.go).
LB_FLAG_DSR = 1
LB_FLAG_IPV6 = 2
# hcn.LoadBalancerDistribution.
DISTRIBUTION_SOURCE_IP = 2
# hcn.EndpointFlags.
ENDPOINT_FLAG_REMOTE = 1
#: hcn.NetworkProviderAddress, the endpoint policy naming the host behind an overlay address.
PROVIDER_ADDRESS_POLICY = "ProviderAddress"

# Upstream's loadbalancerType names (loadbalancer.go).
CLUSTER_IP = "ClusterIP"
NODE_PORT = "NodePort"
EXTERNAL_IP = "ExternalIP"
INGRESS_IP = "IngressIP"
HEALTH_CHECK = "HealthCheck"


@dataclass(frozen=True)
class FamilySettings:
    """What every policy of one IP family depends on besides the Service and its endpoints."""

    family: IPFamily
    network_name: str
    #: Overlay (VXLAN) network: kube-proxy's sourceVip is the load balancers' SourceVIP.
    #: HNS tells the real network type; without HNS it is taken from sourceVip being set.
    overlay: bool
    source_vip: str
    node_ip: str
    node_addresses: tuple[str, ...]
    enable_dsr: bool
    forward_health_check_vip: bool
    root_hns_endpoint_name: str
    healthz_port: int
    cluster_cidrs: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()

    @property
    def ipv6(self) -> bool:
        return self.family is IPFamily.IPv6


@dataclass(frozen=True)
class LoadBalancerFlags:
    """winkernel's loadBalancerFlags, turned into HNS bits by getLoadBalancerPolicyFlags."""

    is_ilb: bool = False  # never set by upstream; kept so the mapping is complete
    is_dsr: bool = False
    is_vip_external_ip: bool = False
    local_routed_vip: bool = False
    use_mux: bool = False
    preserve_dip: bool = False
    session_affinity: bool = False
    is_ipv6: bool = False

    @property
    def port_mapping_flags(self) -> int:
        bits = 0
        for on, bit in (
            (self.is_ilb, PORT_MAPPING_ILB),
            (self.use_mux, PORT_MAPPING_USE_MUX),
            (self.preserve_dip, PORT_MAPPING_PRESERVE_DIP),
            (self.local_routed_vip, PORT_MAPPING_LOCAL_ROUTED_VIP),
            (self.is_vip_external_ip, PORT_MAPPING_VIP_EXTERNAL_IP),
        ):
            if on:
                bits |= bit
        return bits

    @property
    def load_balancer_flags(self) -> int:
        return (LB_FLAG_DSR if self.is_dsr else 0) | (LB_FLAG_IPV6 if self.is_ipv6 else 0)

    @property
    def distribution_type(self) -> int:
        return DISTRIBUTION_SOURCE_IP if self.session_affinity else 0

    @property
    def names(self) -> list[str]:
        """The upstream field names that are set, for a reader of the JSON."""
        named = (
            ("isILB", self.is_ilb),
            ("isDSR", self.is_dsr),
            ("isVipExternalIP", self.is_vip_external_ip),
            ("localRoutedVIP", self.local_routed_vip),
            ("useMUX", self.use_mux),
            ("preserveDIP", self.preserve_dip),
            ("sessionAffinity", self.session_affinity),
            ("isIPv6", self.is_ipv6),
        )
        return [name for name, on in named if on]


@dataclass(frozen=True)
class ServicePolicies:
    """Everything one service port contributes: its load balancers and remote endpoints."""

    service: str
    load_balancers: tuple[Json, ...]
    #: Remote HNS endpoints by IP address (pods on other nodes; overlay: the cluster IP too).
    remote_endpoints: dict[str, Json]
    #: Why no load balancer was made ("" if some were).
    skipped: str = ""


@dataclass(frozen=True)
class Selection:
    """The endpoints upstream's sync loop keeps for one service port."""

    endpoints: tuple[Endpoint, ...]
    local: tuple[Endpoint, ...]
    #: False when all endpoints are terminating or non-serving: only the ClusterIP LB is made.
    available_for_lb: bool


def protocol_number(protocol: Protocol) -> int:
    return PROTOCOL_NUMBERS.get(protocol, 0)


def conjure_mac(ip: str, prefix: str = "02-11") -> str:
    """Upstream's conjureMac: a MAC for a remote endpoint from its address (never on the wire)."""
    packed = ipaddress.ip_address(ip).packed
    last = packed if len(packed) == 4 else packed[15:11:-1]
    return prefix + "".join(f"-{b:02x}" for b in last)


def endpoint_ref(ep: Endpoint) -> str:
    return f"local:{ep.ip}" if ep.is_local else f"remote:{ep.ip}"


def _all_terminating(endpoints: Sequence[Endpoint], local_only: bool) -> bool:
    """Upstream's isAllEndpointsTerminating (vacuously true with no endpoint to look at)."""
    for ep in endpoints:
        if local_only and not ep.is_local:
            continue
        if not ep.ready and not ep.terminating:
            continue  # failing readiness, not being deleted: ignored
        if not ep.terminating:
            return False
    return True


def _all_non_serving(endpoints: Sequence[Endpoint], local_only: bool) -> bool:
    """Upstream's isAllEndpointsNonServing (vacuously true with no endpoint to look at)."""
    return not any(ep.serving for ep in endpoints if ep.is_local or not local_only)


def select_endpoints(
    svc: ServicePort, endpoints: Sequence[Endpoint], settings: FamilySettings
) -> Selection:
    all_terminating = all_non_serving = False
    if svc.load_balancer_vips:
        all_terminating = _all_terminating(endpoints, svc.external_policy_local)
        all_non_serving = _all_non_serving(endpoints, svc.external_policy_local)
    some_serving = not all_non_serving
    chosen: dict[str, Endpoint] = {}
    for ep in endpoints:
        if svc.internal_policy_local and svc.external_policy_local and not ep.is_local:
            continue  # both policies Local: remote endpoints are never used
        if some_serving and ((not all_terminating and not ep.ready) or not ep.serving):
            continue
        if ep.is_local and ep.ip in settings.node_addresses:
            # A host-network pod of this node has no HNS endpoint: upstream finds none
            # ("Local endpoint not found") and leaves it out.
            continue
        # One HNS endpoint per address, whatever the port.
        chosen.setdefault(ep.ip, ep)
    kept = tuple(chosen.values())
    return Selection(
        endpoints=kept,
        local=tuple(ep for ep in kept if ep.is_local),
        available_for_lb=not all_terminating and not all_non_serving,
    )


def remote_endpoint(ip: str, settings: FamilySettings, role: str = "endpoint") -> Json:
    """The HNS remote endpoint kube-proxy creates for an address (hns.go createEndpoint)."""
    hce: Json = {
        "Flags": ENDPOINT_FLAG_REMOTE,
        "IpConfigurations": [{"IpAddress": ip}],
        "SchemaVersion": dict(SCHEMA_VERSION),
    }
    if role == "service-vip":
        # Overlay: the cluster IP is a remote endpoint on this node's own provider address,
        # with the host's MAC address (read from the interface on Windows: not known here).
        hce["Policies"] = [
            {"Type": PROVIDER_ADDRESS_POLICY, "Settings": {"ProviderAddress": settings.node_ip}}
        ]
    else:
        # Overlay networks add a ProviderAddress policy naming the node that hosts the
        # address, found in the HNS network's RemoteSubnetRoute policies.
        hce["MacAddress"] = conjure_mac(ip)
    return {"ip": ip, "role": role, "HostComputeEndpoint": hce}


def source_vip_endpoint(settings: FamilySettings) -> Json:
    """Overlay: the local endpoint holding the source VIP, created if HNS lacks it."""
    return {
        "ip": settings.source_vip,
        "role": "source-vip",
        "HostComputeEndpoint": {
            "IpConfigurations": [{"IpAddress": settings.source_vip}],
            "Policies": [
                {
                    "Type": PROVIDER_ADDRESS_POLICY,
                    "Settings": {"ProviderAddress": settings.node_ip},
                }
            ],
            "SchemaVersion": dict(SCHEMA_VERSION),
        },
    }


def load_balancer(
    service: str,
    kind: str,
    refs: Sequence[str],
    flags: LoadBalancerFlags,
    source_vip: str,
    vip: str,
    protocol: int,
    internal_port: int,
    external_port: int,
) -> Json:
    """One hcn.HostComputeLoadBalancer as hns.go getLoadBalancer builds it, annotated."""
    mapping: Json = {
        "Protocol": protocol,
        "InternalPort": internal_port,
        "ExternalPort": external_port,
        "DistributionType": flags.distribution_type,
        "Flags": flags.port_mapping_flags,
    }
    hlb: Json = {
        "HostComputeEndpoints": list(refs),
        "SourceVIP": source_vip,
        "FrontendVIPs": [vip] if vip else [],
        "PortMappings": [_omit_empty(mapping)],
        "SchemaVersion": dict(SCHEMA_VERSION),
        "Flags": flags.load_balancer_flags,
    }
    return {
        "service": service,
        "type": kind,
        "flags": flags.names,
        "HostComputeLoadBalancer": _omit_empty(hlb),
    }


def _omit_empty(obj: Json) -> Json:
    """Go's ``json:",omitempty"``: zero numbers, empty strings and empty lists are left out."""
    return {k: v for k, v in obj.items() if v not in (0, "", [], None)}


def _outside_cluster(ip: str, settings: FamilySettings) -> bool:
    if not settings.cluster_cidrs:
        return False  # no way to tell: assume a pod
    addr = ipaddress.ip_address(ip)
    return not any(addr in net for net in settings.cluster_cidrs if net.version == addr.version)


def service_policies(
    svc: ServicePort,
    endpoints: Sequence[Endpoint],
    settings: FamilySettings,
    preserve_dip: bool = False,
) -> ServicePolicies:
    """The load balancers and remote endpoints of one service port (upstream's sync loop body).

    ``preserve_dip`` is the ``preserve-destination: "true"`` annotation, which the graph does
    not carry (the backend always passes False).
    """
    name = str(svc.name)
    sel = select_endpoints(svc, endpoints, settings)
    remote: dict[str, Json] = {}
    if settings.overlay:
        remote[svc.cluster_ip] = remote_endpoint(svc.cluster_ip, settings, "service-vip")
    if not sel.endpoints:
        return ServicePolicies(name, (), remote, "no usable endpoints")
    for ep in sel.endpoints:
        if not ep.is_local:
            remote[ep.ip] = remote_endpoint(ep.ip, settings)

    source_vip = settings.source_vip
    if settings.overlay and any(
        not ep.is_local and _outside_cluster(ep.ip, settings) for ep in sel.endpoints
    ):
        # An endpoint outside the pod network (a node or a public address): SNAT to the
        # node IP rather than to the source VIP.
        source_vip = settings.node_ip

    refs = [endpoint_ref(ep) for ep in sel.endpoints]
    local_refs = [endpoint_ref(ep) for ep in sel.local]
    proto = protocol_number(svc.protocol)
    target = sel.endpoints[0].port  # HNS takes one internal port: the first endpoint's
    affinity = svc.session_affinity_client_ip
    etp_local = svc.external_policy_local
    ipv6 = settings.ipv6
    out: list[Json] = []

    def add(
        kind: str, chosen: Sequence[str], flags: LoadBalancerFlags, vip: str, port: int
    ) -> None:
        out.append(load_balancer(name, kind, chosen, flags, source_vip, vip, proto, target, port))

    cluster_refs = local_refs if svc.internal_policy_local else refs
    if cluster_refs:
        flags = LoadBalancerFlags(
            is_dsr=settings.enable_dsr, is_ipv6=ipv6, session_affinity=affinity
        )
        add(CLUSTER_IP, cluster_refs, flags, svc.cluster_ip, svc.port)

    if sel.available_for_lb:
        if svc.node_port:
            chosen = local_refs if preserve_dip or etp_local else refs
            if chosen:
                flags = LoadBalancerFlags(
                    is_vip_external_ip=True,
                    is_dsr=etp_local,
                    local_routed_vip=True,
                    session_affinity=affinity,
                    is_ipv6=ipv6,
                )
                add(NODE_PORT, chosen, flags, "", svc.node_port)
        chosen = local_refs if etp_local else refs
        for ip in svc.external_ips if chosen else ():
            flags = LoadBalancerFlags(
                is_vip_external_ip=True, is_dsr=etp_local, session_affinity=affinity, is_ipv6=ipv6
            )
            add(EXTERNAL_IP, chosen, flags, ip, svc.port)
        chosen = local_refs if preserve_dip or etp_local else refs
        health_port = svc.health_check_node_port or settings.healthz_port
        root = settings.root_hns_endpoint_name
        for ip in svc.load_balancer_vips:
            if chosen:
                flags = LoadBalancerFlags(
                    is_vip_external_ip=True,
                    is_dsr=preserve_dip or etp_local,
                    use_mux=preserve_dip,
                    preserve_dip=preserve_dip,
                    session_affinity=affinity,
                    is_ipv6=ipv6,
                )
                add(INGRESS_IP, chosen, flags, ip, svc.port)
            if settings.forward_health_check_vip and root:
                # Health checks of the cloud load balancer reach the node's root endpoint.
                flags = LoadBalancerFlags(
                    use_mux=preserve_dip, preserve_dip=preserve_dip, is_ipv6=ipv6
                )
                out.append(
                    load_balancer(
                        name,
                        HEALTH_CHECK,
                        [f"name:{root}"],
                        flags,
                        source_vip,
                        ip,
                        proto,
                        health_port,
                        health_port,
                    )
                )
    return ServicePolicies(name, tuple(out), remote, "" if out else "no endpoints for any frontend")


# --- render: whole family, re-rendering only changed service ports ------------------------------


@dataclass
class FamilyPlan:
    """What one render says about one IP family."""

    family: IPFamily
    full: bool
    settings: FamilySettings
    #: The service ports this render (re)writes: every one on a full render, else the changed
    #: ones; a listed service's old load balancers are replaced by those in ``load_balancers``.
    services: list[str]
    load_balancers: list[Json]
    #: Full: every remote endpoint in use. Partial: those the changed services newly need.
    remote_endpoints: list[Json]
    #: Partial only: remote endpoints (by IP) no service uses any more.
    remote_endpoints_deleted: list[str]
    #: Service ports without a load balancer, and why (upstream logs and skips them).
    skipped: dict[str, str]

    def document(self) -> Json:
        s = self.settings
        doc: Json = {
            "family": self.family.value,
            "sync": "full" if self.full else "partial",
            "networkName": s.network_name,
            "networkType": "Overlay" if s.overlay else "L2Bridge",
            "sourceVip": s.source_vip,
            "nodeIP": s.node_ip,
            "enableDSR": s.enable_dsr,
            "services": self.services,
            "loadBalancers": self.load_balancers,
            "remoteEndpoints": self.remote_endpoints,
            "servicesWithoutLoadBalancers": self.skipped,
        }
        if s.forward_health_check_vip:
            doc["forwardHealthCheckVip"] = {
                "rootHnsEndpointName": s.root_hns_endpoint_name,
                "healthzPort": s.healthz_port,
            }
        if s.overlay and self.full:
            doc["sourceVipEndpoint"] = source_vip_endpoint(s)
        if not self.full:
            doc["remoteEndpointsDeleted"] = self.remote_endpoints_deleted
        return doc


def _ip_key(ip: str) -> tuple[int, int]:
    addr = ipaddress.ip_address(ip)
    return addr.version, int(addr)


class FamilyRenderer:
    """Render state of one IP family: each service port's policies from the previous render.

    A partial render recomputes the changed service ports only; remote endpoints are
    reference-counted across services, as upstream does, so one can tell which are new and
    which are no longer used.
    """

    def __init__(self, settings: FamilySettings) -> None:
        self.settings = settings
        self.fragments: dict[ServicePortName, ServicePolicies] = {}
        #: Remote endpoint IP -> the service ports using it.
        self.users: dict[str, set[ServicePortName]] = {}
        self.remote: dict[str, Json] = {}
        self.force_full = True

    def invalidate(self) -> None:
        self.force_full = True
        self.fragments.clear()
        self.users.clear()
        self.remote.clear()

    def _drop(self, spn: ServicePortName, dropped: set[str]) -> None:
        old = self.fragments.pop(spn, None)
        for ip in old.remote_endpoints if old is not None else ():
            users = self.users.get(ip)
            if users is not None:
                users.discard(spn)
                if not users:
                    del self.users[ip]
                    del self.remote[ip]
                    dropped.add(ip)

    def render(self, graph: ServiceGraph, changes: ChangeSet) -> FamilyPlan:
        full = changes.full or self.force_full
        self.force_full = False
        if full:
            self.fragments.clear()
            self.users.clear()
            self.remote.clear()
            todo = sorted(graph.services)
        else:
            todo = sorted(changes.services)
        before = set(self.remote)
        dropped: set[str] = set()
        for spn in todo:
            self._drop(spn, dropped)
            svc = graph.services.get(spn)
            if svc is None:
                continue
            frag = service_policies(svc, graph.endpoints_of(spn), self.settings)
            self.fragments[spn] = frag
            for ip, obj in frag.remote_endpoints.items():
                self.users.setdefault(ip, set()).add(spn)
                self.remote[ip] = obj
        if full:
            remote_ips = sorted(self.remote, key=_ip_key)
        else:
            remote_ips = sorted(set(self.remote) - before, key=_ip_key)
        rendered = [spn for spn in todo if spn in self.fragments]
        return FamilyPlan(
            family=graph.family,
            full=full,
            settings=self.settings,
            services=[str(spn) for spn in todo],
            load_balancers=[lb for spn in rendered for lb in self.fragments[spn].load_balancers],
            remote_endpoints=[self._remote_doc(ip) for ip in remote_ips],
            remote_endpoints_deleted=sorted(dropped - set(self.remote), key=_ip_key),
            skipped={
                str(spn): self.fragments[spn].skipped
                for spn in rendered
                if self.fragments[spn].skipped
            },
        )

    def _remote_doc(self, ip: str) -> Json:
        return {**self.remote[ip], "usedBy": sorted(str(spn) for spn in self.users[ip])}


@dataclass
class KernelspaceRendered(Rendered):
    plans: list[FamilyPlan]

    @property
    def full(self) -> bool:
        return any(p.full for p in self.plans)

    def document(self) -> Json:
        return {
            "mode": "kernelspace",
            "endpointReferences": ENDPOINT_REFERENCES,
            "families": [p.document() for p in self.plans],
        }

    def __str__(self) -> str:
        # Sorted keys, ASCII only: every value is escaped data, the text is the same each time.
        return json.dumps(self.document(), indent=2, sort_keys=True) + "\n"


ENDPOINT_REFERENCES = (
    "HNS assigns endpoint IDs: local:<ip> is the pod's HNS endpoint (made by the CNI), "
    "remote:<ip> one of remoteEndpoints (made by kube-proxy), name:<name> the endpoint "
    "found by that name"
)
