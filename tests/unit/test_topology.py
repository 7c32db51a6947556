"""categorize_endpoints: upstream's CategorizeEndpoints (pkg/proxy/topology.go), pure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from kubeplex.core.model.topology import (
    PREFER_SAME_NODE,
    PREFER_SAME_ZONE,
    categorize_endpoints,
    topology_mode,
)
from kubeplex.core.model.types import Endpoint, IPFamily, ServicePort, ServicePortName

NODE = "node-a"
ZONE = "zone-a"
SPN = ServicePortName("prod", "web", "http")


def svc(**fields: Any) -> ServicePort:
    base: dict[str, Any] = {
        "name": SPN,
        "family": IPFamily.IPv4,
        "cluster_ip": "10.96.0.10",
        "port": 80,
    }
    base.update(fields)
    return ServicePort(**base)


def ep(
    ip: str,
    *,
    ready: bool = True,
    serving: bool | None = None,
    terminating: bool = False,
    local: bool = False,
    zones: Sequence[str] = (),
    nodes: Sequence[str] = (),
) -> Endpoint:
    return Endpoint(
        ip=ip,
        port=8080,
        ready=ready,
        serving=ready if serving is None else serving,
        terminating=terminating,
        is_local=local,
        node_name=NODE if local else "node-b",
        zone_hints=frozenset(zones),
        node_hints=frozenset(nodes),
    )


def terminating(ip: str, *, serving: bool = True, local: bool = False) -> Endpoint:
    return ep(ip, ready=False, serving=serving, terminating=True, local=local)


def ips(endpoints: Sequence[Endpoint]) -> list[str]:
    return [e.ip for e in endpoints]


# --- Cluster policy -------------------------------------------------------------------------------


def test_cluster_uses_ready_endpoints_only() -> None:
    eps = [
        ep("10.0.0.1"),
        ep("10.0.0.2", ready=False),  # not ready, not serving
        terminating("10.0.0.3"),  # serving but terminating: only a fallback
        ep("10.0.0.4", local=True),
    ]
    got = categorize_endpoints(eps, svc(), NODE, ZONE)
    assert ips(got.cluster) == ["10.0.0.1", "10.0.0.4"]
    assert got.local == ()
    assert got.reachable == got.cluster
    assert got.has_any
    assert got.topology_mode == ""


def test_cluster_falls_back_to_serving_terminating_when_none_ready() -> None:
    eps = [
        terminating("10.0.0.1"),
        terminating("10.0.0.2", serving=False),
        ep("10.0.0.3", ready=False),
    ]
    got = categorize_endpoints(eps, svc(), NODE, ZONE)
    assert ips(got.cluster) == ["10.0.0.1"]
    assert got.reachable == got.cluster
    assert got.has_any


def test_serving_but_not_terminating_is_never_a_fallback() -> None:
    # Not ready and serving, without terminating: upstream uses it for nothing.
    got = categorize_endpoints([ep("10.0.0.1", ready=False, serving=True)], svc(), NODE, ZONE)
    assert got.cluster == ()
    assert not got.has_any


def test_no_usable_endpoint_at_all() -> None:
    got = categorize_endpoints([ep("10.0.0.1", ready=False)], svc(), NODE, ZONE)
    assert got.cluster == got.local == got.reachable == ()
    assert not got.has_any


def test_no_endpoints() -> None:
    got = categorize_endpoints([], svc(), NODE, ZONE)
    assert got.cluster == got.local == got.reachable == ()
    assert not got.has_any


# --- internalTrafficPolicy Local ------------------------------------------------------------------


def test_internal_local_uses_local_ready_only() -> None:
    eps = [ep("10.0.0.1"), ep("10.0.0.2", local=True), terminating("10.0.0.3", local=True)]
    got = categorize_endpoints(eps, svc(internal_policy_local=True), NODE, ZONE)
    assert got.cluster == ()
    assert ips(got.local) == ["10.0.0.2"]
    assert got.reachable == got.local
    assert got.has_any


def test_internal_local_empty_when_none_local_but_has_any() -> None:
    got = categorize_endpoints(
        [ep("10.0.0.1"), ep("10.0.0.2")], svc(internal_policy_local=True), NODE, ZONE
    )
    assert got.local == got.reachable == got.cluster == ()
    # Endpoints exist elsewhere: traffic is dropped here, not rejected as "no endpoints".
    assert got.has_any


def test_internal_local_falls_back_to_local_serving_terminating() -> None:
    eps = [ep("10.0.0.1"), terminating("10.0.0.2", local=True), terminating("10.0.0.3")]
    got = categorize_endpoints(eps, svc(internal_policy_local=True), NODE, ZONE)
    # A remote ready endpoint does not stop the local fallback.
    assert ips(got.local) == ["10.0.0.2"]


def test_internal_local_with_only_terminating_elsewhere() -> None:
    got = categorize_endpoints(
        [terminating("10.0.0.1")], svc(internal_policy_local=True), NODE, ZONE
    )
    assert got.local == ()
    assert got.has_any


def test_internal_local_but_externally_accessible_also_uses_cluster() -> None:
    got = categorize_endpoints(
        [ep("10.0.0.1"), ep("10.0.0.2", local=True)],
        svc(internal_policy_local=True, node_port=30080),
        NODE,
        ZONE,
    )
    assert ips(got.cluster) == ["10.0.0.1", "10.0.0.2"]
    assert ips(got.local) == ["10.0.0.2"]
    assert ips(got.reachable) == ["10.0.0.1", "10.0.0.2"]


# --- externalTrafficPolicy Local ------------------------------------------------------------------


def test_external_local_uses_cluster_and_local() -> None:
    eps = [ep("10.0.0.1"), ep("10.0.0.2", local=True), ep("10.0.0.3")]
    got = categorize_endpoints(eps, svc(external_policy_local=True, node_port=30080), NODE, ZONE)
    assert ips(got.cluster) == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    assert ips(got.local) == ["10.0.0.2"]
    assert ips(got.reachable) == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    assert got.has_any


def test_external_local_reachable_is_union_with_terminating_local() -> None:
    # Local has only a terminating endpoint, cluster has the remote ready one: both reachable.
    eps = [ep("10.0.0.9"), terminating("10.0.0.1", local=True)]
    got = categorize_endpoints(
        eps, svc(external_policy_local=True, load_balancer_vips=("198.51.100.1",)), NODE, ZONE
    )
    assert ips(got.cluster) == ["10.0.0.9"]
    assert ips(got.local) == ["10.0.0.1"]
    # Sorted by "ip:port", as upstream's byEndpoint sorts.
    assert ips(got.reachable) == ["10.0.0.1", "10.0.0.9"]


def test_external_local_no_local_endpoint() -> None:
    got = categorize_endpoints(
        [ep("10.0.0.1")], svc(external_policy_local=True, external_ips=("192.0.2.1",)), NODE, ZONE
    )
    assert ips(got.cluster) == ["10.0.0.1"]
    assert got.local == ()
    assert got.reachable == got.cluster


def test_external_local_without_external_access_is_plain_cluster() -> None:
    # externalTrafficPolicy only matters for a port that is reachable from outside.
    got = categorize_endpoints(
        [ep("10.0.0.1"), ep("10.0.0.2", local=True)], svc(external_policy_local=True), NODE, ZONE
    )
    assert got.local == ()
    assert ips(got.reachable) == ["10.0.0.1", "10.0.0.2"]


# --- topology hints -------------------------------------------------------------------------------


def test_zone_hints_narrow_cluster_endpoints() -> None:
    eps = [
        ep("10.0.0.1", zones=["zone-a"]),
        ep("10.0.0.2", zones=["zone-b"]),
        ep("10.0.0.3", zones=["zone-a", "zone-c"]),
    ]
    got = categorize_endpoints(eps, svc(), NODE, ZONE)
    assert got.topology_mode == PREFER_SAME_ZONE
    assert ips(got.cluster) == ["10.0.0.1", "10.0.0.3"]
    assert got.has_any


def test_zone_hints_ignored_when_one_ready_endpoint_lacks_them() -> None:
    eps = [ep("10.0.0.1", zones=["zone-a"]), ep("10.0.0.2")]
    got = categorize_endpoints(eps, svc(), NODE, ZONE)
    assert got.topology_mode == ""
    assert ips(got.cluster) == ["10.0.0.1", "10.0.0.2"]


def test_zone_hints_of_not_ready_endpoints_do_not_count() -> None:
    # The not-ready endpoint has no hints: it does not disable topology.
    eps = [
        ep("10.0.0.1", zones=["zone-a"]),
        ep("10.0.0.2", zones=["zone-b"]),
        terminating("10.0.0.9"),
    ]
    got = categorize_endpoints(eps, svc(), NODE, ZONE)
    assert got.topology_mode == PREFER_SAME_ZONE
    assert ips(got.cluster) == ["10.0.0.1"]


def test_zone_hints_ignored_when_none_for_this_zone() -> None:
    eps = [ep("10.0.0.1", zones=["zone-b"]), ep("10.0.0.2", zones=["zone-c"])]
    got = categorize_endpoints(eps, svc(), NODE, ZONE)
    assert got.topology_mode == ""
    assert ips(got.cluster) == ["10.0.0.1", "10.0.0.2"]


def test_zone_hints_ignored_when_node_has_no_zone() -> None:
    eps = [ep("10.0.0.1", zones=["zone-a"]), ep("10.0.0.2", zones=["zone-b"])]
    got = categorize_endpoints(eps, svc(), NODE, "")
    assert got.topology_mode == ""
    assert len(got.cluster) == 2


def test_node_hints_preferred_over_zone_hints() -> None:
    eps = [
        ep("10.0.0.1", zones=["zone-a"], nodes=["node-b"]),
        ep("10.0.0.2", zones=["zone-a"], nodes=[NODE]),
        ep("10.0.0.3", zones=["zone-b"], nodes=["node-c"]),
    ]
    got = categorize_endpoints(eps, svc(), NODE, ZONE)
    assert got.topology_mode == PREFER_SAME_NODE
    assert ips(got.cluster) == ["10.0.0.2"]


def test_node_hints_incomplete_fall_back_to_zone_hints() -> None:
    eps = [
        ep("10.0.0.1", zones=["zone-a"], nodes=[NODE]),
        ep("10.0.0.2", zones=["zone-a"]),
        ep("10.0.0.3", zones=["zone-b"], nodes=["node-c"]),
    ]
    got = categorize_endpoints(eps, svc(), NODE, ZONE)
    assert got.topology_mode == PREFER_SAME_ZONE
    assert ips(got.cluster) == ["10.0.0.1", "10.0.0.2"]


def test_node_hints_not_for_this_node_fall_back_to_zone_hints() -> None:
    eps = [
        ep("10.0.0.1", zones=["zone-a"], nodes=["node-b"]),
        ep("10.0.0.2", zones=["zone-b"], nodes=["node-c"]),
    ]
    got = categorize_endpoints(eps, svc(), NODE, ZONE)
    assert got.topology_mode == PREFER_SAME_ZONE
    assert ips(got.cluster) == ["10.0.0.1"]


def test_no_ready_endpoints_means_no_topology_and_terminating_fallback() -> None:
    eps = [
        ep("10.0.0.1", ready=False, serving=True, terminating=True, zones=["zone-b"]),
        ep("10.0.0.2", ready=False, serving=True, terminating=True, zones=["zone-a"]),
    ]
    got = categorize_endpoints(eps, svc(), NODE, ZONE)
    assert got.topology_mode == ""
    # The fallback ignores topology: both terminating endpoints.
    assert ips(got.cluster) == ["10.0.0.1", "10.0.0.2"]


def test_topology_with_external_local_keeps_local_endpoint_reachable() -> None:
    # The local endpoint is hinted for another zone: not a cluster endpoint, but still local.
    eps = [
        ep("10.0.0.1", zones=["zone-a"]),
        ep("10.0.0.2", zones=["zone-b"], local=True),
    ]
    got = categorize_endpoints(eps, svc(external_policy_local=True, node_port=30080), NODE, ZONE)
    assert ips(got.cluster) == ["10.0.0.1"]
    assert ips(got.local) == ["10.0.0.2"]
    assert ips(got.reachable) == ["10.0.0.1", "10.0.0.2"]


def test_hints_do_not_narrow_internal_local() -> None:
    eps = [ep("10.0.0.1", zones=["zone-b"], local=True), ep("10.0.0.2", zones=["zone-a"])]
    got = categorize_endpoints(eps, svc(internal_policy_local=True), NODE, ZONE)
    assert got.topology_mode == ""
    assert ips(got.local) == ["10.0.0.1"]


@pytest.mark.parametrize(
    ("hints", "expected"),
    [
        ([([], [])], ""),
        ([(["zone-a"], [])], PREFER_SAME_ZONE),
        ([(["zone-a"], [NODE])], PREFER_SAME_NODE),
        ([(["zone-a"], [NODE]), ([], ["node-b"])], PREFER_SAME_NODE),
        ([(["zone-a"], [NODE]), (["zone-b"], [])], PREFER_SAME_ZONE),
        ([(["zone-a"], [NODE]), ([], [])], ""),
        ([(["zone-b"], ["node-b"])], ""),
    ],
)
def test_topology_mode(hints: list[tuple[list[str], list[str]]], expected: str) -> None:
    eps = [ep(f"10.0.0.{i}", zones=z, nodes=n) for i, (z, n) in enumerate(hints, 1)]
    assert topology_mode(eps, NODE, ZONE) == expected


# --- has_any --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "endpoints", "has_any"),
    [
        ({}, [terminating("10.0.0.1")], True),
        ({}, [terminating("10.0.0.1", serving=False)], False),
        ({"internal_policy_local": True}, [ep("10.0.0.1")], True),
        ({"internal_policy_local": True}, [terminating("10.0.0.1")], True),
        ({"internal_policy_local": True}, [ep("10.0.0.1", ready=False)], False),
        ({"external_policy_local": True, "node_port": 30080}, [ep("10.0.0.1")], True),
    ],
    ids=[
        "cluster-terminating",
        "cluster-not-serving",
        "local-remote-ready",
        "local-remote-terminating",
        "local-remote-not-ready",
        "external-local-remote-ready",
    ],
)
def test_has_any(policy: dict[str, Any], endpoints: list[Endpoint], has_any: bool) -> None:
    assert categorize_endpoints(endpoints, svc(**policy), NODE, ZONE).has_any is has_any
