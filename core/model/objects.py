"""Service, EndpointSlice, Node and ServiceCIDR objects, parsed from their API (dict) form and
validated.

The API server validates objects before kube-proxy sees them; a folder of manifests has no such
guard, and a hostile or broken object must never reach a rule. So every field a dataplane
writes into a rule is checked here, with an error that names the object and the field.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubeplex.core.model.errors import FieldError, InvalidObject, shown
from kubeplex.core.model.types import (
    IPFamily,
    NodeInfo,
    Protocol,
    family_of,
    fast_init,
    normalize_cidr,
    normalize_ip,
)

# Anchored with \Z, not $: "$" also matches before a trailing newline ("web\n" would pass).
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z"
)
# IANA_SVC_NAME as the API server enforces for port names.
_PORT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
# Label values and zone names: what the API server allows in a label value.
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?\Z")

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer", "ExternalName")
DEFAULT_AFFINITY_TIMEOUT = 10800
MAX_AFFINITY_TIMEOUT = 86400


@dataclass(frozen=True, slots=True)
class PortSpec:
    name: str
    protocol: Protocol
    port: int
    node_port: int


@dataclass(frozen=True, slots=True)
class ServiceObject:
    """A validated Service; the trackers turn it into per-family ServicePorts."""

    namespace: str
    name: str
    type: str
    cluster_ips: tuple[str, ...]
    headless: bool
    ports: tuple[PortSpec, ...]
    external_ips: tuple[str, ...] = ()
    load_balancer_ingress_ips: tuple[str, ...] = ()
    load_balancer_source_ranges: tuple[str, ...] = ()
    session_affinity_client_ip: bool = False
    affinity_timeout: int = DEFAULT_AFFINITY_TIMEOUT
    external_traffic_policy: str = "Cluster"
    internal_traffic_policy: str = "Cluster"
    health_check_node_port: int = 0
    traffic_distribution: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def cluster_ip_of(self, family: IPFamily) -> str:
        for ip in self.cluster_ips:
            if family_of(ip) is family:
                return ip
        return ""


@dataclass(frozen=True, slots=True)
class SliceEndpoint:
    ip: str
    ready: bool
    serving: bool
    terminating: bool
    node_name: str
    zone: str
    zone_hints: frozenset[str]
    node_hints: frozenset[str]


@dataclass(frozen=True, slots=True)
class SlicePort:
    name: str
    protocol: Protocol
    port: int


@dataclass(frozen=True, slots=True)
class EndpointSliceObject:
    namespace: str
    name: str
    service_name: str
    address_type: str
    ports: tuple[SlicePort, ...]
    endpoints: tuple[SliceEndpoint, ...]
    trigger_time: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def service_key(self) -> str:
        return f"{self.namespace}/{self.service_name}"


class _Fields:
    """Typed access to a nested mapping that collects errors instead of raising at once."""

    def __init__(self) -> None:
        self.errors: list[FieldError] = []

    def fail(self, path: str, message: str) -> None:
        self.errors.append(FieldError(path, message))

    def mapping(self, obj: Any, path: str) -> Mapping[str, Any]:
        if obj is None:
            return {}
        if not isinstance(obj, Mapping):
            self.fail(path, f"must be a mapping, got {_show(obj)}")
            return {}
        return obj

    def seq(self, obj: Any, path: str) -> list[Any]:
        if obj is None:
            return []
        if not isinstance(obj, list):
            self.fail(path, f"must be a list, got {_show(obj)}")
            return []
        return obj

    def string(self, obj: Any, path: str, default: str = "") -> str:
        if obj is None:
            return default
        if not isinstance(obj, str):
            self.fail(path, f"must be a string, got {_show(obj)}")
            return default
        return obj

    def integer(self, obj: Any, path: str, lo: int, hi: int, default: int = 0) -> int:
        if obj is None:
            return default
        if isinstance(obj, bool) or not isinstance(obj, int):
            self.fail(path, f"must be an integer, got {_show(obj)}")
            return default
        if not lo <= obj <= hi:
            self.fail(path, f"must be between {lo} and {hi}, got {obj}")
            return default
        return obj

    def boolean(self, obj: Any, path: str, default: bool) -> bool:
        if obj is None:
            return default
        if not isinstance(obj, bool):
            self.fail(path, f"must be a boolean, got {_show(obj)}")
            return default
        return obj

    def ip(self, obj: Any, path: str) -> str:
        text = self.string(obj, path)
        try:
            return normalize_ip(text)
        except ValueError:
            self.fail(path, f"must be a valid IP address, got {_show(obj)}")
            return ""

    def cidr(self, obj: Any, path: str) -> str:
        text = self.string(obj, path)
        try:
            return normalize_cidr(text)
        except ValueError:
            self.fail(path, f"must be a valid CIDR, got {_show(obj)}")
            return ""

    def choice(self, obj: Any, path: str, allowed: tuple[str, ...], default: str) -> str:
        text = self.string(obj, path, default) or default
        if text not in allowed:
            self.fail(path, f"must be one of {', '.join(allowed)}, got {_show(obj)}")
            return default
        return text

    def protocol(self, obj: Any, path: str) -> Protocol:
        text = self.string(obj, path, "TCP") or "TCP"
        try:
            return Protocol(text)
        except ValueError:
            self.fail(path, f"must be one of TCP, UDP, SCTP, got {_show(obj)}")
            return Protocol.TCP

    def dns_subdomain(self, obj: Any, path: str) -> str:
        text = self.string(obj, path)
        if not text:
            self.fail(path, "required")
        elif len(text) > 253 or not _DNS1123_SUBDOMAIN.match(text):
            self.fail(
                path,
                f"must be a DNS subdomain (lower-case letters, digits, '-', '.'), got {_show(obj)}",
            )
        return text

    def dns_label(self, obj: Any, path: str, pattern: re.Pattern[str] = _DNS1123_LABEL) -> str:
        text = self.string(obj, path)
        if not text:
            self.fail(path, "required")
        elif len(text) > 63 or not pattern.match(text):
            self.fail(
                path, f"must be a DNS label (lower-case letters, digits, '-'), got {_show(obj)}"
            )
        return text


def _show(obj: Any) -> str:
    """A value as it goes into an error message: quoted, control characters escaped, bounded."""
    if isinstance(obj, str):  # only the head is escaped: a 10 MB value costs no 10 MB copy
        text = '"' + obj[:80].encode("unicode_escape").decode() + ('"' if len(obj) <= 80 else "")
    else:
        text = shown(obj)  # a bounded repr: a YAML alias bomb is never walked whole
    return text if len(text) <= 80 else text[:77] + "..."


def _metadata(
    f: _Fields, obj: Mapping[str, Any], subdomain: bool = False
) -> tuple[str, str, Mapping[str, Any]]:
    meta = f.mapping(obj.get("metadata"), "metadata")
    # Service names are DNS labels; EndpointSlice names, DNS subdomains (as the API server checks).
    check = f.dns_subdomain if subdomain else f.dns_label
    name = check(meta.get("name"), "metadata.name")
    namespace = f.dns_label(meta.get("namespace", "default"), "metadata.namespace")
    return namespace, name, meta


def _describe(kind: str, obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    if isinstance(meta, Mapping):
        ns = meta.get("namespace", "default")
        name = meta.get("name", "<no name>")
        if kind in ("Node", "ServiceCIDR"):  # cluster-scoped
            return f"{kind} {_safe(name)}"
        return f"{kind} {_safe(ns)}/{_safe(name)}"
    return f"{kind} <no metadata>"


def _safe(value: Any) -> str:
    if isinstance(value, str):
        return value[:80].encode("unicode_escape").decode()[:80]
    return shown(value, 80)


def _plain_service(obj: Any) -> ServiceObject | None:
    """The common, valid Service (ClusterIP, NodePort or LoadBalancer without ingress, external
    IPs or session affinity), checked without building field paths: the same checks as the
    general path of parse_service, which takes over (and names the field) for anything else."""
    if type(obj) is not dict:
        return None
    meta, spec, status = obj.get("metadata"), obj.get("spec"), obj.get("status")
    if type(meta) is not dict or type(spec) is not dict:
        return None
    if status is not None:
        if type(status) is not dict:
            return None
        lb = status.get("loadBalancer")
        if lb is not None and (type(lb) is not dict or lb.get("ingress") not in _NOTHING):
            return None
    name, namespace = meta.get("name"), meta.get("namespace", "default")
    if type(name) is not str or type(namespace) is not str:
        return None
    name, namespace = _shared_label(name), _shared_label(namespace)
    if name is None or namespace is None:
        return None
    svc_type = _PLAIN_SERVICE_TYPES.get(_text(spec.get("type")))
    etp = _POLICIES.get(_text(spec.get("externalTrafficPolicy")))
    itp = _POLICIES.get(_text(spec.get("internalTrafficPolicy")))
    hc_port = spec.get("healthCheckNodePort")
    traffic_distribution = spec.get("trafficDistribution")
    if hc_port is None:
        hc_port = 0
    if traffic_distribution is None:
        traffic_distribution = ""
    if (
        svc_type is None
        or etp is None
        or itp is None
        or _text(spec.get("sessionAffinity")) not in ("", "None")
        or type(hc_port) is not int
        or not 0 <= hc_port <= 65535
        or type(traffic_distribution) is not str
        or spec.get("externalIPs") not in _NOTHING
        or spec.get("loadBalancerSourceRanges") not in _NOTHING
    ):
        return None
    raw_ips = spec.get("clusterIPs")
    if type(raw_ips) is not list or not 1 <= len(raw_ips) <= 2:
        return None
    cluster_ips: list[str] = []
    for raw in raw_ips:
        if type(raw) is not str or raw == "None" or raw == "":
            return None  # (a headless Service: the general path)
        try:
            cluster_ips.append(normalize_ip(raw))
        except ValueError:
            return None
    if len(cluster_ips) == 2 and (":" in cluster_ips[0]) == (":" in cluster_ips[1]):
        return None
    raw_ports = spec.get("ports")
    if raw_ports is None:
        raw_ports = []
    elif type(raw_ports) is not list:
        return None
    with_node_port = svc_type != "ClusterIP"
    ports: list[PortSpec] = []
    seen_names: set[str] = set()
    seen: set[tuple[Protocol, int]] = set()
    for p in raw_ports:
        if type(p) is not dict:
            return None
        pname, protocol = p.get("name"), p.get("protocol")
        port, node_port = p.get("port"), p.get("nodePort")
        if pname is None:
            pname = ""
        if node_port is None:
            node_port = 0
        proto = _plain_protocol(protocol)
        if proto is None:
            return None
        if (
            type(pname) is not str
            or (pname and (len(pname) > 15 or not _PORT_NAME.match(pname)))
            or (not pname and len(raw_ports) > 1)
            or pname in seen_names
            or type(port) is not int
            or not 1 <= port <= 65535
            or type(node_port) is not int
            or not 0 <= node_port <= 65535
            or (node_port and not with_node_port)
            or (proto, port) in seen
        ):
            return None
        if pname:
            seen_names.add(pname)
        seen.add((proto, port))
        ports.append(_new_port_spec(pname, proto, port, node_port))
    # (ServiceObject's fields, in order)
    return _new_service(
        namespace,
        name,
        svc_type,
        tuple(cluster_ips),
        False,
        tuple(ports),
        (),
        (),
        (),
        False,
        DEFAULT_AFFINITY_TIMEOUT,
        etp,
        itp,
        hc_port,
        traffic_distribution,
    )


_new_service: Callable[..., ServiceObject] = fast_init(ServiceObject)
_new_port_spec: Callable[[str, Protocol, int, int], PortSpec] = fast_init(PortSpec)


#: What an unset optional field may be in the fast paths: absent, null, or empty.
_NOTHING: tuple[Any, ...] = (None, [])
#: A field's text (see _text) -> the value it stands for, when the fast path takes it.
_PLAIN_SERVICE_TYPES: dict[str | None, str] = {
    "": "ClusterIP",
    "ClusterIP": "ClusterIP",
    "NodePort": "NodePort",
    "LoadBalancer": "LoadBalancer",
}
_POLICIES: dict[str | None, str] = {"": "Cluster", "Cluster": "Cluster", "Local": "Local"}


def _text(value: Any) -> str | None:
    """A field that defaults when unset or empty: its text ("" for unset), None for no string."""
    if value is None:
        return ""
    return value if type(value) is str else None


def parse_service(obj: Mapping[str, Any]) -> ServiceObject:
    """Validate a v1 Service; raises InvalidObject naming ``Service ns/name`` and each field."""
    plain = _plain_service(obj)
    if plain is not None:
        return plain
    f = _Fields()
    namespace, name, _ = _metadata(f, obj)
    spec = f.mapping(obj.get("spec"), "spec")
    status = f.mapping(obj.get("status"), "status")
    svc_type = f.choice(spec.get("type"), "spec.type", SERVICE_TYPES, "ClusterIP")

    raw_ips = f.seq(spec.get("clusterIPs"), "spec.clusterIPs")
    if not raw_ips and spec.get("clusterIP") is not None:
        raw_ips = [spec.get("clusterIP")]
    headless = svc_type == "ExternalName" or any(ip in ("None", "") for ip in raw_ips)
    cluster_ips: list[str] = []
    if not headless:
        if not raw_ips:
            f.fail("spec.clusterIP", "required (set it, or clusterIP: None for a headless Service)")
        for i, raw in enumerate(raw_ips):
            ip = f.ip(raw, f"spec.clusterIPs[{i}]" if "clusterIPs" in spec else "spec.clusterIP")
            if ip:
                cluster_ips.append(ip)
        if len({family_of(ip) for ip in cluster_ips}) != len(cluster_ips):
            f.fail("spec.clusterIPs", "must hold at most one address per IP family")

    ports: list[PortSpec] = []
    # As the API server: port names are unique, and so are (port, protocol) pairs.
    seen_names: set[str] = set()
    seen: set[tuple[Protocol, int]] = set()
    raw_ports = f.seq(spec.get("ports"), "spec.ports")
    for i, raw in enumerate(raw_ports):
        path = f"spec.ports[{i}]"
        p = f.mapping(raw, path)
        pname = f.string(p.get("name"), f"{path}.name")
        if pname and (len(pname) > 15 or not _PORT_NAME.match(pname)):
            f.fail(f"{path}.name", f"must be an IANA service name, got {_show(pname)}")
        elif not pname and len(raw_ports) > 1:
            f.fail(f"{path}.name", "required when a Service has more than one port")
        proto = f.protocol(p.get("protocol"), f"{path}.protocol")
        port = f.integer(p.get("port"), f"{path}.port", 1, 65535)
        if p.get("port") is None:
            f.fail(f"{path}.port", "required")
        node_port = f.integer(p.get("nodePort"), f"{path}.nodePort", 0, 65535)
        if node_port and svc_type not in ("NodePort", "LoadBalancer"):
            f.fail(f"{path}.nodePort", f"may not be set when type is {svc_type}")
        if pname and pname in seen_names:
            f.fail(f"{path}.name", f"duplicate name {_show(pname)}")
        elif (proto, port) in seen:
            f.fail(path, f"duplicate port {port}/{proto}")
        seen_names.add(pname)
        seen.add((proto, port))
        ports.append(PortSpec(pname, proto, port, node_port))

    external_ips = tuple(
        f.ip(ip, f"spec.externalIPs[{i}]")
        for i, ip in enumerate(f.seq(spec.get("externalIPs"), "spec.externalIPs"))
    )
    source_ranges = tuple(
        f.cidr(c, f"spec.loadBalancerSourceRanges[{i}]")
        for i, c in enumerate(
            f.seq(spec.get("loadBalancerSourceRanges"), "spec.loadBalancerSourceRanges")
        )
    )
    lb = f.mapping(status.get("loadBalancer"), "status.loadBalancer")
    ingress_ips: list[str] = []
    for i, ing in enumerate(f.seq(lb.get("ingress"), "status.loadBalancer.ingress")):
        path = f"status.loadBalancer.ingress[{i}]"
        ing_map = f.mapping(ing, path)
        mode = f.choice(ing_map.get("ipMode"), f"{path}.ipMode", ("VIP", "Proxy"), "VIP")
        if ing_map.get("ip") in (None, ""):
            continue  # hostname-only ingress: nothing for a proxy to capture
        ip = f.ip(ing_map.get("ip"), f"{path}.ip")
        # With ipMode Proxy the load balancer delivers to the node, not to the VIP.
        if ip and mode == "VIP" and svc_type == "LoadBalancer":
            ingress_ips.append(ip)

    affinity = f.choice(
        spec.get("sessionAffinity"), "spec.sessionAffinity", ("None", "ClientIP"), "None"
    )
    timeout = DEFAULT_AFFINITY_TIMEOUT
    if affinity == "ClientIP":
        cfg = f.mapping(spec.get("sessionAffinityConfig"), "spec.sessionAffinityConfig")
        client_ip = f.mapping(cfg.get("clientIP"), "spec.sessionAffinityConfig.clientIP")
        timeout = f.integer(
            client_ip.get("timeoutSeconds"),
            "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
            1,
            MAX_AFFINITY_TIMEOUT,
            DEFAULT_AFFINITY_TIMEOUT,
        )
    etp = f.choice(
        spec.get("externalTrafficPolicy"),
        "spec.externalTrafficPolicy",
        ("Cluster", "Local"),
        "Cluster",
    )
    itp = f.choice(
        spec.get("internalTrafficPolicy"),
        "spec.internalTrafficPolicy",
        ("Cluster", "Local"),
        "Cluster",
    )
    hc_port = f.integer(spec.get("healthCheckNodePort"), "spec.healthCheckNodePort", 0, 65535)
    traffic_distribution = f.string(spec.get("trafficDistribution"), "spec.trafficDistribution")
    if f.errors:
        raise InvalidObject(_describe("Service", obj), f.errors)
    return ServiceObject(
        namespace=namespace,
        name=name,
        type=svc_type,
        cluster_ips=tuple(cluster_ips),
        headless=headless,
        ports=tuple(ports),
        external_ips=external_ips,
        load_balancer_ingress_ips=tuple(ingress_ips),
        load_balancer_source_ranges=source_ranges,
        session_affinity_client_ip=affinity == "ClientIP",
        affinity_timeout=timeout,
        external_traffic_policy=etp,
        internal_traffic_policy=itp,
        health_check_node_port=hc_port,
        traffic_distribution=traffic_distribution,
    )


def parse_endpoint_slice(obj: Mapping[str, Any]) -> EndpointSliceObject:
    """Validate a discovery.k8s.io/v1 EndpointSlice."""
    plain = _plain_slice(obj)
    if plain is not None:
        return plain
    f = _Fields()
    namespace, name, meta = _metadata(f, obj, subdomain=True)
    labels = f.mapping(meta.get("labels"), "metadata.labels")
    annotations = f.mapping(meta.get("annotations"), "metadata.annotations")
    service_name = f.dns_label(
        labels.get(SERVICE_NAME_LABEL), f"metadata.labels[{SERVICE_NAME_LABEL}]"
    )
    address_type = f.choice(obj.get("addressType"), "addressType", ("IPv4", "IPv6", "FQDN"), "IPv4")
    if obj.get("addressType") is None:
        f.fail("addressType", "required")
    ports: list[SlicePort] = []
    for i, raw in enumerate(f.seq(obj.get("ports"), "ports")):
        path = f"ports[{i}]"
        p = f.mapping(raw, path)
        if p.get("port") is None:
            # Valid in the API ("all ports", which kube-proxy cannot express): upstream ignores
            # such a port and keeps the slice's others.
            continue
        pname = f.string(p.get("name"), f"{path}.name")
        if pname and (len(pname) > 15 or not _PORT_NAME.match(pname)):
            f.fail(f"{path}.name", f"must be an IANA service name, got {_show(pname)}")
        port = f.integer(p.get("port"), f"{path}.port", 1, 65535)
        ports.append(SlicePort(pname, f.protocol(p.get("protocol"), f"{path}.protocol"), port))
    endpoints: list[SliceEndpoint] = []
    for i, raw in enumerate(f.seq(obj.get("endpoints"), "endpoints")):
        if address_type != "FQDN" and (quick := _plain_endpoint(raw, address_type)) is not None:
            endpoints.append(quick)
            continue
        path = f"endpoints[{i}]"
        ep = f.mapping(raw, path)
        addresses = f.seq(ep.get("addresses"), f"{path}.addresses")
        if not addresses:
            f.fail(f"{path}.addresses", "must hold at least one address")
            continue
        if address_type == "FQDN":
            continue  # kube-proxy ignores FQDN slices; nothing to validate as an IP
        ip = f.ip(addresses[0], f"{path}.addresses[0]")
        if ip and family_of(ip).value != address_type:
            f.fail(f"{path}.addresses[0]", f"must be an {address_type} address, got {_show(ip)}")
        cond = f.mapping(ep.get("conditions"), f"{path}.conditions")
        # Upstream (endpointslicecache.go) reads unset conditions as ready, serving, and not
        # terminating: an unset serving is true even when ready is false.
        ready = f.boolean(cond.get("ready"), f"{path}.conditions.ready", True)
        serving = f.boolean(cond.get("serving"), f"{path}.conditions.serving", True)
        terminating = f.boolean(cond.get("terminating"), f"{path}.conditions.terminating", False)
        node_name = f.string(ep.get("nodeName"), f"{path}.nodeName")
        if node_name and not _DNS1123_SUBDOMAIN.match(node_name):
            f.fail(f"{path}.nodeName", f"must be a DNS subdomain, got {_show(node_name)}")
        zone = f.string(ep.get("zone"), f"{path}.zone")
        hints = f.mapping(ep.get("hints"), f"{path}.hints")
        zone_hints = _hint_names(f, hints.get("forZones"), f"{path}.hints.forZones")
        node_hints = _hint_names(f, hints.get("forNodes"), f"{path}.hints.forNodes")
        endpoints.append(
            SliceEndpoint(ip, ready, serving, terminating, node_name, zone, zone_hints, node_hints)
        )
    trigger = annotations.get(TRIGGER_TIME_ANNOTATION, "")
    if f.errors:
        raise InvalidObject(_describe("EndpointSlice", obj), f.errors)
    return EndpointSliceObject(
        namespace=namespace,
        name=name,
        service_name=service_name,
        address_type=address_type,
        ports=tuple(ports),
        endpoints=tuple(endpoints),
        trigger_time=trigger if isinstance(trigger, str) else "",
    )


TRIGGER_TIME_ANNOTATION = "endpoints.kubernetes.io/last-change-trigger-time"


def _plain_slice(obj: Any) -> EndpointSliceObject | None:
    """The common, valid IPv4 or IPv6 slice, checked without building field paths: the same
    checks as the general path of parse_endpoint_slice, which takes over (and names the
    field) for anything else, FQDN slices included."""
    if type(obj) is not dict:
        return None
    meta = obj.get("metadata")
    if type(meta) is not dict:
        return None
    name, namespace = meta.get("name"), meta.get("namespace", "default")
    labels, annotations = meta.get("labels"), meta.get("annotations")
    if (
        type(name) is not str
        or type(namespace) is not str
        or type(labels) is not dict
        or not _subdomain(name)
        or (namespace := _shared_label(namespace)) is None
    ):
        return None
    if annotations is None:
        annotations = {}
    elif type(annotations) is not dict:
        return None
    service_name = labels.get(SERVICE_NAME_LABEL)
    address_type = obj.get("addressType")
    if type(service_name) is not str or (service_name := _shared_label(service_name)) is None:
        return None
    if address_type != "IPv4" and address_type != "IPv6":
        return None
    raw_ports, raw_endpoints = obj.get("ports"), obj.get("endpoints")
    if raw_ports is None:
        raw_ports = []
    if raw_endpoints is None:
        raw_endpoints = []
    if type(raw_ports) is not list or type(raw_endpoints) is not list:
        return None
    ports: list[SlicePort] = []
    for p in raw_ports:
        if type(p) is not dict:
            return None
        port = p.get("port")
        if port is None:
            continue  # "all ports": ignored, as in the general path
        pname, protocol = p.get("name"), p.get("protocol")
        if pname is None:
            pname = ""
        if (
            type(port) is not int
            or not 1 <= port <= 65535
            or type(pname) is not str
            or (pname and (len(pname) > 15 or not _PORT_NAME.match(pname)))
        ):
            return None
        proto = _plain_protocol(protocol)
        if proto is None:
            return None
        ports.append(SlicePort(pname, proto, port))
    endpoints: list[SliceEndpoint] = []
    append = endpoints.append
    v4 = address_type == "IPv4"
    nodes, zones, make = _VALID_SUBDOMAINS, _ZONES, _new_slice_endpoint
    for raw in raw_endpoints:
        # The endpoint as an API server writes it (IPv4, the three conditions, a node name
        # and zone seen before, no hints) is checked here; _plain_endpoint takes anything else.
        endpoint = None
        if v4 and type(raw) is dict and "hints" not in raw:
            try:  # (a missing or unhashable field: KeyError, TypeError; no address: IndexError)
                addresses, cond, node_name = raw["addresses"], raw["conditions"], raw["nodeName"]
                ip = addresses[0]
                ready, serving, terminating = cond["ready"], cond["serving"], cond["terminating"]
                node = nodes[node_name]
                zone = raw.get("zone")
                zone = "" if zone is None else zones[zone]
            except (KeyError, IndexError, TypeError):
                pass
            else:
                if (
                    type(addresses) is list
                    and type(ip) is str
                    and type(cond) is dict
                    and type(node_name) is str
                    and type(ready) is bool
                    and type(serving) is bool
                    and type(terminating) is bool
                ):
                    # What inet_pton accepts is what normalize_ip returns unchanged (no
                    # space, no scope, canonical): anything else is left to normalize_ip.
                    try:
                        _pton(_AF_INET, ip)
                    except (OSError, ValueError):
                        pass
                    else:
                        endpoint = make(
                            ip, ready, serving, terminating, node, zone, _NO_HINTS, _NO_HINTS
                        )
        if endpoint is None:
            endpoint = _plain_endpoint(raw, address_type)
            if endpoint is None:
                return None
        append(endpoint)
    trigger = annotations.get(TRIGGER_TIME_ANNOTATION, "")
    return EndpointSliceObject(
        namespace=namespace,
        name=name,
        service_name=service_name,
        address_type=address_type,
        ports=tuple(ports),
        endpoints=tuple(endpoints),
        trigger_time=trigger if isinstance(trigger, str) else "",
    )


_PROTOCOLS = {p.value: p for p in Protocol}


def _plain_protocol(value: Any) -> Protocol | None:
    """A port's protocol in the fast paths: TCP when unset, None when it is no known one."""
    if value is None or value == "":
        return Protocol.TCP
    return _PROTOCOLS.get(value) if type(value) is str else None


#: Names already found valid (node, namespace and Service names repeat across a cluster's
#: objects), each to the first copy seen, which every object then shares; zones (any string
#: is one) likewise. Bounded, so hostile input cannot grow them without end.
_VALID_SUBDOMAINS: dict[str, str] = {}
_VALID_LABELS: dict[str, str] = {}
_ZONES: dict[str, str] = {}
_VALID_NAMES_LIMIT = 65536


def _remembered(names: dict[str, str], text: str, longest: int, pattern: re.Pattern[str]) -> bool:
    """Whether ``text`` is at most ``longest`` long and matches ``pattern``; a valid one is
    remembered in ``names`` (emptied when full)."""
    if text in names:
        return True
    if not text or len(text) > longest or not pattern.match(text):
        return False
    if len(names) >= _VALID_NAMES_LIMIT:
        names.clear()
    names[text] = text
    return True


def _subdomain(text: str) -> bool:
    """dns_subdomain's check, remembered for a name seen before."""
    return _remembered(_VALID_SUBDOMAINS, text, 253, _DNS1123_SUBDOMAIN)


def _label(text: str) -> bool:
    """dns_label's check (with its default pattern), remembered for a name seen before."""
    return _remembered(_VALID_LABELS, text, 63, _DNS1123_LABEL)


def _shared_label(text: str) -> str | None:
    """The remembered copy of a valid DNS label (namespaces and Service names are shared by
    the objects that name them); None if it is not one."""
    found = _VALID_LABELS.get(text)
    if found is not None:
        return found
    return text if _label(text) else None


def _zone(text: str) -> str:
    """The shared copy of a zone name."""
    found = _ZONES.get(text)
    if found is None:
        if len(_ZONES) >= _VALID_NAMES_LIMIT:
            _ZONES.clear()
        found = _ZONES[text] = text
    return found


def _plain_endpoint(raw: Any, address_type: str) -> SliceEndpoint | None:
    """The common, valid endpoint, checked without building field paths: the same checks as
    the general path in parse_endpoint_slice, which takes over (and names the field) for
    anything else. Worth it: a large cluster has a hundred thousand endpoints."""
    if type(raw) is not dict:
        return None
    addresses = raw.get("addresses")
    if type(addresses) is not list or not addresses or type(addresses[0]) is not str:
        return None
    try:
        ip = normalize_ip(addresses[0])
    except ValueError:
        return None
    if (":" in ip) != (address_type == "IPv6"):
        return None
    cond = raw.get("conditions")
    if cond is None:
        cond = {}
    elif type(cond) is not dict:
        return None
    ready, serving, terminating = cond.get("ready"), cond.get("serving"), cond.get("terminating")
    node_name, zone = raw.get("nodeName"), raw.get("zone")
    if (
        (ready is not None and type(ready) is not bool)
        or (serving is not None and type(serving) is not bool)
        or (terminating is not None and type(terminating) is not bool)
        or (node_name is not None and type(node_name) is not str)
        or (zone is not None and type(zone) is not str)
        or (node_name and node_name not in _VALID_SUBDOMAINS and not _node_name_ok(node_name))
    ):
        return None
    zone_hints: frozenset[str] | None = _NO_HINTS
    node_hints: frozenset[str] | None = _NO_HINTS
    hints = raw.get("hints")
    if hints is not None:
        if type(hints) is not dict:
            return None
        zone_hints = _plain_hints(hints.get("forZones"))
        node_hints = _plain_hints(hints.get("forNodes"))
    if zone_hints is None or node_hints is None:
        return None
    return _new_slice_endpoint(
        ip,
        True if ready is None else ready,
        True if serving is None else serving,
        bool(terminating),
        _VALID_SUBDOMAINS.get(node_name, node_name) if node_name else "",
        _zone(zone) if zone else "",
        zone_hints,
        node_hints,
    )


def _node_name_ok(text: str) -> bool:
    """The general path's nodeName check (the pattern only, no length limit), remembered
    when it also passes _subdomain's (which shares the set)."""
    if not _DNS1123_SUBDOMAIN.match(text):
        return False
    if len(text) > 253:
        return True
    if len(_VALID_SUBDOMAINS) >= _VALID_NAMES_LIMIT:
        _VALID_SUBDOMAINS.clear()
    _VALID_SUBDOMAINS[text] = text
    return True


_NO_HINTS: frozenset[str] = frozenset()
_AF_INET = socket.AF_INET
_pton = socket.inet_pton
#: SliceEndpoint(ip, ready, serving, terminating, node_name, zone, zone_hints, node_hints).
_new_slice_endpoint: Callable[
    [str, bool, bool, bool, str, str, frozenset[str], frozenset[str]], SliceEndpoint
] = fast_init(SliceEndpoint)


def _plain_hints(raw: Any) -> frozenset[str] | None:
    """_hint_names for a valid list (None: let the general path report the problem)."""
    if raw is None:
        return _NO_HINTS
    if type(raw) is not list:
        return None
    names: set[str] = set()
    for item in raw:
        if type(item) is not dict:
            return None
        value = item.get("name")
        if value is None:
            continue
        if type(value) is not str or not _LABEL_VALUE.match(value):
            return None
        if value:
            names.add(value)
    return frozenset(names)


def _hint_names(f: _Fields, raw: Any, path: str) -> frozenset[str]:
    names: set[str] = set()
    for i, item in enumerate(f.seq(raw, path)):
        value = f.string(f.mapping(item, f"{path}[{i}]").get("name"), f"{path}[{i}].name")
        if value and not _LABEL_VALUE.match(value):
            f.fail(f"{path}[{i}].name", f"must be a valid name, got {_show(value)}")
        elif value:
            names.add(value)
    return frozenset(names)


def parse_node(obj: Mapping[str, Any]) -> NodeInfo:
    """Validate a v1 Node: its name, labels (zone), pod CIDRs and addresses."""
    f = _Fields()
    meta = f.mapping(obj.get("metadata"), "metadata")
    name = f.string(meta.get("name"), "metadata.name")
    if not name or not _DNS1123_SUBDOMAIN.match(name):
        f.fail("metadata.name", f"must be a DNS subdomain, got {_show(name)}")
    labels = f.mapping(meta.get("labels"), "metadata.labels")
    for key, value in labels.items():
        if not isinstance(value, str):
            f.fail(f"metadata.labels[{key}]", f"must be a string, got {_show(value)}")
    spec = f.mapping(obj.get("spec"), "spec")
    raw_cidrs = f.seq(spec.get("podCIDRs"), "spec.podCIDRs") or (
        [spec["podCIDR"]] if spec.get("podCIDR") else []
    )
    pod_cidrs = tuple(f.cidr(c, f"spec.podCIDRs[{i}]") for i, c in enumerate(raw_cidrs))
    status = f.mapping(obj.get("status"), "status")
    # InternalIPs first, then ExternalIPs, each in the listed order: the node's IP of a family
    # is the first of these (upstream's GetNodeHostIPs).
    by_type: dict[str, list[str]] = {"InternalIP": [], "ExternalIP": []}
    for i, raw in enumerate(f.seq(status.get("addresses"), "status.addresses")):
        a = f.mapping(raw, f"status.addresses[{i}]")
        kind = f.string(a.get("type"), f"status.addresses[{i}].type")
        if kind in by_type:
            ip = f.ip(a.get("address"), f"status.addresses[{i}].address")
            if ip:
                by_type[kind].append(ip)
    addresses = list(dict.fromkeys(by_type["InternalIP"] + by_type["ExternalIP"]))
    if f.errors:
        raise InvalidObject(_describe("Node", obj), f.errors)
    return NodeInfo(
        name=name,
        labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())),
        pod_cidrs=tuple(c for c in pod_cidrs if c),
        addresses=tuple(addresses),
        deleting=meta.get("deletionTimestamp") is not None,
    )


@dataclass(frozen=True, slots=True)
class ServiceCIDRObject:
    """A validated networking.k8s.io/v1 ServiceCIDR: a range ClusterIPs are allocated from."""

    name: str
    cidrs: tuple[str, ...]


def parse_service_cidr(obj: Mapping[str, Any]) -> ServiceCIDRObject:
    """Validate a networking.k8s.io/v1 ServiceCIDR as the API server does: the name a DNS
    subdomain, ``spec.cidrs`` one or two CIDRs, at most one per IP family."""
    f = _Fields()
    meta = f.mapping(obj.get("metadata"), "metadata")
    name = f.dns_subdomain(meta.get("name"), "metadata.name")
    spec = f.mapping(obj.get("spec"), "spec")
    raw_cidrs = spec.get("cidrs")
    items = f.seq(raw_cidrs, "spec.cidrs")
    cidrs: list[str] = []
    if not items and (raw_cidrs is None or isinstance(raw_cidrs, list)):
        f.fail("spec.cidrs", "required: at least one CIDR")
    elif len(items) > 2:
        f.fail("spec.cidrs", f"may hold at most 2 CIDRs (one per IP family), got {len(items)}")
    else:
        cidrs = [c for i, raw in enumerate(items) if (c := f.cidr(raw, f"spec.cidrs[{i}]"))]
        if len(cidrs) == 2 and family_of(cidrs[0]) is family_of(cidrs[1]):
            f.fail(
                "spec.cidrs",
                f"may hold at most one CIDR per IP family, got two {family_of(cidrs[0])} CIDRs",
            )
    if f.errors:
        raise InvalidObject(_describe("ServiceCIDR", obj), f.errors)
    return ServiceCIDRObject(name=name, cidrs=tuple(cidrs))
