"""Parsing and validation of Service, EndpointSlice and Node objects (pure, no root)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kubeplex.core.model.errors import InvalidObject
from kubeplex.core.model.objects import (
    parse_endpoint_slice,
    parse_node,
    parse_service,
    parse_service_cidr,
)
from kubeplex.core.model.types import IPFamily, Protocol
from kubeplex.core.model.validated_objects import (
    DEFAULT_AFFINITY_TIMEOUT,
    PortSpec,
    SliceEndpoint,
    SlicePort,
)

SERVICE_NAME = "kubernetes.io/service-name"


def service(spec: dict[str, Any] | None = None, **top: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web", "namespace": "prod"},
        "spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 80}]},
    }
    obj["spec"].update(spec or {})
    obj.update(top)
    return obj


def endpoint(**fields: Any) -> dict[str, Any]:
    ep: dict[str, Any] = {"addresses": ["10.244.1.2"]}
    ep.update(fields)
    return ep


def endpoint_slice(**fields: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": "web-abc", "namespace": "prod", "labels": {SERVICE_NAME: "web"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [endpoint(nodeName="node-a")],
    }
    obj.update(fields)
    return obj


def node(**fields: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "node-a", "labels": {"topology.kubernetes.io/zone": "zone-a"}},
        "spec": {"podCIDRs": ["10.244.1.0/24", "fd00:10:244:1::/64"]},
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": "192.168.1.10"},
                {"type": "Hostname", "address": "node-a"},
                {"type": "InternalIP", "address": "fd00::10"},
                {"type": "ExternalIP", "address": "203.0.113.7"},
                {"type": "InternalIP", "address": "192.168.1.10"},
            ]
        },
    }
    obj.update(fields)
    return obj


# --- valid Services -----------------------------------------------------------------------------


def test_cluster_ip_service_defaults() -> None:
    svc = parse_service(service())
    assert svc.key == "prod/web"
    assert svc.type == "ClusterIP"
    assert svc.cluster_ips == ("10.96.0.10",)
    assert not svc.headless
    assert svc.ports == (PortSpec("", Protocol.TCP, 80, 0),)
    assert svc.external_ips == ()
    assert svc.load_balancer_ingress_ips == ()
    assert not svc.session_affinity_client_ip
    assert svc.affinity_timeout == DEFAULT_AFFINITY_TIMEOUT
    assert svc.external_traffic_policy == "Cluster"
    assert svc.internal_traffic_policy == "Cluster"
    assert svc.cluster_ip_of(IPFamily.IPv4) == "10.96.0.10"
    assert svc.cluster_ip_of(IPFamily.IPv6) == ""


def test_missing_namespace_is_default() -> None:
    obj = service()
    del obj["metadata"]["namespace"]
    assert parse_service(obj).key == "default/web"


def test_node_port_service() -> None:
    svc = parse_service(
        service(
            {
                "type": "NodePort",
                "ports": [
                    {"name": "http", "port": 80, "nodePort": 30080},
                    {"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30053},
                ],
            }
        )
    )
    assert svc.type == "NodePort"
    assert svc.ports == (
        PortSpec("http", Protocol.TCP, 80, 30080),
        PortSpec("dns", Protocol.UDP, 53, 30053),
    )


def test_load_balancer_ingress_ip_mode_proxy_is_ignored() -> None:
    obj = service(
        {
            "type": "LoadBalancer",
            "ports": [{"port": 443, "nodePort": 31443}],
            "loadBalancerSourceRanges": ["203.0.113.0/24", "2001:db8::/32", " 10.1.2.3/8 "],
            "externalTrafficPolicy": "Local",
            "healthCheckNodePort": 32000,
        },
        status={
            "loadBalancer": {
                "ingress": [
                    {"ip": "198.51.100.1"},
                    {"ip": "198.51.100.2", "ipMode": "VIP"},
                    {"ip": "198.51.100.3", "ipMode": "Proxy"},
                    {"hostname": "lb.example.com"},
                    {"ip": "2001:db8::0:1"},
                ]
            }
        },
    )
    svc = parse_service(obj)
    assert svc.load_balancer_ingress_ips == ("198.51.100.1", "198.51.100.2", "2001:db8::1")
    # Normalized: host bits dropped, whitespace stripped, IPv6 compressed.
    assert svc.load_balancer_source_ranges == ("203.0.113.0/24", "2001:db8::/32", "10.0.0.0/8")
    assert svc.external_traffic_policy == "Local"
    assert svc.health_check_node_port == 32000


def test_ingress_ips_of_a_non_load_balancer_service_are_ignored() -> None:
    obj = service(status={"loadBalancer": {"ingress": [{"ip": "198.51.100.1"}]}})
    assert parse_service(obj).load_balancer_ingress_ips == ()


def test_external_ips_normalized() -> None:
    svc = parse_service(service({"externalIPs": ["192.0.2.5", "2001:DB8:0::5"]}))
    assert svc.external_ips == ("192.0.2.5", "2001:db8::5")


def test_session_affinity_with_timeout() -> None:
    svc = parse_service(
        service(
            {
                "sessionAffinity": "ClientIP",
                "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}},
            }
        )
    )
    assert svc.session_affinity_client_ip
    assert svc.affinity_timeout == 60


def test_session_affinity_without_config_uses_default_timeout() -> None:
    svc = parse_service(service({"sessionAffinity": "ClientIP"}))
    assert svc.session_affinity_client_ip
    assert svc.affinity_timeout == 10800


def test_dual_stack_cluster_ips() -> None:
    svc = parse_service(
        service({"clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10", "FD00:0::10"]})
    )
    assert svc.cluster_ips == ("10.96.0.10", "fd00::10")
    assert svc.cluster_ip_of(IPFamily.IPv4) == "10.96.0.10"
    assert svc.cluster_ip_of(IPFamily.IPv6) == "fd00::10"


def test_ipv6_primary_single_stack() -> None:
    svc = parse_service(service({"clusterIP": "fd00::10"}))
    assert svc.cluster_ip_of(IPFamily.IPv4) == ""
    assert svc.cluster_ip_of(IPFamily.IPv6) == "fd00::10"


@pytest.mark.parametrize(
    "spec",
    [
        {"clusterIP": "None"},
        {"clusterIP": "None", "clusterIPs": ["None"]},
        {"clusterIP": ""},
        {"type": "ExternalName", "externalName": "db.example.com", "clusterIP": None},
    ],
    ids=["None", "clusterIPs-None", "empty", "ExternalName"],
)
def test_headless_and_external_name(spec: dict[str, Any]) -> None:
    svc = parse_service(service(spec))
    assert svc.headless
    assert svc.cluster_ips == ()


def test_parse_does_not_mutate_input() -> None:
    obj = service({"clusterIPs": ["10.96.0.10"], "externalIPs": [" 192.0.2.5 "]})
    before = copy.deepcopy(obj)
    parse_service(obj)
    assert obj == before


# --- malformed and hostile Services ---------------------------------------------------------------

DNS_LABEL = "must be a DNS label (lower-case letters, digits, '-')"

BAD_SERVICES: list[tuple[str, dict[str, Any], str]] = [
    (
        "name-with-quote",
        service(metadata={"name": 'we"b', "namespace": "prod"}),
        f'Service prod/we"b: metadata.name: {DNS_LABEL}, got "we"b"',
    ),
    (
        "name-with-newline",
        service(metadata={"name": "web\n-A", "namespace": "prod"}),
        f'Service prod/web\\n-A: metadata.name: {DNS_LABEL}, got "web\\n-A"',
    ),
    (
        "name-with-trailing-newline",
        service(metadata={"name": "web\n", "namespace": "prod"}),
        f'Service prod/web\\n: metadata.name: {DNS_LABEL}, got "web\\n"',
    ),
    (
        "name-with-space",
        service(metadata={"name": "web x", "namespace": "prod"}),
        f'Service prod/web x: metadata.name: {DNS_LABEL}, got "web x"',
    ),
    (
        "name-too-long",
        service(metadata={"name": "a" * 64, "namespace": "prod"}),
        f'Service prod/{"a" * 64}: metadata.name: {DNS_LABEL}, got "{"a" * 64}"',
    ),
    (
        "namespace-upper-case",
        service(metadata={"name": "web", "namespace": "Prod"}),
        f'Service Prod/web: metadata.namespace: {DNS_LABEL}, got "Prod"',
    ),
    (
        "no-metadata",
        {"spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 80}]}},
        "Service <no metadata>: metadata.name: required",
    ),
    (
        "metadata-not-a-mapping",
        service(metadata=["web"]),
        "Service <no metadata>: metadata: must be a mapping, got ['web']; metadata.name: required",
    ),
    (
        "port-name-with-quote",
        service({"ports": [{"name": 'h"p', "port": 80}]}),
        'Service prod/web: spec.ports[0].name: must be an IANA service name, got "h"p"',
    ),
    (
        "port-name-with-trailing-newline",
        service({"ports": [{"name": "http\n", "port": 80}]}),
        'Service prod/web: spec.ports[0].name: must be an IANA service name, got "http\\n"',
    ),
    (
        "port-name-too-long",
        service({"ports": [{"name": "a" * 16, "port": 80}]}),
        'Service prod/web: spec.ports[0].name: must be an IANA service name, got "'
        + "a" * 16
        + '"',
    ),
    (
        "cluster-ip-with-iptables-args",
        service({"clusterIP": "10.0.0.1 -j ACCEPT"}),
        'Service prod/web: spec.clusterIP: must be a valid IP address, got "10.0.0.1 -j ACCEPT"',
    ),
    (
        "cluster-ip-with-newline",
        service({"clusterIP": "10.0.0.1\n-A"}),
        'Service prod/web: spec.clusterIP: must be a valid IP address, got "10.0.0.1\\n-A"',
    ),
    (
        "cluster-ip-ipv6-scope",
        service({"clusterIP": "fe80::1%eth0 -j ACCEPT"}),
        "Service prod/web: spec.clusterIP: must be a valid IP address, "
        'got "fe80::1%eth0 -j ACCEPT"',
    ),
    (
        "cluster-ip-ipv6-plain-scope",
        service({"clusterIP": "fe80::1%eth0"}),
        'Service prod/web: spec.clusterIP: must be a valid IP address, got "fe80::1%eth0"',
    ),
    (
        "cluster-ips-second-bad",
        service({"clusterIPs": ["10.96.0.10", "fd00::1 -j DROP"]}),
        'Service prod/web: spec.clusterIPs[1]: must be a valid IP address, got "fd00::1 -j DROP"',
    ),
    (
        "cluster-ips-same-family",
        service({"clusterIPs": ["10.96.0.10", "10.96.0.11"]}),
        "Service prod/web: spec.clusterIPs: must hold at most one address per IP family",
    ),
    (
        "cluster-ip-missing",
        service({"clusterIP": None}),
        "Service prod/web: spec.clusterIP: required "
        "(set it, or clusterIP: None for a headless Service)",
    ),
    (
        "cluster-ip-not-a-string",
        service({"clusterIP": 167772161}),
        "Service prod/web: spec.clusterIP: must be a string, got 167772161; "
        "spec.clusterIP: must be a valid IP address, got 167772161",
    ),
    (
        "source-range-garbage",
        service({"type": "LoadBalancer", "loadBalancerSourceRanges": ["10.0.0.0/8 -j ACCEPT"]}),
        "Service prod/web: spec.loadBalancerSourceRanges[0]: must be a valid CIDR, "
        'got "10.0.0.0/8 -j ACCEPT"',
    ),
    (
        "source-range-prefix-too-long",
        service({"type": "LoadBalancer", "loadBalancerSourceRanges": ["10.0.0.0/33"]}),
        "Service prod/web: spec.loadBalancerSourceRanges[0]: must be a valid CIDR, "
        'got "10.0.0.0/33"',
    ),
    (
        "source-range-scope",
        service({"type": "LoadBalancer", "loadBalancerSourceRanges": ["fe80::%a b/64"]}),
        "Service prod/web: spec.loadBalancerSourceRanges[0]: must be a valid CIDR, "
        'got "fe80::%a b/64"',
    ),
    (
        "external-ip-shell",
        service({"externalIPs": ["1.2.3.4; rm -rf /"]}),
        "Service prod/web: spec.externalIPs[0]: must be a valid IP address, "
        'got "1.2.3.4; rm -rf /"',
    ),
    (
        "external-ips-not-a-list",
        service({"externalIPs": "1.2.3.4"}),
        'Service prod/web: spec.externalIPs: must be a list, got "1.2.3.4"',
    ),
    (
        "ingress-ip-garbage",
        service(
            {"type": "LoadBalancer"},
            status={"loadBalancer": {"ingress": [{"ip": "1.2.3.4 -j"}]}},
        ),
        "Service prod/web: status.loadBalancer.ingress[0].ip: must be a valid IP address, "
        'got "1.2.3.4 -j"',
    ),
    (
        "ingress-ip-mode-unknown",
        service(
            {"type": "LoadBalancer"},
            status={"loadBalancer": {"ingress": [{"ip": "1.2.3.4", "ipMode": "Tunnel"}]}},
        ),
        "Service prod/web: status.loadBalancer.ingress[0].ipMode: must be one of VIP, Proxy, "
        'got "Tunnel"',
    ),
    (
        "port-negative",
        service({"ports": [{"port": -1}]}),
        "Service prod/web: spec.ports[0].port: must be between 1 and 65535, got -1",
    ),
    (
        "port-zero",
        service({"ports": [{"port": 0}]}),
        "Service prod/web: spec.ports[0].port: must be between 1 and 65535, got 0",
    ),
    (
        "port-too-large",
        service({"ports": [{"port": 65536}]}),
        "Service prod/web: spec.ports[0].port: must be between 1 and 65535, got 65536",
    ),
    (
        "port-string",
        service({"ports": [{"port": "80"}]}),
        'Service prod/web: spec.ports[0].port: must be an integer, got "80"',
    ),
    (
        "port-bool",
        service({"ports": [{"port": True}]}),
        "Service prod/web: spec.ports[0].port: must be an integer, got True",
    ),
    (
        "port-float",
        service({"ports": [{"port": 80.0}]}),
        "Service prod/web: spec.ports[0].port: must be an integer, got 80.0",
    ),
    (
        "port-missing",
        service({"ports": [{"name": "http"}]}),
        "Service prod/web: spec.ports[0].port: required",
    ),
    (
        "node-port-too-large",
        service({"type": "NodePort", "ports": [{"port": 80, "nodePort": 70000}]}),
        "Service prod/web: spec.ports[0].nodePort: must be between 0 and 65535, got 70000",
    ),
    (
        "node-port-on-cluster-ip",
        service({"ports": [{"port": 80, "nodePort": 30080}]}),
        "Service prod/web: spec.ports[0].nodePort: may not be set when type is ClusterIP",
    ),
    (
        "protocol-unknown",
        service({"ports": [{"port": 80, "protocol": "ICMP"}]}),
        'Service prod/web: spec.ports[0].protocol: must be one of TCP, UDP, SCTP, got "ICMP"',
    ),
    (
        "protocol-lower-case",
        service({"ports": [{"port": 80, "protocol": "tcp"}]}),
        'Service prod/web: spec.ports[0].protocol: must be one of TCP, UDP, SCTP, got "tcp"',
    ),
    (
        "protocol-not-a-string",
        service({"ports": [{"port": 80, "protocol": 6}]}),
        "Service prod/web: spec.ports[0].protocol: must be a string, got 6",
    ),
    (
        "type-unknown",
        service({"type": "Magic"}),
        "Service prod/web: spec.type: must be one of ClusterIP, NodePort, LoadBalancer, "
        'ExternalName, got "Magic"',
    ),
    (
        "spec-not-a-mapping",
        service(spec=None) | {"spec": "x"},
        'Service prod/web: spec: must be a mapping, got "x"; '
        "spec.clusterIP: required (set it, or clusterIP: None for a headless Service)",
    ),
    (
        "ports-not-a-list",
        service({"ports": {"port": 80}}),
        "Service prod/web: spec.ports: must be a list, got {'port': 80}",
    ),
    (
        "port-not-a-mapping",
        service({"ports": ["80"]}),
        'Service prod/web: spec.ports[0]: must be a mapping, got "80"; '
        "spec.ports[0].port: required",
    ),
    (
        "two-unnamed-ports",
        service({"ports": [{"port": 80}, {"port": 81}]}),
        "Service prod/web: "
        "spec.ports[0].name: required when a Service has more than one port; "
        "spec.ports[1].name: required when a Service has more than one port",
    ),
    (
        "duplicate-port-name",
        service({"ports": [{"name": "a", "port": 80}, {"name": "a", "port": 81}]}),
        'Service prod/web: spec.ports[1].name: duplicate name "a"',
    ),
    (
        "duplicate-port-number",
        service({"ports": [{"name": "a", "port": 80}, {"name": "b", "port": 80}]}),
        "Service prod/web: spec.ports[1]: duplicate port 80/TCP",
    ),
    (
        "affinity-unknown",
        service({"sessionAffinity": "Sticky"}),
        'Service prod/web: spec.sessionAffinity: must be one of None, ClientIP, got "Sticky"',
    ),
    (
        "affinity-timeout-zero",
        service(
            {
                "sessionAffinity": "ClientIP",
                "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 0}},
            }
        ),
        "Service prod/web: spec.sessionAffinityConfig.clientIP.timeoutSeconds: "
        "must be between 1 and 86400, got 0",
    ),
    (
        "affinity-timeout-too-large",
        service(
            {
                "sessionAffinity": "ClientIP",
                "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 86401}},
            }
        ),
        "Service prod/web: spec.sessionAffinityConfig.clientIP.timeoutSeconds: "
        "must be between 1 and 86400, got 86401",
    ),
    (
        "traffic-policy-lower-case",
        service({"externalTrafficPolicy": "local"}),
        'Service prod/web: spec.externalTrafficPolicy: must be one of Cluster, Local, got "local"',
    ),
    (
        "internal-traffic-policy-unknown",
        service({"internalTrafficPolicy": "Node"}),
        'Service prod/web: spec.internalTrafficPolicy: must be one of Cluster, Local, got "Node"',
    ),
    (
        "health-check-node-port-negative",
        service({"healthCheckNodePort": -5}),
        "Service prod/web: spec.healthCheckNodePort: must be between 0 and 65535, got -5",
    ),
    (
        "several-errors-all-reported",
        service({"clusterIP": "x", "ports": [{"port": 0, "protocol": "ICMP"}]}),
        'Service prod/web: spec.clusterIP: must be a valid IP address, got "x"; '
        'spec.ports[0].protocol: must be one of TCP, UDP, SCTP, got "ICMP"; '
        "spec.ports[0].port: must be between 1 and 65535, got 0",
    ),
]


@pytest.mark.parametrize(
    ("obj", "message"),
    [(obj, message) for _, obj, message in BAD_SERVICES],
    ids=[case for case, _, _ in BAD_SERVICES],
)
def test_bad_service(obj: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidObject) as info:
        parse_service(obj)
    assert str(info.value) == message


def test_invalid_object_carries_where_and_field_paths() -> None:
    obj = service({"clusterIP": "10.0.0.1 -j ACCEPT", "ports": [{"port": 99999}]})
    with pytest.raises(InvalidObject) as info:
        parse_service(obj)
    assert info.value.where == "Service prod/web"
    assert [e.path for e in info.value.errors] == ["spec.clusterIP", "spec.ports[0].port"]


def test_long_hostile_value_is_truncated_in_the_message() -> None:
    with pytest.raises(InvalidObject) as info:
        parse_service(service({"clusterIP": "1" * 500}))
    shown = str(info.value).split("got ", 1)[1]
    assert len(shown) == 80
    assert shown.endswith("...")


# --- EndpointSlices -------------------------------------------------------------------------------


def test_endpoint_slice_valid() -> None:
    es = parse_endpoint_slice(
        endpoint_slice(
            metadata={
                "name": "web-abc",
                "namespace": "prod",
                "labels": {SERVICE_NAME: "web"},
                "annotations": {
                    "endpoints.kubernetes.io/last-change-trigger-time": "2024-05-01T10:00:00Z"
                },
            },
            ports=[
                {"name": "http", "port": 8080},
                {"name": "dns", "port": 53, "protocol": "UDP"},
            ],
            endpoints=[
                endpoint(
                    addresses=["10.244.1.2", "10.244.1.99"],
                    conditions={"ready": True, "serving": True, "terminating": False},
                    nodeName="node-a",
                    zone="zone-a",
                    hints={"forZones": [{"name": "zone-a"}], "forNodes": [{"name": "node-a"}]},
                ),
            ],
        )
    )
    assert es.key == "prod/web-abc"
    assert es.service_key == "prod/web"
    assert es.address_type == "IPv4"
    assert es.trigger_time == "2024-05-01T10:00:00Z"
    assert es.ports == (SlicePort("http", Protocol.TCP, 8080), SlicePort("dns", Protocol.UDP, 53))
    # Only the first address counts, as upstream.
    assert es.endpoints == (
        SliceEndpoint(
            ip="10.244.1.2",
            ready=True,
            serving=True,
            terminating=False,
            node_name="node-a",
            zone="zone-a",
            zone_hints=frozenset({"zone-a"}),
            node_hints=frozenset({"node-a"}),
        ),
    )


@pytest.mark.parametrize(
    ("conditions", "expected"),
    [
        (None, (True, True, False)),
        ({}, (True, True, False)),
        ({"ready": False}, (False, True, False)),
        ({"ready": False, "terminating": True}, (False, True, True)),
        ({"ready": False, "serving": False, "terminating": True}, (False, False, True)),
        ({"ready": False, "serving": True, "terminating": True}, (False, True, True)),
    ],
)
def test_unset_conditions_follow_upstream(
    conditions: dict[str, bool] | None, expected: tuple[bool, bool, bool]
) -> None:
    """endpointslicecache.go: nil ready -> true, nil serving -> true, nil terminating -> false."""
    ep = endpoint() if conditions is None else endpoint(conditions=conditions)
    (parsed,) = parse_endpoint_slice(endpoint_slice(endpoints=[ep])).endpoints
    assert (parsed.ready, parsed.serving, parsed.terminating) == expected


def test_endpoint_slice_ipv6_normalized() -> None:
    es = parse_endpoint_slice(
        endpoint_slice(addressType="IPv6", endpoints=[endpoint(addresses=["FD00:0:0::2"])])
    )
    assert es.endpoints[0].ip == "fd00::2"


def test_endpoint_slice_name_may_be_a_dns_subdomain() -> None:
    es = parse_endpoint_slice(
        endpoint_slice(
            metadata={"name": "web.v1-x", "namespace": "prod", "labels": {SERVICE_NAME: "web"}}
        )
    )
    assert es.key == "prod/web.v1-x"


def test_fqdn_slice_parses_without_endpoints() -> None:
    es = parse_endpoint_slice(
        endpoint_slice(addressType="FQDN", endpoints=[endpoint(addresses=["db.example.com"])])
    )
    assert es.address_type == "FQDN"
    assert es.endpoints == ()


def test_endpoint_slice_without_ports_or_endpoints() -> None:
    es = parse_endpoint_slice(endpoint_slice(ports=None, endpoints=None))
    assert es.ports == ()
    assert es.endpoints == ()


BAD_SLICES: list[tuple[str, dict[str, Any], str]] = [
    (
        "no-service-name-label",
        endpoint_slice(metadata={"name": "web-abc", "namespace": "prod"}),
        "EndpointSlice prod/web-abc: metadata.labels[kubernetes.io/service-name]: required",
    ),
    (
        "service-name-label-with-space",
        endpoint_slice(
            metadata={"name": "web-abc", "namespace": "prod", "labels": {SERVICE_NAME: "web x"}}
        ),
        "EndpointSlice prod/web-abc: metadata.labels[kubernetes.io/service-name]: "
        f'{DNS_LABEL}, got "web x"',
    ),
    (
        "slice-name-with-underscore",
        endpoint_slice(
            metadata={"name": "web_abc", "namespace": "prod", "labels": {SERVICE_NAME: "web"}}
        ),
        "EndpointSlice prod/web_abc: metadata.name: must be a DNS subdomain "
        "(lower-case letters, digits, '-', '.'), got \"web_abc\"",
    ),
    (
        "address-type-missing",
        {k: v for k, v in endpoint_slice().items() if k != "addressType"},
        "EndpointSlice prod/web-abc: addressType: required",
    ),
    (
        "address-type-unknown",
        endpoint_slice(addressType="IPX"),
        'EndpointSlice prod/web-abc: addressType: must be one of IPv4, IPv6, FQDN, got "IPX"',
    ),
    (
        "address-of-other-family",
        endpoint_slice(addressType="IPv6"),
        "EndpointSlice prod/web-abc: endpoints[0].addresses[0]: must be an IPv6 address, "
        'got "10.244.1.2"',
    ),
    (
        "address-with-iptables-args",
        endpoint_slice(endpoints=[endpoint(addresses=["10.244.1.2 -j ACCEPT"])]),
        "EndpointSlice prod/web-abc: endpoints[0].addresses[0]: must be a valid IP address, "
        'got "10.244.1.2 -j ACCEPT"',
    ),
    (
        "address-with-newline",
        endpoint_slice(endpoints=[endpoint(addresses=["10.244.1.2\n-A KUBE-SERVICES"])]),
        "EndpointSlice prod/web-abc: endpoints[0].addresses[0]: must be a valid IP address, "
        'got "10.244.1.2\\n-A KUBE-SERVICES"',
    ),
    (
        "address-with-ipv6-scope",
        endpoint_slice(addressType="IPv6", endpoints=[endpoint(addresses=["fe80::2%x\n-A"])]),
        "EndpointSlice prod/web-abc: endpoints[0].addresses[0]: must be a valid IP address, "
        'got "fe80::2%x\\n-A"',
    ),
    (
        "no-addresses",
        endpoint_slice(endpoints=[endpoint(addresses=[])]),
        "EndpointSlice prod/web-abc: endpoints[0].addresses: must hold at least one address",
    ),
    (
        "ready-not-a-boolean",
        endpoint_slice(endpoints=[endpoint(conditions={"ready": "true"})]),
        'EndpointSlice prod/web-abc: endpoints[0].conditions.ready: must be a boolean, got "true"',
    ),
    (
        "node-name-with-space",
        endpoint_slice(endpoints=[endpoint(nodeName="node a")]),
        'EndpointSlice prod/web-abc: endpoints[0].nodeName: must be a DNS subdomain, got "node a"',
    ),
    (
        "zone-hint-with-space",
        endpoint_slice(endpoints=[endpoint(hints={"forZones": [{"name": "zone a"}]})]),
        "EndpointSlice prod/web-abc: endpoints[0].hints.forZones[0].name: "
        'must be a valid name, got "zone a"',
    ),
    (
        "node-hint-with-trailing-newline",
        endpoint_slice(endpoints=[endpoint(hints={"forNodes": [{"name": "node-a\n"}]})]),
        "EndpointSlice prod/web-abc: endpoints[0].hints.forNodes[0].name: "
        'must be a valid name, got "node-a\\n"',
    ),
    (
        "port-name-with-quote",
        endpoint_slice(ports=[{"name": 'h"p', "port": 80}]),
        'EndpointSlice prod/web-abc: ports[0].name: must be an IANA service name, got "h"p"',
    ),
    (
        "port-zero",
        endpoint_slice(ports=[{"name": "http", "port": 0}]),
        "EndpointSlice prod/web-abc: ports[0].port: must be between 1 and 65535, got 0",
    ),
    (
        "port-too-large",
        endpoint_slice(ports=[{"name": "http", "port": 65536}]),
        "EndpointSlice prod/web-abc: ports[0].port: must be between 1 and 65535, got 65536",
    ),
    (
        "port-protocol-unknown",
        endpoint_slice(ports=[{"name": "http", "port": 80, "protocol": "HTTP"}]),
        'EndpointSlice prod/web-abc: ports[0].protocol: must be one of TCP, UDP, SCTP, got "HTTP"',
    ),
    (
        "endpoints-not-a-list",
        endpoint_slice(endpoints={"addresses": ["10.244.1.2"]}),
        "EndpointSlice prod/web-abc: endpoints: must be a list, got {'addresses': ['10.244.1.2']}",
    ),
]


@pytest.mark.parametrize(
    ("obj", "message"),
    [(obj, message) for _, obj, message in BAD_SLICES],
    ids=[case for case, _, _ in BAD_SLICES],
)
def test_bad_endpoint_slice(obj: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidObject) as info:
        parse_endpoint_slice(obj)
    assert str(info.value) == message


# --- Nodes ----------------------------------------------------------------------------------------


def test_node_valid() -> None:
    info = parse_node(node())
    assert info.name == "node-a"
    assert info.zone == "zone-a"
    assert info.pod_cidrs == ("10.244.1.0/24", "fd00:10:244:1::/64")
    # InternalIP and ExternalIP only, de-duplicated, in order; Hostname ignored.
    assert info.addresses == ("192.168.1.10", "fd00::10", "203.0.113.7")
    assert info.addresses_of(IPFamily.IPv6) == ("fd00::10",)
    assert info.pod_cidrs_of(IPFamily.IPv4) == ("10.244.1.0/24",)
    assert not info.deleting


def test_node_single_pod_cidr_and_deletion() -> None:
    info = parse_node(
        node(
            metadata={"name": "node-a", "deletionTimestamp": "2024-01-01T00:00:00Z"},
            spec={"podCIDR": "10.244.1.0/24"},
        )
    )
    assert info.pod_cidrs == ("10.244.1.0/24",)
    assert info.zone == ""
    assert info.deleting


def test_node_ip_of_a_family_is_its_first_internal_ip() -> None:
    """Upstream's GetNodeHostIPs: InternalIPs before ExternalIPs, whatever the listed order."""
    addresses = [
        {"type": "ExternalIP", "address": "203.0.113.7"},
        {"type": "ExternalIP", "address": "2001:db8::7"},
        {"type": "InternalIP", "address": "192.168.1.10"},
        {"type": "InternalIP", "address": "192.168.1.11"},
        {"type": "ExternalIP", "address": "192.168.1.10"},
    ]
    info = parse_node(node(status={"addresses": addresses}))
    assert info.addresses == ("192.168.1.10", "192.168.1.11", "203.0.113.7", "2001:db8::7")
    assert info.addresses_of(IPFamily.IPv4)[0] == "192.168.1.10"
    # No InternalIP of a family: its first ExternalIP.
    assert info.addresses_of(IPFamily.IPv6) == ("2001:db8::7",)


def test_node_hostname_address_is_not_validated_as_ip() -> None:
    info = parse_node(node(status={"addresses": [{"type": "Hostname", "address": "x y"}]}))
    assert info.addresses == ()


BAD_NODES: list[tuple[str, dict[str, Any], str]] = [
    (
        "name-with-space",
        node(metadata={"name": "Node A"}),
        'Node Node A: metadata.name: must be a DNS subdomain, got "Node A"',
    ),
    (
        "name-missing",
        node(metadata={}),
        'Node <no name>: metadata.name: must be a DNS subdomain, got ""',
    ),
    (
        "label-value-not-a-string",
        node(metadata={"name": "node-a", "labels": {"rack": 5}}),
        "Node node-a: metadata.labels[rack]: must be a string, got 5",
    ),
    (
        "pod-cidr-with-iptables-args",
        node(spec={"podCIDRs": ["10.244.1.0/24 -j ACCEPT"]}),
        'Node node-a: spec.podCIDRs[0]: must be a valid CIDR, got "10.244.1.0/24 -j ACCEPT"',
    ),
    (
        "address-with-newline",
        node(status={"addresses": [{"type": "InternalIP", "address": "1.2.3.4\n-A"}]}),
        'Node node-a: status.addresses[0].address: must be a valid IP address, got "1.2.3.4\\n-A"',
    ),
    (
        "addresses-not-a-list",
        node(status={"addresses": "1.2.3.4"}),
        'Node node-a: status.addresses: must be a list, got "1.2.3.4"',
    ),
]


@pytest.mark.parametrize(
    ("obj", "message"),
    [(obj, message) for _, obj, message in BAD_NODES],
    ids=[case for case, _, _ in BAD_NODES],
)
def test_bad_node(obj: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidObject) as info:
        parse_node(obj)
    assert str(info.value) == message


# --- ServiceCIDRs -------------------------------------------------------------------------------


def service_cidr(*cidrs: Any, name: Any = "kubernetes") -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "ServiceCIDR",
        "metadata": {"name": name},
        "spec": {"cidrs": list(cidrs)},
    }


def test_service_cidr_valid_dual_stack_normalized() -> None:
    obj = parse_service_cidr(service_cidr(" 10.96.0.0/16", "FD00:10:96:0::/112"))
    assert obj.name == "kubernetes"
    assert obj.cidrs == ("10.96.0.0/16", "fd00:10:96::/112")


def test_service_cidr_single_family_and_host_bits() -> None:
    # Host bits are cleared, as everywhere else a CIDR is read (normalize_cidr).
    obj = parse_service_cidr(service_cidr("172.30.1.7/16", name="extra.cidrs"))
    assert (obj.name, obj.cidrs) == ("extra.cidrs", ("172.30.0.0/16",))


BAD_SERVICE_CIDRS: list[tuple[str, dict[str, Any], str]] = [
    (
        "bad-cidr",
        service_cidr("10.96.0.0/16 } accept ; {"),
        "ServiceCIDR kubernetes: spec.cidrs[0]: must be a valid CIDR,"
        ' got "10.96.0.0/16 } accept ; {"',
    ),
    (
        "bad-second-cidr",
        service_cidr("10.96.0.0/16", "fd00::/129"),
        'ServiceCIDR kubernetes: spec.cidrs[1]: must be a valid CIDR, got "fd00::/129"',
    ),
    (
        "three-cidrs",
        service_cidr("10.96.0.0/16", "fd00::/112", "10.97.0.0/16"),
        "ServiceCIDR kubernetes: spec.cidrs: may hold at most 2 CIDRs (one per IP family), got 3",
    ),
    (
        "two-of-one-family",
        service_cidr("10.96.0.0/16", "10.97.0.0/16"),
        "ServiceCIDR kubernetes: spec.cidrs: may hold at most one CIDR per IP family,"
        " got two IPv4 CIDRs",
    ),
    (
        "two-ipv6",
        service_cidr("fd00:1::/112", "fd00:2::/112"),
        "ServiceCIDR kubernetes: spec.cidrs: may hold at most one CIDR per IP family,"
        " got two IPv6 CIDRs",
    ),
    (
        "no-cidrs",
        service_cidr(),
        "ServiceCIDR kubernetes: spec.cidrs: required: at least one CIDR",
    ),
    (
        "cidrs-not-a-list",
        {**service_cidr(), "spec": {"cidrs": "10.96.0.0/16"}},
        'ServiceCIDR kubernetes: spec.cidrs: must be a list, got "10.96.0.0/16"',
    ),
    (
        "name-not-a-subdomain",
        service_cidr("10.96.0.0/16", name="Service_CIDR"),
        "ServiceCIDR Service_CIDR: metadata.name: must be a DNS subdomain (lower-case letters,"
        " digits, '-', '.'), got \"Service_CIDR\"",
    ),
    (
        "name-missing",
        {**service_cidr("10.96.0.0/16"), "metadata": {}},
        "ServiceCIDR <no name>: metadata.name: required",
    ),
]


@pytest.mark.parametrize(
    ("obj", "message"),
    [(obj, message) for _, obj, message in BAD_SERVICE_CIDRS],
    ids=[case for case, _, _ in BAD_SERVICE_CIDRS],
)
def test_bad_service_cidr(obj: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidObject) as info:
        parse_service_cidr(obj)
    assert str(info.value) == message


def test_bad_service_cidr_names_the_exact_field() -> None:
    with pytest.raises(InvalidObject) as info:
        parse_service_cidr(service_cidr("10.96.0.0/16", "not-a-cidr", name="a b"))
    assert info.value.where == "ServiceCIDR a b"
    assert [e.path for e in info.value.errors] == ["metadata.name", "spec.cidrs[1]"]


# --- the endpoint fast path ------------------------------------------------------------------

_ENDPOINT_VARIANTS: list[Any] = [
    {"addresses": ["10.0.0.1"]},
    {"addresses": ["10.0.0.1", "10.0.0.2"], "conditions": {"ready": False}},
    {"addresses": ["10.0.0.1"], "conditions": {"ready": True, "serving": False}},
    {"addresses": ["10.0.0.1"], "conditions": {"terminating": True, "serving": True}},
    {"addresses": ["10.0.0.1"], "conditions": None, "nodeName": "node-1.example"},
    {"addresses": ["10.0.0.1"], "nodeName": "Node_1"},
    {"addresses": ["10.0.0.1"], "nodeName": ""},
    {"addresses": ["10.0.0.1"], "zone": "zone-a"},
    {"addresses": ["10.0.0.1"], "zone": 7},
    {"addresses": ["10.0.0.1"], "hints": {"forZones": [{"name": "zone-a"}, {"name": "zone-b"}]}},
    {"addresses": ["10.0.0.1"], "hints": {"forNodes": [{"name": "n1"}], "forZones": []}},
    {"addresses": ["10.0.0.1"], "hints": {"forZones": [{"name": ""}, {}]}},
    {"addresses": ["10.0.0.1"], "hints": {"forZones": [{"name": "bad zone"}]}},
    {"addresses": ["10.0.0.1"], "hints": {"forZones": "zone-a"}},
    {"addresses": ["10.0.0.1"], "hints": {"forZones": [None]}},
    {"addresses": ["10.0.0.1"], "hints": []},
    {"addresses": ["10.0.0.1"], "conditions": {"ready": "yes"}},
    {"addresses": ["10.0.0.1"], "conditions": []},
    {"addresses": ["010.0.0.1"]},
    {"addresses": ["10.0.0.1 "]},
    {"addresses": [" 10.0.0.1"]},
    {"addresses": ["10.0.0.1\n"]},
    {"addresses": ["fd00::1"]},
    {"addresses": ["fe80::1%eth0"]},
    {"addresses": [""]},
    {"addresses": [None]},
    {"addresses": []},
    {"addresses": "10.0.0.1"},
    {},
    None,
    "10.0.0.1",
]


def test_a_slice_port_without_a_number_is_ignored_not_the_slice() -> None:
    """The API allows a port without a number (meaning every port); upstream skips that port
    and serves the slice's other ports."""
    es = parse_endpoint_slice(
        endpoint_slice(ports=[{"name": "all", "protocol": "TCP"}, {"name": "web", "port": 81}])
    )
    assert [(p.name, p.port) for p in es.ports] == [("web", 81)]
    assert es.endpoints


@pytest.mark.parametrize("address_type", ["IPv4", "IPv6"])
@pytest.mark.parametrize("variant", range(len(_ENDPOINT_VARIANTS)))
def test_the_endpoint_fast_path_decides_as_the_general_one(
    variant: int, address_type: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever an endpoint holds, a slice parses to the same object (or the same errors)
    with the fast path as with the general, field-by-field path alone."""
    from kubeplex.core.model import objects, objects_fast_paths

    raw = copy.deepcopy(_ENDPOINT_VARIANTS[variant])
    addresses = raw.get("addresses") if isinstance(raw, dict) else None
    if address_type == "IPv6" and isinstance(addresses, list) and addresses[:1] == ["10.0.0.1"]:
        addresses[0] = "fd00:0::1"
    obj = {
        "metadata": {"name": "web-1", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": address_type,
        "ports": [{"port": 80}],
        "endpoints": [raw],
    }

    def parse() -> object:
        try:
            return parse_endpoint_slice(obj)
        except InvalidObject as err:
            return str(err)

    fast = parse()
    if variant < 5:  # valid endpoints of the common shape: the fast path takes them
        assert objects_fast_paths.endpoint_fast_path(raw, address_type) is not None
    monkeypatch.setattr(objects, "endpoint_fast_path", lambda raw, address_type: None)
    assert parse() == fast
