"""The factories that fill frozen model objects without their generated __init__ make the
same objects, and break loudly when a field is added or renamed."""

from __future__ import annotations

import dataclasses

import pytest

from kubeplex.core.model import objects_fast_paths
from kubeplex.core.model.types import (
    Endpoint,
    IPFamily,
    Protocol,
    ServicePort,
    ServicePortName,
    fast_init,
    new_endpoint,
    new_service_port,
    new_service_port_name,
)
from kubeplex.core.model.validated_objects import SliceEndpoint


def test_new_endpoint_is_the_constructed_one() -> None:
    args = ("10.0.0.1", 80, False, True, True, True, "node-a", "zone-a")
    hints = (frozenset({"zone-a"}), frozenset({"node-a"}))
    made, built = new_endpoint(*args, *hints), Endpoint(*args, *hints)
    assert made == built and hash(made) == hash(built) and repr(made) == repr(built)
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.ip = "10.0.0.2"  # type: ignore[misc]


def test_new_slice_endpoint_is_the_constructed_one() -> None:
    args = ("fd00::1", True, False, False, "node-a", "", frozenset(), frozenset({"node-a"}))
    made = objects_fast_paths._new_slice_endpoint(*args)
    assert made == SliceEndpoint(*args) and repr(made) == repr(SliceEndpoint(*args))


def test_new_service_port_is_the_constructed_one() -> None:
    spn = new_service_port_name("ns", "web", "http", Protocol.UDP)
    assert spn == ServicePortName("ns", "web", "http", Protocol.UDP)
    assert hash(spn) == hash(ServicePortName("ns", "web", "http", Protocol.UDP))
    assert spn < ServicePortName("ns", "web", "https") and str(spn) == "ns/web:http"
    args = (spn, IPFamily.IPv6, "fd00::1", 53, Protocol.UDP, 30053, ("fd00::2",), ("fd00::3",))
    rest = (("fd00::/64",), True, 60, True, False, 30999, "PreferClose")
    assert new_service_port(*args, *rest) == ServicePort(*args, *rest)


def test_fast_init_takes_only_plain_frozen_slotted_dataclasses() -> None:
    @dataclasses.dataclass(frozen=True)
    class Unslotted:
        a: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Checked:
        a: int

        def __post_init__(self) -> None:
            raise ValueError

    for cls in (Unslotted, Checked):
        with pytest.raises(TypeError, match="not a plain"):
            fast_init(cls)
