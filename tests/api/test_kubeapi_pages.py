"""The list metadata a page is read ahead for (the next page's request needs only it)."""

from __future__ import annotations

import json

import pytest

from kubeplex.core.sources.kubeapi import _list_items, _list_meta, _slim


def test_list_meta_is_read_before_the_items() -> None:
    page = {
        "kind": "ServiceList",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": "7", "continue": "tok"},
        "items": [{"metadata": {"name": "x"}}],
    }
    assert _list_meta(json.dumps(page).encode()) == page["metadata"]
    assert _list_meta(json.dumps(page, indent=2).encode()) == page["metadata"]


@pytest.mark.parametrize(
    "text",
    [
        b'{"items": [], "metadata": {"continue": "x"}}',  # items first: decoded whole
        b"{}",
        b"[]",
        b"",
        b'{"kind": "x" "metadata": {}}',
        b'{"metadata": {"continue": "' + b"a" * 5000 + b'"}}',  # longer than the read-ahead
    ],
)
def test_list_meta_leaves_odd_pages_to_the_full_decoder(text: bytes) -> None:
    assert _list_meta(text) is None


def test_list_meta_of_a_non_object_is_empty() -> None:
    assert _list_meta(b'{"metadata": 3, "items": []}') == {}


# ---------------------------------------------------------------------- items, one at a time

ITEMS = [
    {"metadata": {"name": "a", "namespace": "x"}, "spec": {"ports": [{"port": 80}]}},
    {"metadata": {"name": "b", "namespace": "x"}, "endpoints": [{"addresses": ["10.0.0.1"]}]},
]


@pytest.mark.parametrize("indent", [None, 2])
def test_list_items_are_decoded_one_by_one_as_the_whole(indent: int | None) -> None:
    page = {"kind": "ServiceList", "apiVersion": "v1", "metadata": {"resourceVersion": "7"}}
    text = json.dumps({**page, "items": ITEMS}, indent=indent).encode()
    assert list(_list_items(text)) == ITEMS
    assert list(_list_items(json.dumps({**page, "items": []}, indent=indent).encode())) == []


@pytest.mark.parametrize(
    ("page", "expected"),
    [
        ({"items": ITEMS, "metadata": {}}, ITEMS),  # items first
        ({"metadata": {}, "items": ITEMS, "kind": "ServiceList"}, ITEMS),  # members after them
        ({"items": [ITEMS[0], 3, ITEMS[1]]}, ITEMS),  # an item that is no object: skipped
        ({"kind": "ServiceList", "items": None}, []),  # decoded whole
        ({"kind": "ServiceList"}, []),
    ],
)
def test_list_items_of_other_layouts(page: dict[str, object], expected: list[object]) -> None:
    assert list(_list_items(json.dumps(page).encode())) == expected


@pytest.mark.parametrize(
    "text", [b'{"items": [{"a": 1} {"b": 2}]}', b'{"kind": "x", "items": [{"a": 1},', b"{"]
)
def test_list_items_of_a_broken_response_raise(text: bytes) -> None:
    with pytest.raises(ValueError):
        list(_list_items(text))


def test_list_items_of_a_decoded_list() -> None:
    assert list(_list_items({"items": ITEMS})) == ITEMS
    assert list(_list_items({"items": "nope"})) == []


def test_slim_drops_what_nothing_reads_and_keeps_the_rest() -> None:
    obj = {
        "kind": "EndpointSlice",
        "metadata": {
            "name": "web-abc",
            "uid": "u",
            "resourceVersion": "5",
            "creationTimestamp": "2025-06-01T12:00:00Z",
            "labels": {"kubernetes.io/service-name": "web"},
            "managedFields": [{"manager": "kube-controller-manager"}],
            "ownerReferences": [{"kind": "Service", "name": "web"}],
        },
        "endpoints": [
            {"addresses": ["10.0.0.1"], "targetRef": {"kind": "Pod"}, "zone": "a"},
            "odd",
        ],
    }
    slim = _slim(obj)
    assert slim["metadata"] == {
        "name": "web-abc",
        "uid": "u",
        "resourceVersion": "5",
        "creationTimestamp": "2025-06-01T12:00:00Z",
        "labels": {"kubernetes.io/service-name": "web"},
    }
    assert slim["endpoints"] == [{"addresses": ["10.0.0.1"], "zone": "a"}, "odd"]
    assert _slim({"metadata": "odd", "endpoints": "odd"}) == {"metadata": "odd", "endpoints": "odd"}
