"""What the differential tests of the object fast paths share: odd values to put anywhere in an
object, putting one at a path, and a parse's outcome (the object, or the error) by the general,
field-by-field path or the one the parser picks."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from typing import Any

from kubeplex.core.model import objects
from kubeplex.core.model.errors import InvalidObject

#: Values put in place of a field: valid and invalid ones, of every JSON type.
WEIRD: list[Any] = [
    None,
    "",
    "a",
    "web",
    "Web",
    "web-",
    "a" * 64,
    "a" * 254,
    "a.b",
    "web\n",
    "IPv4",
    "IPv6",
    "FQDN",
    "TCP",
    "UDP",
    "SCTP",
    "tcp",
    "10.0.0.1",
    "10.0.0.01",
    " 10.0.0.2",
    "::1",
    "fe80::1%eth0",
    "2001:DB8::1",
    0,
    1,
    80,
    65535,
    65536,
    -1,
    True,
    False,
    1.5,
    [],
    [None],
    [{}],
    {},
    {"name": "zone-a"},
    [{"name": "zone-a"}],
    [{"name": "bad zone"}],
]


def put(obj: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    here: Any = out
    for step in path[:-1]:
        try:
            here = here[step]
        except (KeyError, IndexError, TypeError):
            return out
    with contextlib.suppress(IndexError, TypeError):
        here[path[-1]] = value
    return out


def outcome(parse: Callable[[Any], Any], obj: Any) -> Any:
    try:
        return parse(obj)
    except InvalidObject as err:
        return ("error", str(err), err.details)


def general(obj: Any) -> Any:
    """parse_endpoint_slice with both fast paths off: every field checked by name."""
    saved = objects.endpoint_slice_fast_path, objects.endpoint_fast_path
    objects.endpoint_slice_fast_path = lambda _obj: None  # type: ignore[assignment]
    objects.endpoint_fast_path = lambda _raw, _type: None  # type: ignore[assignment]
    try:
        return objects.parse_endpoint_slice(obj)
    finally:
        objects.endpoint_slice_fast_path, objects.endpoint_fast_path = saved
