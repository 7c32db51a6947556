"""The EndpointSlice fast paths (a whole plain slice, a plain endpoint) agree with the general,
field-by-field path on every input: the same object, or the same error."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kits.fast_paths_kit import WEIRD, general, outcome, put

from kubeplex.core.model import objects, objects_fast_paths
from kubeplex.core.model.errors import InvalidObject

#: Where a value may be replaced: a path into the slice (str keys, int indexes).
PATHS: list[tuple[Any, ...]] = [
    ("metadata",),
    ("metadata", "name"),
    ("metadata", "namespace"),
    ("metadata", "labels"),
    ("metadata", "labels", "kubernetes.io/service-name"),
    ("metadata", "annotations"),
    ("metadata", "annotations", "endpoints.kubernetes.io/last-change-trigger-time"),
    ("addressType",),
    ("ports",),
    ("ports", 0),
    ("ports", 0, "name"),
    ("ports", 0, "port"),
    ("ports", 0, "protocol"),
    ("ports", 1, "name"),
    ("endpoints",),
    ("endpoints", 0),
    ("endpoints", 0, "addresses"),
    ("endpoints", 0, "addresses", 0),
    ("endpoints", 0, "conditions"),
    ("endpoints", 0, "conditions", "ready"),
    ("endpoints", 0, "conditions", "serving"),
    ("endpoints", 0, "conditions", "terminating"),
    ("endpoints", 0, "nodeName"),
    ("endpoints", 1, "zone"),
    ("endpoints", 1, "hints"),
    ("endpoints", 1, "hints", "forZones"),
    ("endpoints", 1, "hints", "forNodes"),
]


def base() -> dict[str, Any]:
    return {
        "metadata": {
            "name": "web-abc",
            "namespace": "default",
            "labels": {"kubernetes.io/service-name": "web"},
            "annotations": {
                "endpoints.kubernetes.io/last-change-trigger-time": "2025-06-01T12:00:00Z"
            },
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}, {"name": "dns", "port": 53}],
        "endpoints": [
            {
                "addresses": ["10.0.0.1"],
                "conditions": {"ready": True, "serving": True, "terminating": False},
                "nodeName": "node-a",
            },
            {
                "addresses": ["10.0.0.2"],
                "zone": "zone-a",
                "hints": {"forZones": [{"name": "zone-a"}], "forNodes": [{"name": "node-a"}]},
            },
        ],
    }


def test_the_plain_slice_takes_the_fast_path() -> None:
    assert objects_fast_paths.endpoint_slice_fast_path(base()) is not None
    assert objects_fast_paths.endpoint_slice_fast_path(base()) == objects.parse_endpoint_slice(
        base()
    )


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(PATHS), st.sampled_from(WEIRD)), min_size=1, max_size=3))
def test_fast_and_general_paths_agree(changes: list[tuple[tuple[Any, ...], Any]]) -> None:
    obj = base()
    for path, value in changes:
        obj = put(obj, path, value)
    assert outcome(objects.parse_endpoint_slice, obj) == outcome(general, obj)


@pytest.mark.parametrize("family", ["IPv4", "IPv6"])
def test_fast_and_general_paths_agree_on_each_change(family: str) -> None:
    start = base()
    if family == "IPv6":
        start["addressType"] = "IPv6"
        for i, endpoint in enumerate(start["endpoints"]):
            endpoint["addresses"] = [f"fd00::{i + 1}"]
    for path in PATHS:
        for value in WEIRD:
            obj = put(start, path, value)
            assert outcome(objects.parse_endpoint_slice, obj) == outcome(general, obj), (
                path,
                value,
            )


def test_names_remembered_as_valid_never_let_an_invalid_one_through() -> None:
    long_node = "n" * 300  # a valid nodeName pattern, too long for an object name
    obj = base()
    obj["endpoints"][0]["nodeName"] = long_node
    assert objects.parse_endpoint_slice(obj).endpoints[0].node_name == long_node
    obj = base()
    obj["metadata"]["name"] = long_node
    with pytest.raises(InvalidObject, match=r"metadata\.name"):
        objects.parse_endpoint_slice(obj)
