"""The list metadata a page is read ahead for (the next page's request needs only it), and the
items of a page, decoded one by one from the whole text or as it arrives."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubeplex.core.sources import list_decoder
from kubeplex.core.sources.kubeapi import drop_unread_fields
from kubeplex.core.sources.list_decoder import StreamedPage, list_items, list_metadata


def test_list_meta_is_read_before_the_items() -> None:
    page = {
        "kind": "ServiceList",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": "7", "continue": "tok"},
        "items": [{"metadata": {"name": "x"}}],
    }
    assert list_metadata(json.dumps(page).encode()) == page["metadata"]
    assert list_metadata(json.dumps(page, indent=2).encode()) == page["metadata"]


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
    assert list_metadata(text) is None


def test_list_meta_of_a_non_object_is_empty() -> None:
    assert list_metadata(b'{"metadata": 3, "items": []}') == {}


# ---------------------------------------------------------------------- items, one at a time

ITEMS = [
    {"metadata": {"name": "a", "namespace": "x"}, "spec": {"ports": [{"port": 80}]}},
    {"metadata": {"name": "b", "namespace": "x"}, "endpoints": [{"addresses": ["10.0.0.1"]}]},
]


@pytest.mark.parametrize("indent", [None, 2])
def test_list_items_are_decoded_one_by_one_as_the_whole(indent: int | None) -> None:
    page = {"kind": "ServiceList", "apiVersion": "v1", "metadata": {"resourceVersion": "7"}}
    text = json.dumps({**page, "items": ITEMS}, indent=indent).encode()
    assert list(list_items(text)) == ITEMS
    assert list(list_items(json.dumps({**page, "items": []}, indent=indent).encode())) == []


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
    assert list(list_items(json.dumps(page).encode())) == expected


@pytest.mark.parametrize(
    "text", [b'{"items": [{"a": 1} {"b": 2}]}', b'{"kind": "x", "items": [{"a": 1},', b"{"]
)
def test_list_items_of_a_broken_response_raise(text: bytes) -> None:
    with pytest.raises(ValueError):
        list(list_items(text))


def test_list_items_of_a_decoded_list() -> None:
    assert list(list_items({"items": ITEMS})) == ITEMS
    assert list(list_items({"items": "nope"})) == []


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
    slim = drop_unread_fields(obj)
    assert slim["metadata"] == {
        "name": "web-abc",
        "uid": "u",
        "resourceVersion": "5",
        "creationTimestamp": "2025-06-01T12:00:00Z",
        "labels": {"kubernetes.io/service-name": "web"},
    }
    assert slim["endpoints"] == [{"addresses": ["10.0.0.1"], "zone": "a"}, "odd"]
    assert drop_unread_fields({"metadata": "odd", "endpoints": "odd"}) == {
        "metadata": "odd",
        "endpoints": "odd",
    }


# ---------------------------------------------------------------------- items, as they arrive


def streamed(text: bytes, sizes: list[int]) -> tuple[StreamedPage, list[bool]]:
    """``text`` as a streamed page arriving in pieces of ``sizes`` (cycled); the release
    calls it made."""
    released: list[bool] = []
    cuts, pos, i = [], 0, 0
    while pos < len(text):
        step = max(1, sizes[i % len(sizes)])
        cuts.append(text[pos : pos + step])
        pos, i = pos + step, i + 1
    return StreamedPage(cuts[0] if cuts else b"", iter(cuts[1:]), released.append), released


UNICODE_ITEMS = [
    *ITEMS,
    {"metadata": {"name": "c", "annotations": {"note": "é ü 漢字 \u2028 😀"}}},
    {"metadata": {"name": "d"}, "spec": {"ports": [{"port": 81}] * 50}},
]


@given(
    sizes=st.lists(st.integers(1, 300), min_size=1, max_size=8),
    indent=st.sampled_from([None, 1, 2]),
    items=st.lists(st.sampled_from(UNICODE_ITEMS), max_size=12),
)
@settings(max_examples=300, deadline=None)
def test_streamed_items_are_those_of_the_whole_however_the_text_is_cut(
    sizes: list[int], indent: int | None, items: list[dict[str, object]]
) -> None:
    page = {"kind": "ServiceList", "apiVersion": "v1", "metadata": {"resourceVersion": "7"}}
    text = json.dumps({**page, "items": items}, indent=indent, ensure_ascii=False).encode()
    body, released = streamed(text, sizes)
    assert list(list_items(body)) == items
    assert released == [True]  # all read: the connection is reused


@pytest.mark.parametrize("size", [1, 7, 4096])
@pytest.mark.parametrize(
    ("page", "expected"),
    [
        ({"items": ITEMS, "metadata": {}}, ITEMS),  # items first: decoded whole
        ({"metadata": {}, "items": ITEMS, "kind": "ServiceList"}, ITEMS),
        ({"items": [ITEMS[0], 3, ITEMS[1]]}, ITEMS),
        ({"kind": "ServiceList", "items": None}, []),
    ],
)
def test_streamed_items_of_other_layouts(
    size: int, page: dict[str, object], expected: list[object]
) -> None:
    body, released = streamed(json.dumps(page).encode(), [size])
    assert list(list_items(body)) == expected
    assert released == [True]


@pytest.mark.parametrize("size", [1, 5, 4096])
@pytest.mark.parametrize(
    ("text", "reused"),
    [
        # not reused: what is left of the response would be taken for the next one
        (b'{"items": [{"a": 1} {"b": 2}]}', False),
        (b'{"kind": "x", "items": [{"a": 1},', False),  # the response ended halfway
        (b'{"kind": "x", "items": [{"a": "unterminated', False),
        (b"{", True),  # no items array found: read to its end, then decoded whole
    ],
)
def test_streamed_items_of_a_broken_response_raise(size: int, text: bytes, reused: bool) -> None:
    body, released = streamed(text, [size])
    with pytest.raises(ValueError):
        list(list_items(body))
    assert released == [reused]


def test_a_streamed_page_given_up_halfway_closes_its_connection() -> None:
    text = json.dumps({"metadata": {}, "items": ITEMS}).encode()
    body, released = streamed(text, [8])
    items = list_items(body)
    assert next(items) == ITEMS[0]
    items.close()
    assert released == [False]


def test_a_streamed_item_longer_than_many_chunks_is_decoded_a_few_times_only() -> None:
    big = {"metadata": {"name": "big"}, "spec": {"data": "x" * 200_000}}
    text = json.dumps({"metadata": {}, "items": [ITEMS[0], big, ITEMS[1]]}).encode()
    body, released = streamed(text, [100])
    decodes = 0
    real = list_decoder._DECODER.raw_decode

    def counting(s: str, idx: int = 0) -> tuple[object, int]:
        nonlocal decodes
        decodes += 1
        return real(s, idx)

    list_decoder._DECODER.raw_decode = counting  # type: ignore[method-assign]
    try:
        assert list(list_items(body)) == [ITEMS[0], big, ITEMS[1]]
    finally:
        del list_decoder._DECODER.raw_decode
    assert released == [True]
    assert decodes < 40  # 2,000 pieces of 100 bytes: not one try per piece
