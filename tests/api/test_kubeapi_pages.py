"""The list metadata a page is read ahead for (the next page's request needs only it)."""

from __future__ import annotations

import json

import pytest

from kubeplex.core.sources.kubeapi import _list_meta


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
