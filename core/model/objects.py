"""Service, EndpointSlice, Node and ServiceCIDR objects, parsed from their API (dict) form and
validated.

The API server validates objects before kube-proxy sees them; a folder of manifests has no such
guard, and a hostile or broken object must never reach a rule. So every field a dataplane
writes into a rule is checked here, with an error that names the object and the field.

Services and EndpointSlices first try their fast path (``objects_fast_paths``), which takes the
common, valid object without building field paths; anything else is checked here, field by
field. The validated forms themselves are in ``validated_objects``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from kubeplex.core.model.errors import FieldError, InvalidObject, shown
from kubeplex.core.model.objects_fast_paths import (
    endpoint_fast_path,
    endpoint_slice_fast_path,
    service_fast_path,
)
from kubeplex.core.model.types import NodeInfo, Protocol, family_of, normalize_cidr, normalize_ip
from kubeplex.core.model.validated_objects import (
    DEFAULT_AFFINITY_TIMEOUT,
    DNS1123_LABEL,
    DNS1123_SUBDOMAIN,
    LABEL_VALUE,
    MAX_AFFINITY_TIMEOUT,
    PORT_NAME,
    SERVICE_NAME_LABEL,
    SERVICE_TYPES,
    EndpointSliceObject,
    PortSpec,
    ServiceCIDRObject,
    ServiceObject,
    SliceEndpoint,
    SlicePort,
    trigger_time,
)


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
        elif len(text) > 253 or not DNS1123_SUBDOMAIN.match(text):
            self.fail(
                path,
                f"must be a DNS subdomain (lower-case letters, digits, '-', '.'), got {_show(obj)}",
            )
        return text

    def dns_label(self, obj: Any, path: str, pattern: re.Pattern[str] = DNS1123_LABEL) -> str:
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


def parse_service(obj: Mapping[str, Any]) -> ServiceObject:
    """Validate a v1 Service; raises InvalidObject naming ``Service ns/name`` and each field."""
    fast = service_fast_path(obj)
    if fast is not None:
        return fast
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
        if pname and (len(pname) > 15 or not PORT_NAME.match(pname)):
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
    fast = endpoint_slice_fast_path(obj)
    if fast is not None:
        return fast
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
        if pname and (len(pname) > 15 or not PORT_NAME.match(pname)):
            f.fail(f"{path}.name", f"must be an IANA service name, got {_show(pname)}")
        port = f.integer(p.get("port"), f"{path}.port", 1, 65535)
        ports.append(SlicePort(pname, f.protocol(p.get("protocol"), f"{path}.protocol"), port))
    endpoints: list[SliceEndpoint] = []
    for i, raw in enumerate(f.seq(obj.get("endpoints"), "endpoints")):
        if address_type != "FQDN" and (quick := endpoint_fast_path(raw, address_type)) is not None:
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
        if node_name and not DNS1123_SUBDOMAIN.match(node_name):
            f.fail(f"{path}.nodeName", f"must be a DNS subdomain, got {_show(node_name)}")
        zone = f.string(ep.get("zone"), f"{path}.zone")
        hints = f.mapping(ep.get("hints"), f"{path}.hints")
        zone_hints = _hint_names(f, hints.get("forZones"), f"{path}.hints.forZones")
        node_hints = _hint_names(f, hints.get("forNodes"), f"{path}.hints.forNodes")
        endpoints.append(
            SliceEndpoint(ip, ready, serving, terminating, node_name, zone, zone_hints, node_hints)
        )
    if f.errors:
        raise InvalidObject(_describe("EndpointSlice", obj), f.errors)
    return EndpointSliceObject(
        namespace=namespace,
        name=name,
        service_name=service_name,
        address_type=address_type,
        ports=tuple(ports),
        endpoints=tuple(endpoints),
        trigger_time=trigger_time(annotations),
    )


def _hint_names(f: _Fields, raw: Any, path: str) -> frozenset[str]:
    names: set[str] = set()
    for i, item in enumerate(f.seq(raw, path)):
        value = f.string(f.mapping(item, f"{path}[{i}]").get("name"), f"{path}[{i}].name")
        if value and not LABEL_VALUE.match(value):
            f.fail(f"{path}[{i}].name", f"must be a valid name, got {_show(value)}")
        elif value:
            names.add(value)
    return frozenset(names)


def parse_node(obj: Mapping[str, Any]) -> NodeInfo:
    """Validate a v1 Node: its name, labels (zone), pod CIDRs and addresses."""
    f = _Fields()
    meta = f.mapping(obj.get("metadata"), "metadata")
    name = f.string(meta.get("name"), "metadata.name")
    if not name or not DNS1123_SUBDOMAIN.match(name):
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
