"""What the API server allocates to one Service only: its ClusterIPs, and its node ports.

The API server's allocators hand out each ClusterIP to one Service (whatever the ports), and
each node port number to one Service: nodePorts of every protocol and healthCheckNodePorts
share one range (pkg/registry/core/service/portallocator), though the TCP and the UDP port of
one Service may share a number. A folder of manifests has no allocator, so ClusterState uses
these claims to refuse a Service that asks for what another already holds. External IPs and
load-balancer IPs are not allocated and may be shared.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubeplex.core.model.errors import FieldError, InvalidObject
from kubeplex.core.model.types import Protocol
from kubeplex.core.model.validated_objects import ServiceObject

#: What a Service holds (``ClusterIP 10.96.0.10``, ``node port 30080``) -> the field asking.
Claims = dict[str, str]


def claims_of(svc: ServiceObject, spec: Mapping[str, Any]) -> Claims:
    """Everything ``svc`` holds, each with the field of ``spec`` (its raw form) asking for it;
    raises InvalidObject if it asks for one node port twice, as the API server refuses (the
    same number twice in one protocol, or as its own healthCheckNodePort)."""
    claims: Claims = {}
    if not svc.headless:
        # The field the user wrote: spec.clusterIPs if given (spec.clusterIP is its first).
        listed = bool(spec.get("clusterIPs"))
        for i, ip in enumerate(svc.cluster_ips):
            claims[f"ClusterIP {ip}"] = f"spec.clusterIPs[{i}]" if listed else "spec.clusterIP"
    errors: list[FieldError] = []
    seen: dict[tuple[Protocol, int], str] = {}
    for i, port in enumerate(svc.ports):
        if not port.node_port or svc.type not in ("NodePort", "LoadBalancer"):
            continue
        path = f"spec.ports[{i}].nodePort"
        first = seen.setdefault((port.protocol, port.node_port), path)
        if first != path:
            errors.append(
                FieldError(path, f"duplicate node port {port.node_port}/{port.protocol} ({first})")
            )
        claims.setdefault(f"node port {port.node_port}", path)
    health = health_check_node_port(svc)
    if health:
        what = f"node port {health}"
        if what in claims:
            errors.append(
                FieldError(
                    "spec.healthCheckNodePort",
                    f"{health} is already {claims[what]}; a node port is allocated once",
                )
            )
        claims[what] = claims.get(what, "spec.healthCheckNodePort")
    if errors:
        raise InvalidObject(f"Service {svc.key}", errors)
    return claims


def health_check_node_port(svc: ServiceObject) -> int:
    """The healthCheckNodePort the API server allocates and kube-proxy serves: a
    LoadBalancer Service's with externalTrafficPolicy Local (0: none)."""
    if svc.type == "LoadBalancer" and svc.external_traffic_policy == "Local":
        return svc.health_check_node_port
    return 0
