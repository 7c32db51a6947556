"""Which slot each endpoint of a Service takes, so that a sync rewrites as few as it can.

A Service's endpoints fill slots 0 to count-1 of its svc_id (the program picks one at random).
Numbered afresh on every change, removing the first of 100 endpoints would rewrite 99 slots;
instead an endpoint keeps its slot while it stays below the new count, and the slots that
freed up are filled, lowest first, by the endpoints held past the new count (removing one of
100 moves the last endpoint into its slot) and then by the new ones, in the graph's order.
Every endpoint that has to be written then is written once, and no more are.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping, Sequence

from kubeplex.backends.ebpf import layout


def assign(held: Mapping[int, bytes], wanted: Sequence[bytes]) -> list[bytes]:
    """``wanted`` (kpx_backends values, duplicates allowed) in slot order, given what the
    slots ``held`` (slot -> value); with nothing held, ``wanted``'s own order."""
    count = len(wanted)
    if not held or (len(held) == count and all(held.get(i) == v for i, v in enumerate(wanted))):
        return list(wanted)  # what the loops below give, the common case of a full sync
    left = Counter(wanted)
    table: list[bytes | None] = [None] * count
    for slot in sorted(held):
        value = held[slot]
        if slot < count and left[value] > 0:
            table[slot] = value
            left[value] -= 1
    # Those held past the new count first (each moves once), then the graph's order.
    movers = itertools.chain((held[slot] for slot in sorted(held) if slot >= count), wanted)
    for slot in [slot for slot, value in enumerate(table) if value is None]:
        value = next(v for v in movers if left[v] > 0)
        table[slot] = value
        left[value] -= 1
    return [value for value in table if value is not None]


def held_by_id(slots: Mapping[bytes, bytes]) -> dict[int, dict[int, bytes]]:
    """kpx_backends entries (key -> value) as svc_id -> slot -> value."""
    out: dict[int, dict[int, bytes]] = {}
    for key, value in slots.items():
        svc_id, slot = layout.BACKEND_KEY.unpack(key)
        out.setdefault(svc_id, {})[slot] = value
    return out
