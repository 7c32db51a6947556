"""The plain-Service fast path of parse_service, and the inline API-shaped endpoint of the
plain-slice path, agree with the general, field-by-field path on every input: the same
object, or the same error."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kits.fast_paths_kit import WEIRD, general, outcome, put

from kubeplex.core.model import objects, objects_fast_paths
from kubeplex.core.model.errors import InvalidObject

SERVICE_WEIRD: list[Any] = [
    *WEIRD,
    "ClusterIP",
    "NodePort",
    "LoadBalancer",
    "ExternalName",
    "None",
    "ClientIP",
    "Cluster",
    "Local",
    "PreferClose",
    "10.96.0.10",
    "fd00::10",
    "10.96.0.0/12",
    ["10.96.0.10"],
    ["fd00::10"],
    ["10.96.0.10", "fd00::10"],
    ["10.96.0.10", "10.96.0.11"],
    ["None"],
    [""],
    30080,
    {"ingress": []},
    {"ingress": [{"ip": "1.2.3.4"}]},
    {"loadBalancer": {}},
]

SERVICE_PATHS: list[tuple[Any, ...]] = [
    ("metadata",),
    ("metadata", "name"),
    ("metadata", "namespace"),
    ("spec",),
    ("spec", "type"),
    ("spec", "clusterIP"),
    ("spec", "clusterIPs"),
    ("spec", "clusterIPs", 0),
    ("spec", "clusterIPs", 1),
    ("spec", "ports"),
    ("spec", "ports", 0),
    ("spec", "ports", 0, "name"),
    ("spec", "ports", 0, "port"),
    ("spec", "ports", 0, "protocol"),
    ("spec", "ports", 0, "nodePort"),
    ("spec", "ports", 1, "name"),
    ("spec", "ports", 1, "port"),
    ("spec", "ports", 1, "protocol"),
    ("spec", "ports", 1, "nodePort"),
    ("spec", "externalIPs"),
    ("spec", "loadBalancerSourceRanges"),
    ("spec", "sessionAffinity"),
    ("spec", "sessionAffinityConfig"),
    ("spec", "externalTrafficPolicy"),
    ("spec", "internalTrafficPolicy"),
    ("spec", "healthCheckNodePort"),
    ("spec", "trafficDistribution"),
    ("status",),
    ("status", "loadBalancer"),
    ("status", "loadBalancer", "ingress"),
]


def plain_service() -> dict[str, Any]:
    """A Service as an API server serves it (after kubeplex drops managedFields)."""
    return {
        "metadata": {
            "name": "web",
            "namespace": "default",
            "labels": {"app": "web"},
            "uid": "77df246b-c22b-455d-ab71-1068ab9897f0",
            "creationTimestamp": "2025-06-01T12:00:00Z",
            "resourceVersion": "207",
        },
        "spec": {
            "clusterIP": "10.96.0.10",
            "clusterIPs": ["10.96.0.10"],
            "ports": [
                {"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080},
                {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
            ],
            "selector": {"app": "web"},
            "ipFamilies": ["IPv4"],
            "ipFamilyPolicy": "SingleStack",
            "internalTrafficPolicy": "Cluster",
            "sessionAffinity": "None",
            "type": "ClusterIP",
        },
        "status": {"loadBalancer": {}},
    }


def node_port_service() -> dict[str, Any]:
    """Dual-stack, node ports, a health check node port, every optional field set."""
    obj = plain_service()
    spec = obj["spec"]
    spec.update(
        type="LoadBalancer",
        clusterIPs=["10.96.0.10", "fd00::10"],
        externalTrafficPolicy="Local",
        healthCheckNodePort=30999,
        trafficDistribution="PreferClose",
    )
    spec["ports"][0]["nodePort"] = 30080
    spec["ports"][1]["nodePort"] = 30053
    return obj


def general_service(obj: Any) -> Any:
    """parse_service with its fast path off: every field checked by name."""
    saved = objects.service_fast_path
    objects.service_fast_path = lambda _obj: None  # type: ignore[assignment]
    try:
        return objects.parse_service(obj)
    finally:
        objects.service_fast_path = saved


@pytest.mark.parametrize("make", [plain_service, node_port_service])
def test_the_plain_service_takes_the_fast_path(make: Any) -> None:
    fast = objects_fast_paths.service_fast_path(make())
    assert fast is not None
    assert fast == general_service(make())


@pytest.mark.parametrize("make", [plain_service, node_port_service])
def test_service_paths_agree_on_each_change(make: Any) -> None:
    for path in SERVICE_PATHS:
        for value in SERVICE_WEIRD:
            obj = put(make(), path, value)
            assert outcome(objects.parse_service, obj) == outcome(general_service, obj), (
                path,
                value,
            )


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from([plain_service, node_port_service]),
    st.lists(
        st.tuples(st.sampled_from(SERVICE_PATHS), st.sampled_from(SERVICE_WEIRD)),
        min_size=1,
        max_size=3,
    ),
)
def test_service_paths_agree(make: Any, changes: list[tuple[tuple[Any, ...], Any]]) -> None:
    obj = make()
    for path, value in changes:
        obj = put(obj, path, value)
    assert outcome(objects.parse_service, obj) == outcome(general_service, obj)


def test_a_rejected_service_names_the_field_as_before() -> None:
    obj = plain_service()
    obj["spec"]["ports"][1]["name"] = "http"
    with pytest.raises(InvalidObject, match=r"spec\.ports\[1\]\.name.*duplicate name"):
        objects.parse_service(obj)


#: Where an endpoint as an API server writes it may be changed.
ENDPOINT_PATHS: list[tuple[Any, ...]] = [
    ("endpoints", i, *rest)
    for i in (0, 1)
    for rest in [
        (),
        ("addresses",),
        ("addresses", 0),
        ("conditions",),
        ("conditions", "ready"),
        ("conditions", "serving"),
        ("conditions", "terminating"),
        ("nodeName",),
        ("zone",),
        ("hints",),
        ("targetRef",),
    ]
]


def api_slice() -> dict[str, Any]:
    """An EndpointSlice as an API server serves it: every endpoint with its three conditions,
    a node name and a zone."""
    endpoints = [
        {
            "addresses": [f"10.128.3.{254 + i}"],
            "conditions": {"ready": True, "serving": True, "terminating": False},
            "nodeName": node,
            "zone": "zone-a",
        }
        for i, node in enumerate(("bench-node", "other"))
    ]
    return {
        "metadata": {
            "name": "web-abcde",
            "namespace": "default",
            "labels": {"kubernetes.io/service-name": "web"},
            "annotations": {
                "endpoints.kubernetes.io/last-change-trigger-time": "2025-06-01T12:00:00Z"
            },
        },
        "addressType": "IPv4",
        "ports": [{"name": "", "port": 8080, "protocol": "TCP"}],
        "endpoints": endpoints,
    }


#: Values that look like the right field to a subscript, but are not.
API_ENDPOINT_WEIRD: list[Any] = [
    "10.128.3.254",
    "other",
    "bench-node",
    "zone-b",
    "1.2.3.4\n",
    "1.2.3",
    {0: "10.128.3.254"},
    ("10.128.3.254",),
    {"ready": True, "serving": True, "terminating": False},
    {"ready": 1, "serving": True, "terminating": False},
    {"ready": True, "serving": True},
    ["ready", "serving", "terminating"],
]


def test_api_endpoints_agree_on_each_change() -> None:
    for path in ENDPOINT_PATHS:
        for value in [*WEIRD, *API_ENDPOINT_WEIRD]:
            for _ in range(2):  # the second time, the names are remembered
                obj = put(api_slice(), path, value)
                assert outcome(objects.parse_endpoint_slice, obj) == outcome(general, obj), (
                    path,
                    value,
                )


def test_api_endpoints_share_their_node_and_zone_names() -> None:
    first, second = api_slice(), copy.deepcopy(api_slice())
    for ep in second["endpoints"]:  # equal, but other string objects
        ep["nodeName"], ep["zone"] = "".join(ep["nodeName"]), "".join(ep["zone"])
    a = objects.parse_endpoint_slice(first).endpoints
    b = objects.parse_endpoint_slice(second).endpoints
    assert a == b
    assert all(x.node_name is y.node_name and x.zone is y.zone for x, y in zip(a, b, strict=True))


def test_a_service_and_its_slices_share_namespace_and_name() -> None:
    obj, es = plain_service(), api_slice()
    obj["metadata"]["namespace"] = "".join(["def", "ault"])  # equal, another string object
    svc = objects.parse_service(obj)
    slice_ = objects.parse_endpoint_slice(es)
    assert svc.namespace is slice_.namespace and svc.name is slice_.service_name
