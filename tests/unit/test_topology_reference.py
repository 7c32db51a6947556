"""categorize_endpoints agrees, on any endpoints and Service port, with its plain reading of
upstream's CategorizeEndpoints kept here as the reference (one predicate per endpoint)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from kubeplex.core.model.topology import (
    PREFER_SAME_NODE,
    PREFER_SAME_ZONE,
    CategorizedEndpoints,
    categorize_endpoints,
)
from kubeplex.core.model.types import Endpoint, IPFamily, ServicePort, ServicePortName

NODE, ZONE = "node-a", "zone-a"


def reference_mode(endpoints: Sequence[Endpoint], node_name: str, zone: str) -> str:
    ready = [ep for ep in endpoints if ep.ready]
    if not ready:
        return ""
    if all(ep.node_hints for ep in ready) and any(node_name in ep.node_hints for ep in ready):
        return PREFER_SAME_NODE
    if all(ep.zone_hints for ep in ready) and any(zone in ep.zone_hints for ep in ready):
        return PREFER_SAME_ZONE
    return ""


def reference(
    endpoints: Sequence[Endpoint], svc: ServicePort, node_name: str, zone: str
) -> CategorizedEndpoints:
    def available(ep: Endpoint, mode: str) -> bool:
        if mode == PREFER_SAME_NODE:
            return node_name in ep.node_hints
        if mode == PREFER_SAME_ZONE:
            return zone in ep.zone_hints
        return True

    def select(keep: Callable[[Endpoint], bool]) -> tuple[Endpoint, ...]:
        return tuple(ep for ep in endpoints if keep(ep))

    cluster: tuple[Endpoint, ...] = ()
    local: tuple[Endpoint, ...] = ()
    has_any = False
    mode = ""
    if svc.uses_cluster_endpoints:
        mode = reference_mode(endpoints, node_name, zone)
        cluster = select(lambda ep: ep.ready and available(ep, mode))
        if not cluster:
            cluster = select(lambda ep: ep.serving and ep.terminating and available(ep, mode))
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
        local = select(lambda ep: ep.is_local and ep.ready)
    elif has_local_terminating:
        local = select(lambda ep: ep.is_local and ep.serving and ep.terminating)
    if not svc.uses_cluster_endpoints:
        return CategorizedEndpoints((), local, local, has_any, mode)
    if not local:
        return CategorizedEndpoints(cluster, local, cluster, has_any, mode)
    merged = {ep.address: ep for ep in cluster}
    merged.update((ep.address, ep) for ep in local)
    reachable = tuple(sorted(merged.values(), key=lambda ep: ep.address))
    return CategorizedEndpoints(cluster, local, reachable, has_any, mode)


hints = st.frozensets(st.sampled_from([NODE, "node-b", ZONE, "zone-b"]), max_size=2)
endpoints = st.lists(
    st.builds(
        Endpoint,
        ip=st.sampled_from(["10.0.0.1", "10.0.0.2", "10.0.0.3", "fd00::1"]),
        port=st.sampled_from([80, 8080]),
        ready=st.booleans(),
        serving=st.booleans(),
        terminating=st.booleans(),
        is_local=st.booleans(),
        zone_hints=hints,
        node_hints=hints,
    ),
    max_size=6,
)
ports = st.builds(
    ServicePort,
    name=st.just(ServicePortName("prod", "web", "http")),
    family=st.just(IPFamily.IPv4),
    cluster_ip=st.just("10.96.0.10"),
    port=st.just(80),
    node_port=st.sampled_from([0, 30080]),
    internal_policy_local=st.booleans(),
    external_policy_local=st.booleans(),
)


@settings(max_examples=1500, deadline=None)
@given(endpoints, ports, st.sampled_from([NODE, ""]), st.sampled_from([ZONE, ""]))
def test_categorize_agrees_with_the_reference(
    eps: list[Endpoint], svc: ServicePort, node: str, zone: str
) -> None:
    assert categorize_endpoints(eps, svc, node, zone) == reference(eps, svc, node, zone)
