"""The factories that fill frozen model objects without their generated __init__ make the
same objects, and break loudly when a field is added or renamed."""

from __future__ import annotations

import dataclasses

import pytest

from kubeplex.core.model import objects
from kubeplex.core.model.objects import SliceEndpoint
from kubeplex.core.model.types import Endpoint, new_endpoint, slot_setters


def test_new_endpoint_is_the_constructed_one() -> None:
    args = ("10.0.0.1", 80, False, True, True, True, "node-a", "zone-a")
    hints = (frozenset({"zone-a"}), frozenset({"node-a"}))
    made, built = new_endpoint(*args, *hints), Endpoint(*args, *hints)
    assert made == built and hash(made) == hash(built) and repr(made) == repr(built)
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.ip = "10.0.0.2"  # type: ignore[misc]


def test_new_slice_endpoint_is_the_constructed_one() -> None:
    args = ("fd00::1", True, False, False, "node-a", "", frozenset(), frozenset({"node-a"}))
    made = objects._new_slice_endpoint(*args)
    assert made == SliceEndpoint(*args) and repr(made) == repr(SliceEndpoint(*args))


def test_slot_setters_must_name_every_field_in_order() -> None:
    with pytest.raises(TypeError, match="fields are"):
        slot_setters(Endpoint, "ip port")
    with pytest.raises(TypeError, match="fields are"):
        slot_setters(
            SliceEndpoint, "ready ip serving terminating node_name zone zone_hints node_hints"
        )
