"""Service and endpoint change tracking, and ClusterState end to end (pure, no root).

Upstream reference: pkg/proxy/servicechangetracker.go, endpointschangetracker.go and
endpointslicecache.go.
"""

from __future__ import annotations

from typing import Any

import pytest

from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.errors import InvalidObject
from kubeplex.core.model.graph import StaleEndpoint
from kubeplex.core.model.objects import parse_endpoint_slice, parse_service
from kubeplex.core.model.tracker import (
    EndpointsChangeTracker,
    ServiceChangeTracker,
    merge_slices,
    service_ports,
)
from kubeplex.core.model.types import Endpoint, IPFamily, Protocol, ServicePortName
from kubeplex.core.model.validated_objects import EndpointSliceObject, ServiceObject

V4, V6 = IPFamily.IPv4, IPFamily.IPv6
NODE = "node-a"
SERVICE_NAME = "kubernetes.io/service-name"


def service_obj(
    name: str = "web",
    ports: list[dict[str, Any]] | None = None,
    namespace: str = "prod",
    status: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "clusterIP": "10.96.0.10",
            "ports": ports if ports is not None else [{"name": "http", "port": 80}],
        },
    }
    obj["spec"].update(spec)
    if status is not None:
        obj["status"] = status
    return obj


def service(
    name: str = "web", ports: list[dict[str, Any]] | None = None, **kw: Any
) -> ServiceObject:
    return parse_service(service_obj(name, ports, **kw))


def ep_obj(ip: str, node: str = "node-b", **fields: Any) -> dict[str, Any]:
    ep: dict[str, Any] = {"addresses": [ip], "nodeName": node}
    ep.update(fields)
    return ep


def not_serving(ip: str, node: str = "node-b") -> dict[str, Any]:
    return ep_obj(ip, node, conditions={"ready": False, "serving": False})


def terminating(ip: str, node: str = "node-b") -> dict[str, Any]:
    return ep_obj(ip, node, conditions={"ready": False, "serving": True, "terminating": True})


def slice_obj(
    name: str = "web-1",
    service_name: str = "web",
    endpoints: list[dict[str, Any]] | None = None,
    ports: list[dict[str, Any]] | None = None,
    address_type: str = "IPv4",
    namespace: str = "prod",
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": {SERVICE_NAME: service_name},
    }
    if annotations:
        meta["annotations"] = annotations
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": meta,
        "addressType": address_type,
        "ports": ports if ports is not None else [{"name": "http", "port": 8080}],
        "endpoints": endpoints if endpoints is not None else [ep_obj("10.244.1.2")],
    }


def eslice(*args: Any, **kw: Any) -> EndpointSliceObject:
    return parse_endpoint_slice(slice_obj(*args, **kw))


def spn(
    port: str = "http", name: str = "web", protocol: Protocol = Protocol.TCP
) -> ServicePortName:
    return ServicePortName("prod", name, port, protocol)


UDP = [{"name": "dns", "port": 53, "protocol": "UDP"}]
UDP_SPN = spn("dns", protocol=Protocol.UDP)


def addresses(eps: tuple[Endpoint, ...]) -> list[str]:
    return [e.address for e in eps]


# --- service_ports ------------------------------------------------------------------------------


def test_cluster_ip_service_gives_one_port_per_service_port() -> None:
    svc = service(
        ports=[{"name": "http", "port": 80}, {"name": "dns", "port": 53, "protocol": "UDP"}]
    )
    ports = service_ports(svc, V4)
    assert set(ports) == {spn("http"), UDP_SPN}
    http = ports[spn("http")]
    assert (http.cluster_ip, http.port, http.protocol, http.family) == (
        "10.96.0.10",
        80,
        Protocol.TCP,
        V4,
    )
    assert http.node_port == 0
    assert not http.externally_accessible
    assert service_ports(svc, V6) == {}


def test_dual_stack_service_gives_one_port_per_family() -> None:
    svc = service(
        clusterIPs=["10.96.0.10", "fd00::10"],
        type="LoadBalancer",
        ports=[{"name": "http", "port": 80, "nodePort": 30080}],
        externalIPs=["192.0.2.1", "2001:db8::1"],
        loadBalancerSourceRanges=["203.0.113.0/24", "2001:db8:1::/48"],
        status={"loadBalancer": {"ingress": [{"ip": "198.51.100.1"}, {"ip": "2001:db8::99"}]}},
    )
    v4, v6 = service_ports(svc, V4)[spn()], service_ports(svc, V6)[spn()]
    assert (v4.cluster_ip, v6.cluster_ip) == ("10.96.0.10", "fd00::10")
    assert (v4.external_ips, v6.external_ips) == (("192.0.2.1",), ("2001:db8::1",))
    assert (v4.load_balancer_vips, v6.load_balancer_vips) == (("198.51.100.1",), ("2001:db8::99",))
    assert v4.load_balancer_source_ranges == ("203.0.113.0/24",)
    assert v6.load_balancer_source_ranges == ("2001:db8:1::/48",)
    assert v4.node_port == v6.node_port == 30080


@pytest.mark.parametrize(
    "spec",
    [{"clusterIP": "None"}, {"type": "ExternalName", "externalName": "db.example.com"}],
    ids=["headless", "ExternalName"],
)
def test_headless_and_external_name_produce_nothing(spec: dict[str, Any]) -> None:
    svc = service(**spec)
    assert service_ports(svc, V4) == {}
    tracker = ServiceChangeTracker(V4)
    assert not tracker.update(svc.key, svc)
    assert tracker.checkout().changed == frozenset()


def test_external_traffic_policy_local_needs_external_access() -> None:
    plain = service(externalTrafficPolicy="Local")
    assert not service_ports(plain, V4)[spn()].external_policy_local
    with_ext_ip = service(externalTrafficPolicy="Local", externalIPs=["192.0.2.1"])
    assert service_ports(with_ext_ip, V4)[spn()].external_policy_local


def test_health_check_node_port_only_for_load_balancer_local() -> None:
    ports = [{"name": "http", "port": 80, "nodePort": 30080}]
    lb_local = service(
        type="LoadBalancer", ports=ports, externalTrafficPolicy="Local", healthCheckNodePort=32000
    )
    np_local = service(
        type="NodePort", ports=ports, externalTrafficPolicy="Local", healthCheckNodePort=32000
    )
    lb_cluster = service(type="LoadBalancer", ports=ports, healthCheckNodePort=32000)
    assert service_ports(lb_local, V4)[spn()].health_check_node_port == 32000
    assert service_ports(np_local, V4)[spn()].health_check_node_port == 0
    assert service_ports(lb_cluster, V4)[spn()].health_check_node_port == 0


def test_affinity_and_internal_policy_carried() -> None:
    svc = service(
        sessionAffinity="ClientIP",
        sessionAffinityConfig={"clientIP": {"timeoutSeconds": 30}},
        internalTrafficPolicy="Local",
    )
    port = service_ports(svc, V4)[spn()]
    assert port.session_affinity_client_ip
    assert port.sticky_max_age_seconds == 30
    assert port.internal_policy_local


# --- ServiceChangeTracker -----------------------------------------------------------------------


def test_service_add_lists_its_ports() -> None:
    t = ServiceChangeTracker(V4)
    svc = service(ports=[{"name": "http", "port": 80}, {"name": "https", "port": 443}])
    assert t.update(svc.key, svc)
    assert t.pending == 1
    changes = t.checkout()
    assert changes.changed == {spn("http"), spn("https")}
    assert changes.stale_service_ips == frozenset()
    assert set(t.ports) == {spn("http"), spn("https")}
    assert t.pending == 0


def test_only_the_touched_service_port_is_changed() -> None:
    t = ServiceChangeTracker(V4)
    for svc in (
        service("web", ports=[{"name": "http", "port": 80}, {"name": "https", "port": 443}]),
        service("db", ports=[{"name": "sql", "port": 5432}], clusterIP="10.96.0.20"),
    ):
        t.update(svc.key, svc)
    t.checkout()
    changed = service("web", ports=[{"name": "http", "port": 8000}, {"name": "https", "port": 443}])
    t.update(changed.key, changed)
    assert t.checkout().changed == {spn("http")}
    assert t.ports[spn("http")].port == 8000
    assert t.ports[spn("https")].port == 443


def test_change_reverted_before_checkout_is_no_change() -> None:
    t = ServiceChangeTracker(V4)
    original = service()
    t.update(original.key, original)
    t.checkout()
    assert t.update(original.key, service(ports=[{"name": "http", "port": 81}]))
    assert not t.update(original.key, original)
    assert t.pending == 0
    assert t.checkout().changed == frozenset()
    assert t.ports[spn()].port == 80


def test_added_then_deleted_before_checkout_is_no_change() -> None:
    t = ServiceChangeTracker(V4)
    svc = service()
    t.update(svc.key, svc)
    t.update(svc.key, None)
    assert t.checkout().changed == frozenset()
    assert t.ports == {}


def test_sync_without_changes_is_empty() -> None:
    t = ServiceChangeTracker(V4)
    svc = service()
    t.update(svc.key, svc)
    t.checkout()
    assert not t.update(svc.key, service())  # the same Service again
    changes = t.checkout()
    assert changes.changed == frozenset()
    assert changes.stale_service_ips == frozenset()
    assert set(t.ports) == {spn()}


def test_deleting_a_service_lists_its_ports() -> None:
    t = ServiceChangeTracker(V4)
    svc = service(ports=[{"name": "http", "port": 80}, {"name": "https", "port": 443}])
    t.update(svc.key, svc)
    t.checkout()
    assert t.update(svc.key, None)
    changes = t.checkout()
    assert changes.changed == {spn("http"), spn("https")}
    assert changes.stale_service_ips == frozenset()  # TCP only
    assert t.ports == {}


@pytest.mark.parametrize("protocol", ["UDP", "SCTP"])
def test_deleting_a_connectionless_service_reports_its_cluster_ip(protocol: str) -> None:
    t = ServiceChangeTracker(V4)
    svc = service(ports=[{"name": "dns", "port": 53, "protocol": protocol}])
    t.update(svc.key, svc)
    assert t.checkout().stale_service_ips == frozenset()
    t.update(svc.key, None)
    assert t.checkout().stale_service_ips == {"10.96.0.10"}


def test_removing_a_udp_port_of_a_remaining_service_reports_its_cluster_ip() -> None:
    t = ServiceChangeTracker(V4)
    both = service(ports=[{"name": "http", "port": 80}, *[dict(p) for p in UDP]])
    t.update(both.key, both)
    t.checkout()
    tcp_only = service()
    t.update(tcp_only.key, tcp_only)
    changes = t.checkout()
    assert changes.changed == {UDP_SPN}
    assert changes.stale_service_ips == {"10.96.0.10"}


def test_changing_a_udp_port_is_not_a_deletion() -> None:
    # Upstream filters ports present before and after out of the unmerge: no stale cluster IP.
    t = ServiceChangeTracker(V4)
    svc = service(ports=UDP)
    t.update(svc.key, svc)
    t.checkout()
    moved = service(ports=[{"name": "dns", "port": 5353, "protocol": "UDP"}])
    t.update(moved.key, moved)
    changes = t.checkout()
    assert changes.changed == {UDP_SPN}
    assert changes.stale_service_ips == frozenset()


def test_service_trackers_per_family() -> None:
    svc = service(clusterIPs=["10.96.0.10", "fd00::10"])
    v4, v6 = ServiceChangeTracker(V4), ServiceChangeTracker(V6)
    for t in (v4, v6):
        t.update(svc.key, svc)
    assert v4.checkout().changed == v6.checkout().changed == {spn()}
    assert v4.ports[spn()].cluster_ip == "10.96.0.10"
    assert v6.ports[spn()].cluster_ip == "fd00::10"
    # A single-stack v4 Service is nothing to the v6 tracker.
    single = service("db", clusterIP="10.96.0.20")
    assert not v6.update(single.key, single)
    assert v6.checkout().changed == frozenset()


# --- merge_slices -------------------------------------------------------------------------------


def test_multi_slice_merge() -> None:
    slices = {
        "web-1": eslice("web-1", endpoints=[ep_obj("10.244.1.2"), ep_obj("10.244.1.3")]),
        "web-2": eslice("web-2", endpoints=[ep_obj("10.244.2.2")]),
    }
    merged = merge_slices(slices, NODE)
    assert set(merged) == {spn()}
    assert addresses(merged[spn()]) == ["10.244.1.2:8080", "10.244.1.3:8080", "10.244.2.2:8080"]


def test_ports_of_different_slices_kept_apart() -> None:
    slices = {
        "web-1": eslice("web-1", ports=[{"name": "http", "port": 8080}]),
        "web-2": eslice("web-2", ports=UDP, endpoints=[ep_obj("10.244.1.9")]),
    }
    merged = merge_slices(slices, NODE)
    assert addresses(merged[spn()]) == ["10.244.1.2:8080"]
    assert addresses(merged[UDP_SPN]) == ["10.244.1.9:53"]


@pytest.mark.parametrize("local_slice", ["web-1", "web-2"])
def test_duplicate_endpoint_prefers_local_copy(local_slice: str) -> None:
    other = "web-2" if local_slice == "web-1" else "web-1"
    slices = {
        local_slice: eslice(local_slice, endpoints=[ep_obj("10.244.1.2", node=NODE)]),
        other: eslice(other, endpoints=[ep_obj("10.244.1.2", node="node-b")]),
    }
    (only,) = merge_slices(slices, NODE)[spn()]
    assert only.is_local
    assert only.node_name == NODE


def test_endpoints_sorted_by_ip_port_string() -> None:
    es = eslice(endpoints=[ep_obj("10.244.1.9"), ep_obj("10.244.1.100"), ep_obj("10.244.1.10")])
    merged = merge_slices({"web-1": es}, NODE)
    # Byte order of "ip:port", as upstream's byEndpoint: "0" sorts before ":", so .100 first.
    assert addresses(merged[spn()]) == [
        "10.244.1.100:8080",
        "10.244.1.10:8080",
        "10.244.1.9:8080",
    ]


def test_ipv6_endpoint_address_is_bracketed() -> None:
    es = eslice(address_type="IPv6", endpoints=[ep_obj("fd00::2")])
    assert addresses(merge_slices({"web-1": es}, NODE)[spn()]) == ["[fd00::2]:8080"]


def test_endpoint_fields_and_locality() -> None:
    es = eslice(
        endpoints=[
            ep_obj(
                "10.244.1.2",
                node=NODE,
                zone="zone-a",
                conditions={"ready": False, "serving": True, "terminating": True},
                hints={"forZones": [{"name": "zone-a"}], "forNodes": [{"name": NODE}]},
            ),
            ep_obj("10.244.1.3", node="node-b"),
            {"addresses": ["10.244.1.4"]},
        ]
    )
    a, b, c = merge_slices({"web-1": es}, NODE)[spn()]
    assert a == Endpoint(
        ip="10.244.1.2",
        port=8080,
        ready=False,
        serving=True,
        terminating=True,
        is_local=True,
        node_name=NODE,
        zone="zone-a",
        zone_hints=frozenset({"zone-a"}),
        node_hints=frozenset({NODE}),
    )
    assert not b.is_local
    assert not c.is_local
    # Without a node name of its own, nothing is local (upstream's isLocal needs a hostname).
    assert not merge_slices({"web-1": eslice(endpoints=[ep_obj("10.244.1.2", node="")])}, "")[
        spn()
    ][0].is_local


def test_slice_without_endpoints_gives_no_entry() -> None:
    assert merge_slices({"web-1": eslice(endpoints=[])}, NODE) == {}


# --- EndpointsChangeTracker ---------------------------------------------------------------------


def test_endpoint_tracker_changed_set_and_merge() -> None:
    t = EndpointsChangeTracker(V4, NODE)
    assert t.update(eslice("web-1"))
    assert t.update(eslice("web-2", endpoints=[ep_obj("10.244.2.2")]))
    assert t.update(eslice("db-1", service_name="db", endpoints=[ep_obj("10.244.3.3")]))
    assert t.pending == 2  # two Services
    changes = t.checkout()
    assert changes.changed == {spn(), spn(name="db")}
    assert addresses(t.endpoints[spn()]) == ["10.244.1.2:8080", "10.244.2.2:8080"]
    # Touch one slice of web: only web's port changes.
    t.update(eslice("web-2", endpoints=[ep_obj("10.244.2.3")]))
    assert t.checkout().changed == {spn()}
    assert addresses(t.endpoints[spn()]) == ["10.244.1.2:8080", "10.244.2.3:8080"]
    assert addresses(t.endpoints[spn(name="db")]) == ["10.244.3.3:8080"]


def test_same_slice_again_needs_no_sync() -> None:
    t = EndpointsChangeTracker(V4, NODE)
    t.update(eslice())
    t.checkout()
    assert not t.update(eslice())
    assert t.pending == 0


def test_slice_change_reverted_before_checkout_is_no_change() -> None:
    t = EndpointsChangeTracker(V4, NODE)
    t.update(eslice())
    t.checkout()
    t.update(eslice(endpoints=[ep_obj("10.244.9.9")]))
    t.update(eslice())
    changes = t.checkout()
    assert changes.changed == frozenset()
    assert changes.stale_endpoints == ()
    assert addresses(t.endpoints[spn()]) == ["10.244.1.2:8080"]


def test_endpoint_moving_between_slices_is_no_change() -> None:
    t = EndpointsChangeTracker(V4, NODE)
    t.update(eslice("web-1", endpoints=[ep_obj("10.244.1.2"), ep_obj("10.244.1.3")]))
    t.checkout()
    t.update(eslice("web-1", endpoints=[ep_obj("10.244.1.2")]))
    t.update(eslice("web-2", endpoints=[ep_obj("10.244.1.3")]))
    assert t.checkout().changed == frozenset()


def test_removing_the_last_slice_deletes_the_endpoints() -> None:
    t = EndpointsChangeTracker(V4, NODE)
    es = eslice()
    t.update(es)
    t.checkout()
    assert t.update(es, removed=True)
    assert t.checkout().changed == {spn()}
    assert t.endpoints == {}
    assert t.slice_keys() == set()


def test_other_family_and_fqdn_slices_are_ignored() -> None:
    t = EndpointsChangeTracker(V4, NODE)
    assert not t.update(eslice("web-v6", address_type="IPv6", endpoints=[ep_obj("fd00::2")]))
    assert not t.update(
        eslice("web-fqdn", address_type="FQDN", endpoints=[{"addresses": ["db.example.com"]}])
    )
    assert t.pending == 0
    assert t.checkout().changed == frozenset()
    assert t.endpoints == {}
    v6 = EndpointsChangeTracker(V6, NODE)
    assert v6.update(eslice("web-v6", address_type="IPv6", endpoints=[ep_obj("fd00::2")]))
    v6.checkout()
    assert addresses(v6.endpoints[spn()]) == ["[fd00::2]:8080"]


def test_trigger_times_earliest_per_service() -> None:
    t = EndpointsChangeTracker(V4, NODE)
    late = {"endpoints.kubernetes.io/last-change-trigger-time": "2024-05-01T10:00:05Z"}
    early = {"endpoints.kubernetes.io/last-change-trigger-time": "2024-05-01T10:00:00Z"}
    t.update(eslice("web-1", annotations=late))
    t.update(eslice("web-2", annotations=early, endpoints=[ep_obj("10.244.2.2")]))
    times = t.checkout().trigger_times
    assert times == {"prod/web": 1714557600.0}
    assert t.checkout().trigger_times == {}


# --- stale UDP/SCTP endpoints and newly active services -----------------------------------------


def stale_after(
    before: list[dict[str, Any]], after: list[dict[str, Any]], ports: list[dict[str, Any]] = UDP
) -> tuple[list[str], set[ServicePortName]]:
    t = EndpointsChangeTracker(V4, NODE)
    t.update(eslice(ports=ports, endpoints=before))
    t.checkout()
    t.update(eslice(ports=ports, endpoints=after))
    changes = t.checkout()
    return [f"{s.service}/{s.endpoint}" for s in changes.stale_endpoints], set(changes.newly_active)


def test_removed_udp_endpoint_is_stale() -> None:
    stale, active = stale_after(
        [ep_obj("10.244.1.2"), ep_obj("10.244.1.3")], [ep_obj("10.244.1.3")]
    )
    assert stale == ["prod/web:dns/10.244.1.2:53"]
    assert active == set()


def test_stale_endpoint_value() -> None:
    t = EndpointsChangeTracker(V4, NODE)
    t.update(eslice(ports=UDP))
    t.checkout()
    t.update(eslice(ports=UDP, endpoints=[]))
    (stale,) = t.checkout().stale_endpoints
    assert stale == StaleEndpoint(UDP_SPN, Endpoint(ip="10.244.1.2", port=53, node_name="node-b"))


def test_all_udp_endpoints_removed_are_stale() -> None:
    stale, _ = stale_after([ep_obj("10.244.1.2"), ep_obj("10.244.1.3")], [])
    assert stale == ["prod/web:dns/10.244.1.2:53", "prod/web:dns/10.244.1.3:53"]


def test_udp_endpoint_going_not_serving_is_stale() -> None:
    stale, _ = stale_after([ep_obj("10.244.1.2")], [not_serving("10.244.1.2")])
    assert stale == ["prod/web:dns/10.244.1.2:53"]


def test_udp_endpoint_starting_to_terminate_while_serving_is_not_stale() -> None:
    # Upstream compares ip:port and serving only: graceful termination keeps the flows.
    stale, _ = stale_after([ep_obj("10.244.1.2")], [terminating("10.244.1.2")])
    assert stale == []


def test_udp_endpoint_changing_hints_is_not_stale() -> None:
    hinted = ep_obj("10.244.1.2", hints={"forZones": [{"name": "zone-a"}]})
    stale, _ = stale_after([ep_obj("10.244.1.2")], [hinted])
    assert stale == []


def test_not_serving_old_endpoint_is_never_stale() -> None:
    stale, _ = stale_after(
        [not_serving("10.244.1.2"), ep_obj("10.244.1.3")], [ep_obj("10.244.1.3")]
    )
    assert stale == []


def test_tcp_endpoints_are_never_stale() -> None:
    tcp = [{"name": "http", "port": 8080}]
    stale, active = stale_after([ep_obj("10.244.1.2")], [], ports=tcp)
    assert stale == []
    stale, active = stale_after([], [ep_obj("10.244.1.2")], ports=tcp)
    assert active == set()


def test_sctp_endpoints_are_stale_too() -> None:
    sctp = [{"name": "sig", "port": 3868, "protocol": "SCTP"}]
    stale, _ = stale_after([ep_obj("10.244.1.2")], [], ports=sctp)
    assert stale == ["prod/web:sig/10.244.1.2:3868"]


def test_udp_port_number_change_makes_old_endpoints_stale() -> None:
    t = EndpointsChangeTracker(V4, NODE)
    t.update(eslice(ports=UDP))
    t.checkout()
    t.update(eslice(ports=[{"name": "dns", "port": 5353, "protocol": "UDP"}]))
    changes = t.checkout()
    assert [str(s.endpoint) for s in changes.stale_endpoints] == ["10.244.1.2:53"]
    assert changes.newly_active == frozenset()


def test_newly_active_udp_service() -> None:
    _, active = stale_after([], [ep_obj("10.244.1.2")])
    assert active == {UDP_SPN}


def test_newly_active_from_not_serving() -> None:
    _, active = stale_after([not_serving("10.244.1.2")], [ep_obj("10.244.1.2")])
    assert active == {UDP_SPN}


def test_newly_active_with_only_a_serving_terminating_endpoint() -> None:
    # Upstream counts serving endpoints: the terminating fallback gets traffic, so the
    # black-hole conntrack entries must go.
    _, active = stale_after([], [terminating("10.244.1.2")])
    assert active == {UDP_SPN}


def test_more_endpoints_is_not_newly_active() -> None:
    _, active = stale_after([ep_obj("10.244.1.2")], [ep_obj("10.244.1.2"), ep_obj("10.244.1.3")])
    assert active == set()


def test_still_no_serving_endpoint_is_not_newly_active() -> None:
    _, active = stale_after([], [not_serving("10.244.1.2")])
    assert active == set()


# --- ClusterState end to end --------------------------------------------------------------------


class Sink:
    def __init__(self) -> None:
        self.errors: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, err: InvalidObject, obj: Any) -> None:
        self.errors.append((str(err), obj))


def test_cluster_state_first_checkout() -> None:
    cluster = ClusterState(NODE, families=(V4,))
    cluster.set_service(service_obj())
    cluster.set_service(service_obj("db", clusterIP="10.96.0.20"))
    cluster.set_endpoint_slice(slice_obj())
    # Not served: an IPv6 slice on an IPv4-only node.
    cluster.set_endpoint_slice(
        slice_obj("web-v6", address_type="IPv6", endpoints=[ep_obj("fd00::2")])
    )
    assert cluster.changed.is_set()
    assert cluster.pending() == (2, 1)
    state = cluster.checkout(full=True)
    assert not cluster.changed.is_set()
    assert cluster.pending() == (0, 0)
    assert state.is_full()
    assert set(state.graphs) == {V4}
    assert state.graphs[V4].services[spn()].cluster_ip == "10.96.0.10"
    assert addresses(state.graphs[V4].endpoints_of(spn())) == ["10.244.1.2:8080"]
    assert state.changes[V4].services == {spn(), spn(name="db")}
    assert cluster.service_keys() == {"prod/web", "prod/db"}
    assert cluster.slice_keys() == {"prod/web-1", "prod/web-v6"}
    # Nothing new: the next checkout is empty, and the graph is still all there.
    again = cluster.checkout()
    assert again.empty
    assert not again.is_full()
    assert addresses(again.graphs[V4].endpoints_of(spn())) == ["10.244.1.2:8080"]


def test_cluster_state_dual_stack_service_reaches_both_families() -> None:
    cluster = ClusterState(NODE)
    cluster.set_service(service_obj(clusterIPs=["10.96.0.10", "fd00::10"]))
    state = cluster.checkout()
    assert state.graphs[V4].services[spn()].cluster_ip == "10.96.0.10"
    assert state.graphs[V6].services[spn()].cluster_ip == "fd00::10"
    assert state.changes[V4].services == state.changes[V6].services == {spn()}


def test_cluster_state_dual_stack_slices_reach_their_family() -> None:
    cluster = ClusterState(NODE)
    cluster.set_endpoint_slice(slice_obj())
    cluster.set_endpoint_slice(
        slice_obj("web-v6", address_type="IPv6", endpoints=[ep_obj("fd00::2")])
    )
    assert cluster.pending() == (0, 2)
    state = cluster.checkout()
    assert addresses(state.graphs[V4].endpoints_of(spn())) == ["10.244.1.2:8080"]
    assert addresses(state.graphs[V6].endpoints_of(spn())) == ["[fd00::2]:8080"]


def test_cluster_state_dual_stack_service_deleted_from_both_families() -> None:
    cluster = ClusterState(NODE)
    cluster.set_service(service_obj(clusterIPs=["10.96.0.10", "fd00::10"]))
    cluster.checkout()
    cluster.delete_service("prod", "web")
    state = cluster.checkout()
    assert state.graphs[V6].services == {}
    assert state.changes[V6].services == {spn()}


def test_invalid_object_reported_and_skipped_while_others_sync() -> None:
    sink = Sink()
    cluster = ClusterState(NODE, families=(V4,), on_invalid=sink)
    bad = service_obj("evil", clusterIP="10.0.0.1 -j ACCEPT")
    cluster.set_service(bad, origin="manifests/evil.yaml")
    cluster.set_service(service_obj())
    cluster.set_endpoint_slice(slice_obj(endpoints=[ep_obj("10.244.1.2\n-A X")]))
    cluster.set_endpoint_slice(slice_obj("db-1", "db"))
    assert sink.errors == [
        (
            "manifests/evil.yaml: Service prod/evil: spec.clusterIP: must be a valid IP address, "
            'got "10.0.0.1 -j ACCEPT"',
            bad,
        ),
        (
            "EndpointSlice prod/web-1: endpoints[0].addresses[0]: must be a valid IP address, "
            'got "10.244.1.2\\n-A X"',
            sink.errors[1][1],
        ),
    ]
    assert set(cluster.invalid) == {"Service prod/evil", "EndpointSlice prod/web-1"}
    state = cluster.checkout()
    assert set(state.graphs[V4].services) == {spn()}
    assert set(state.graphs[V4].endpoints) == {spn(name="db")}
    assert state.changes[V4].services == {spn(), spn(name="db")}
    # The same error again is not reported twice; fixing the object clears it.
    cluster.set_service(bad, origin="manifests/evil.yaml")
    assert len(sink.errors) == 2
    cluster.set_service(service_obj("evil", clusterIP="10.96.0.99"))
    assert set(cluster.invalid) == {"EndpointSlice prod/web-1"}
    assert cluster.checkout().changes[V4].services == {spn(name="evil")}


def test_invalid_update_keeps_the_last_valid_version() -> None:
    sink = Sink()
    cluster = ClusterState(NODE, families=(V4,), on_invalid=sink)
    cluster.set_service(service_obj())
    cluster.set_endpoint_slice(slice_obj())
    cluster.checkout()
    cluster.set_service(service_obj(ports=[{"name": "http", "port": 99999}]))
    cluster.set_endpoint_slice(slice_obj(endpoints=[ep_obj("not-an-ip")]))
    assert len(sink.errors) == 2
    assert not cluster.changed.is_set()
    assert cluster.pending() == (0, 0)
    state = cluster.checkout()
    assert state.empty
    assert state.graphs[V4].services[spn()].port == 80
    assert addresses(state.graphs[V4].endpoints_of(spn())) == ["10.244.1.2:8080"]


def test_relabelled_slice_moves_to_the_other_service() -> None:
    cluster = ClusterState(NODE, families=(V4,))
    cluster.set_service(service_obj())
    cluster.set_service(service_obj("api", clusterIP="10.96.0.20"))
    cluster.set_endpoint_slice(slice_obj("shared", "web"))
    cluster.checkout()
    cluster.set_endpoint_slice(slice_obj("shared", "api"))
    state = cluster.checkout()
    graph = state.graphs[V4]
    assert graph.endpoints_of(spn()) == ()
    assert addresses(graph.endpoints_of(spn(name="api"))) == ["10.244.1.2:8080"]
    assert state.changes[V4].services == {spn(), spn(name="api")}
    # Deleting it now removes it from the new Service only.
    cluster.delete_endpoint_slice("prod", "shared")
    state = cluster.checkout()
    assert state.changes[V4].services == {spn(name="api")}
    assert state.graphs[V4].endpoints == {}


def test_deleted_udp_service_in_change_set() -> None:
    cluster = ClusterState(NODE, families=(V4,))
    cluster.set_service(service_obj(ports=UDP))
    cluster.set_endpoint_slice(slice_obj(ports=UDP))
    first = cluster.checkout().changes[V4]
    assert first.newly_active_services == {UDP_SPN}
    cluster.delete_service("prod", "web")
    cluster.delete_endpoint_slice("prod", "web-1")
    changes = cluster.checkout().changes[V4]
    assert changes.services == {UDP_SPN}
    assert changes.stale_service_ips == {"10.96.0.10"}
    assert [str(s.endpoint) for s in changes.stale_endpoints] == ["10.244.1.2:53"]
    assert cluster.service_keys() == set()


def test_node_label_change_makes_the_next_checkout_full() -> None:
    cluster = ClusterState(NODE, families=(V4,))
    node: dict[str, Any] = {
        "kind": "Node",
        "metadata": {"name": NODE, "labels": {"topology.kubernetes.io/zone": "zone-a"}},
    }
    cluster.set_node(node)
    assert cluster.node.zone == "zone-a"
    assert cluster.changed.is_set()
    assert cluster.checkout().is_full()
    assert not cluster.checkout().is_full()
    # Another node's change is ignored.
    cluster.set_node({"kind": "Node", "metadata": {"name": "node-b", "labels": {"x": "y"}}})
    assert not cluster.changed.is_set()
    assert cluster.node.zone == "zone-a"
    # Only the deletion mark changes: no full resync needed.
    cluster.set_node({**node, "metadata": {**node["metadata"], "deletionTimestamp": "now"}})
    assert cluster.node.deleting
    assert not cluster.changed.is_set()
    assert not cluster.checkout().is_full()
    # A zone change is.
    node["metadata"]["labels"] = {"topology.kubernetes.io/zone": "zone-b"}
    cluster.set_node(node)
    state = cluster.checkout()
    assert state.is_full()
    assert state.graphs[V4].node.zone == "zone-b"
    assert not cluster.checkout().is_full()


def test_node_zone_drives_topology_in_the_graph() -> None:
    cluster = ClusterState(NODE, families=(V4,))
    cluster.set_node(
        {
            "kind": "Node",
            "metadata": {"name": NODE, "labels": {"topology.kubernetes.io/zone": "zone-a"}},
        }
    )
    cluster.set_service(service_obj())
    cluster.set_endpoint_slice(
        slice_obj(
            endpoints=[
                ep_obj("10.244.1.2", hints={"forZones": [{"name": "zone-a"}]}),
                ep_obj("10.244.2.2", hints={"forZones": [{"name": "zone-b"}]}),
            ]
        )
    )
    graph = cluster.checkout().graphs[V4]
    assert addresses(graph.categorized(spn()).cluster) == ["10.244.1.2:8080"]


def test_cluster_state_counts_every_event_like_upstream() -> None:
    """*_changes_total count events, also those that change nothing (as upstream's trackers)."""
    cluster = ClusterState(NODE)
    cluster.set_service(service_obj())
    cluster.set_service(service_obj())  # the same again: an event all the same
    cluster.set_endpoint_slice(slice_obj())
    cluster.delete_endpoint_slice("ns", "unknown")  # never seen: not an event of a slice
    cluster.delete_service("ns", "svc")
    assert (cluster.service_events, cluster.endpoint_events) == (3, 1)
