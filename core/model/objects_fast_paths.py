"""The fast paths of parse_service and parse_endpoint_slice: the common, valid object checked
without building field paths or collecting errors.

Each returns None for anything it does not take, and the general path (``objects``) then checks
the object field by field and names what is wrong. The two must agree on every input (the same
object, or the general path's error): tests/unit/test_objects_fast_paths.py and
test_objects_service_fast_path.py hold them equal, so a rule changed in one is changed in both.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable
from typing import Any

from kubeplex.core.model.types import Protocol, fast_init, normalize_ip
from kubeplex.core.model.validated_objects import (
    DEFAULT_AFFINITY_TIMEOUT,
    DNS1123_LABEL,
    DNS1123_SUBDOMAIN,
    LABEL_VALUE,
    PORT_NAME,
    SERVICE_NAME_LABEL,
    EndpointSliceObject,
    PortSpec,
    ServiceObject,
    SliceEndpoint,
    SlicePort,
    trigger_time,
)

_new_service: Callable[..., ServiceObject] = fast_init(ServiceObject)
_new_port_spec: Callable[[str, Protocol, int, int], PortSpec] = fast_init(PortSpec)


#: What an unset optional field may be in the fast paths: absent, null, or empty.
_NOTHING: tuple[Any, ...] = (None, [])
#: A field's text (see _text) -> the value it stands for, when the fast path takes it.
_FAST_SERVICE_TYPES: dict[str | None, str] = {
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


def service_fast_path(obj: Any) -> ServiceObject | None:
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
    svc_type = _FAST_SERVICE_TYPES.get(_text(spec.get("type")))
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
        proto = _known_protocol(protocol)
        if proto is None:
            return None
        if (
            type(pname) is not str
            or (pname and (len(pname) > 15 or not PORT_NAME.match(pname)))
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


def endpoint_slice_fast_path(obj: Any) -> EndpointSliceObject | None:
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
        or not _is_subdomain(name)
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
            or (pname and (len(pname) > 15 or not PORT_NAME.match(pname)))
        ):
            return None
        proto = _known_protocol(protocol)
        if proto is None:
            return None
        ports.append(SlicePort(pname, proto, port))
    endpoints: list[SliceEndpoint] = []
    append = endpoints.append
    v4 = address_type == "IPv4"
    nodes, zones, make = _VALID_SUBDOMAINS, _ZONES, _new_slice_endpoint
    for raw in raw_endpoints:
        # The endpoint as an API server writes it (IPv4, the three conditions, a node name
        # and zone seen before, no hints) is checked here; endpoint_fast_path takes anything else.
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
            endpoint = endpoint_fast_path(raw, address_type)
            if endpoint is None:
                return None
        append(endpoint)
    return EndpointSliceObject(
        namespace=namespace,
        name=name,
        service_name=service_name,
        address_type=address_type,
        ports=tuple(ports),
        endpoints=tuple(endpoints),
        trigger_time=trigger_time(annotations),
    )


_PROTOCOLS = {p.value: p for p in Protocol}


def _known_protocol(value: Any) -> Protocol | None:
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


def _valid_and_remembered(
    names: dict[str, str], text: str, longest: int, pattern: re.Pattern[str]
) -> bool:
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


def _is_subdomain(text: str) -> bool:
    """dns_subdomain's check, remembered for a name seen before."""
    return _valid_and_remembered(_VALID_SUBDOMAINS, text, 253, DNS1123_SUBDOMAIN)


def _is_label(text: str) -> bool:
    """dns_label's check (with its default pattern), remembered for a name seen before."""
    return _valid_and_remembered(_VALID_LABELS, text, 63, DNS1123_LABEL)


def _shared_label(text: str) -> str | None:
    """The remembered copy of a valid DNS label (namespaces and Service names are shared by
    the objects that name them); None if it is not one."""
    found = _VALID_LABELS.get(text)
    if found is not None:
        return found
    return text if _is_label(text) else None


def _shared_zone(text: str) -> str:
    """The shared copy of a zone name."""
    found = _ZONES.get(text)
    if found is None:
        if len(_ZONES) >= _VALID_NAMES_LIMIT:
            _ZONES.clear()
        found = _ZONES[text] = text
    return found


def endpoint_fast_path(raw: Any, address_type: str) -> SliceEndpoint | None:
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
        zone_hints = _hint_names_or_none(hints.get("forZones"))
        node_hints = _hint_names_or_none(hints.get("forNodes"))
    if zone_hints is None or node_hints is None:
        return None
    return _new_slice_endpoint(
        ip,
        True if ready is None else ready,
        True if serving is None else serving,
        bool(terminating),
        _VALID_SUBDOMAINS.get(node_name, node_name) if node_name else "",
        _shared_zone(zone) if zone else "",
        zone_hints,
        node_hints,
    )


def _node_name_ok(text: str) -> bool:
    """The general path's nodeName check (the pattern only, no length limit), remembered
    when it also passes _is_subdomain's (which shares the set)."""
    if not DNS1123_SUBDOMAIN.match(text):
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


def _hint_names_or_none(raw: Any) -> frozenset[str] | None:
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
        if type(value) is not str or not LABEL_VALUE.match(value):
            return None
        if value:
            names.add(value)
    return frozenset(names)
