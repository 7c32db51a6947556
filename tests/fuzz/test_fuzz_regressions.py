"""What the fuzz suite found, kept as plain tests (the ci budget need not draw them again)."""

from __future__ import annotations

from typing import Any

import pytest
from fuzz_checks import FAMILIES, Rejections
from kube_strategies import NODE, node_object, set_path

from kubeplex.core.model.cluster import ClusterState


@pytest.mark.parametrize("value", [["InternalIP"], {"a": 1}, 5])
def test_a_node_address_type_that_is_not_a_string_is_rejected_not_a_crash(value: Any) -> None:
    """Found by the fuzz suite: ``if kind in by_type`` raised TypeError for a list type."""
    sink = Rejections()
    cluster = ClusterState(NODE, FAMILIES, on_invalid=sink)
    cluster.set_node(set_path(node_object(), ("status", "addresses", 0, "type"), value))
    ((err, _),) = sink.seen
    assert err.where == f"Node {NODE}"
    assert [e.path for e in err.errors] == ["status.addresses[0].type"]
