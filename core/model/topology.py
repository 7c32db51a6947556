"""Which endpoints a Service port uses on this node: upstream's CategorizeEndpoints, pure.

Cluster endpoints are the ready ones (narrowed by topology hints when every ready endpoint has
hints and some are for this node or zone), falling back to serving+terminating ones when none
is ready. Local endpoints serve the Local traffic policies, with the same fallback.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kubeplex.core.model.types import Endpoint, ServicePort

PREFER_SAME_NODE = "PreferSameNode"
PREFER_SAME_ZONE = "PreferSameZone"


@dataclass(frozen=True, slots=True)
class CategorizedEndpoints:
    cluster: tuple[Endpoint, ...]
    local: tuple[Endpoint, ...]
    #: Every endpoint some rule of this node can send to (cluster and local), in upstream order.
    reachable: tuple[Endpoint, ...]
    #: True if the Service has a usable endpoint anywhere in the cluster.
    has_any: bool
    #: The topology narrowing in force ("", PreferSameNode or PreferSameZone).
    topology_mode: str = ""


def topology_mode(endpoints: Sequence[Endpoint], node_name: str, zone: str) -> str:
    """Hints are used only if every ready endpoint has them and one is for this node/zone."""
    ready = [ep for ep in endpoints if ep.ready]
    if not ready:
        return ""
    first = ready[0]  # (without hints, as most are: neither mode, and no generator made)
    if (
        first.node_hints
        and all(ep.node_hints for ep in ready)
        and any(node_name in ep.node_hints for ep in ready)
    ):
        return PREFER_SAME_NODE
    if (
        first.zone_hints
        and all(ep.zone_hints for ep in ready)
        and any(zone in ep.zone_hints for ep in ready)
    ):
        return PREFER_SAME_ZONE
    return ""


def _cluster_ready(
    endpoints: Sequence[Endpoint], mode: str, node_name: str, zone: str
) -> tuple[Endpoint, ...]:
    """The ready endpoints the topology mode leaves (one comprehension per mode: this runs
    for every Service port of a full sync)."""
    if mode == PREFER_SAME_NODE:
        return tuple([ep for ep in endpoints if ep.ready and node_name in ep.node_hints])
    if mode == PREFER_SAME_ZONE:
        return tuple([ep for ep in endpoints if ep.ready and zone in ep.zone_hints])
    return tuple([ep for ep in endpoints if ep.ready])


def _cluster_terminating(
    endpoints: Sequence[Endpoint], mode: str, node_name: str, zone: str
) -> tuple[Endpoint, ...]:
    """The serving, terminating endpoints the topology mode leaves."""
    if mode == PREFER_SAME_NODE:
        return tuple(
            [ep for ep in endpoints if ep.serving and ep.terminating and node_name in ep.node_hints]
        )
    if mode == PREFER_SAME_ZONE:
        return tuple(
            [ep for ep in endpoints if ep.serving and ep.terminating and zone in ep.zone_hints]
        )
    return tuple([ep for ep in endpoints if ep.serving and ep.terminating])


def categorize_endpoints(
    endpoints: Sequence[Endpoint], svc: ServicePort, node_name: str, zone: str
) -> CategorizedEndpoints:
    cluster: tuple[Endpoint, ...] = ()
    local: tuple[Endpoint, ...] = ()
    has_any = False
    mode = ""

    if svc.uses_cluster_endpoints:
        mode = topology_mode(endpoints, node_name, zone)
        cluster = _cluster_ready(endpoints, mode, node_name, zone)
        if not cluster:
            # No ready endpoint anywhere (topology never hides all of them): use the
            # serving ones that are shutting down rather than dropping traffic.
            cluster = _cluster_terminating(endpoints, mode, node_name, zone)
        has_any = bool(cluster)

    if not svc.uses_local_endpoints:
        return CategorizedEndpoints(cluster, (), cluster, has_any, mode)

    has_local_ready = has_local_terminating = False
    for ep in endpoints:
        if ep.ready:
            has_any = True
            has_local_ready = has_local_ready or ep.is_local
        elif ep.serving and ep.terminating:
            has_any = True
            has_local_terminating = has_local_terminating or ep.is_local
    if has_local_ready:
        local = tuple([ep for ep in endpoints if ep.is_local and ep.ready])
    elif has_local_terminating:
        local = tuple([ep for ep in endpoints if ep.is_local and ep.serving and ep.terminating])

    if not svc.uses_cluster_endpoints:
        return CategorizedEndpoints((), local, local, has_any, mode)
    if not local:
        return CategorizedEndpoints(cluster, local, cluster, has_any, mode)
    merged = {ep.address: ep for ep in cluster}
    merged.update((ep.address, ep) for ep in local)
    reachable = tuple(sorted(merged.values(), key=lambda ep: ep.address))
    return CategorizedEndpoints(cluster, local, reachable, has_any, mode)
