"""The ebpf mode's plan: map operations (update a key to a value, delete a key), the bytes each
sends, and their printable form, decoded from those same bytes.

A plan is what ``apply`` sends, in order. Its order keeps the programs from ever reading a
slot that is not there: backend slots are written before the Service entries that count
them, and deleted after the Service entries that stopped counting them::

    update kpx_backends svc 0x1a2b3c4d slot 0 -> 10.244.1.2:8080
    update kpx_svc4 10.96.88.59:80/tcp -> svc 0x1a2b3c4d count 3 flags affinity timeout 10800
    delete kpx_svc4 10.96.88.60:80/udp
    delete kpx_backends svc 0x0badf00d slot 0
"""

from __future__ import annotations

import errno
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from socket import AF_INET, AF_INET6, inet_ntop
from typing import ClassVar, Protocol

from kubeplex.backends.ebpf import layout
from kubeplex.core.dataplane.backend import Rendered

#: The maps the render writes; the programs alone write the reverse NAT and affinity maps.
SERVICE_MAPS = (layout.SVC4.name, layout.SVC6.name)
#: The maps of endpoints: written before the Service entries that count them, deleted after.
SLOT_MAPS = (layout.BACKENDS.name, layout.SLOTS.name)
RENDERED_MAPS = (*SERVICE_MAPS, *SLOT_MAPS)
#: What a full sync reads: the rendered maps, and the affinity entries whose Service is gone.
OBSERVED_MAPS = (*RENDERED_MAPS, layout.AFFINITY.name)

_PROTOCOLS = {layout.PROTO_TCP: "tcp", layout.PROTO_UDP: "udp"}


class MapSeam(Protocol):
    """What the plan is sent through: the mode's pinned maps and the node's nftables tables of
    entry points from other hosts (``kubeplex.testing.fakes``' ``FakeEbpfMaps`` in memory).
    Errors of the maps are the bpf syscall's ``OSError``, of the tables ``BackendError``."""

    #: The methods apply writes through (the contract's ``writes``).
    writes: ClassVar[tuple[str, ...]]

    def update(self, name: str, key: bytes, value: bytes, flags: int = 0) -> None: ...

    def delete(self, name: str, key: bytes) -> None: ...

    def dump(self, name: str) -> dict[bytes, bytes]: ...

    def lookup(self, name: str, key: bytes) -> bytes:
        """The value at ``key`` (``inspect`` reads one Service's entries); ENOENT if none."""
        ...

    def transact(self, text: str) -> None:
        """Commits ``text`` to the node's nftables as one transaction (nothing changes if
        refused)."""
        ...

    def tables(self) -> list[tuple[str, str]]:
        """The (family, name) of every nftables table of the node."""
        ...

    def nat_flows(self, families: Iterable[str]) -> bool:
        """Whether conntrack holds a NATed flow of these families ("ipv4", "ipv6") in the
        node (True where that cannot be read)."""
        ...


#: What the maps hold (an observation): each rendered map's entries, raw.
MapDump = Mapping[str, Mapping[bytes, bytes]]


def _endpoint(addr: bytes, port: bytes) -> str:
    number = int.from_bytes(port, "big")
    if len(addr) == 4:
        return f"{inet_ntop(AF_INET, addr)}:{number}"
    return f"[{inet_ntop(AF_INET6, addr)}]:{number}"


def _shortest(addr: bytes) -> bytes:
    """An address of 16 bytes whose last 12 are zero: an IPv4 one (kpx_slots' layout)."""
    return addr[:4] if not any(addr[4:]) else addr


def describe_key(name: str, key: bytes) -> str:
    """A key as the plan prints it (its raw bytes where they do not fit the map's layout)."""
    try:
        if name in SERVICE_MAPS:
            shape = layout.SVC4_KEY if name == layout.SVC4.name else layout.SVC6_KEY
            addr, port, proto = shape.unpack(key)
            return f"{_endpoint(addr, port)}/{_PROTOCOLS.get(proto, str(proto))}"
        if name == layout.BACKENDS.name:
            svc_id, slot = layout.BACKEND_KEY.unpack(key)
            return f"svc {svc_id:#010x} slot {slot}"
        if name == layout.SLOTS.name:
            svc_id, port, addr = layout.SLOT_KEY.unpack(key)
            return f"svc {svc_id:#010x} endpoint {_endpoint(_shortest(addr), port)}"
        if name == layout.AFFINITY.name:
            netns, svc_id = layout.AFFINITY_KEY.unpack(key)
            return f"svc {svc_id:#010x} netns {netns:#x}"
    except (struct.error, ValueError):  # (inet_ntop: an address of the wrong length)
        pass
    return "0x" + key.hex()


def describe_value(name: str, value: bytes) -> str:
    """A value as the plan prints it (raw bytes where they do not fit the layout)."""
    try:
        if name in SERVICE_MAPS:
            svc_id, count, flags, timeout = layout.SVC_VALUE.unpack(value)
            text = f"svc {svc_id:#010x} count {count}"
            if flags & layout.FLAG_AFFINITY:
                text += f" flags affinity timeout {timeout}"
            return text
        if name == layout.BACKENDS.name:
            addr, port, family = layout.BACKEND_VALUE.unpack(value)
            if family == layout.FAMILY_V4:
                return _endpoint(addr[:4], port)
            if family == layout.FAMILY_V6:
                return _endpoint(addr, port)
        if name == layout.SLOTS.name:
            (slot,) = layout.SLOT_VALUE.unpack(value)
            return f"slot {slot}"
    except (struct.error, ValueError):
        pass
    return "0x" + value.hex()


@dataclass(frozen=True, slots=True)
class MapOp:
    """One map operation: an update when ``value`` is set, else a delete."""

    map: str
    key: bytes
    value: bytes | None = None

    def __str__(self) -> str:
        key = describe_key(self.map, self.key)
        if self.value is None:
            return f"delete {self.map} {key}"
        return f"update {self.map} {key} -> {describe_value(self.map, self.value)}"

    def send(self, seam: MapSeam) -> None:
        if self.value is not None:
            seam.update(self.map, self.key, self.value)
            return
        try:
            seam.delete(self.map, self.key)
        except OSError as err:
            # The affinity map is an LRU map the programs write: an entry dumped may since
            # have been evicted. Gone is what the delete wanted.
            if err.errno != errno.ENOENT or self.map != layout.AFFINITY.name:
                raise


def diff(desired: MapDump, held: MapDump, maps: Sequence[str] = RENDERED_MAPS) -> list[MapOp]:
    """The operations that turn what ``held`` has of ``maps`` into ``desired``, in the plan's
    order (see the module's documentation)."""
    updates: dict[str, list[MapOp]] = {}
    deletes: dict[str, list[MapOp]] = {}
    for name in maps:
        want, have = desired.get(name, {}), held.get(name, {})
        updates[name] = [MapOp(name, k, v) for k, v in want.items() if have.get(k) != v]
        deletes[name] = [MapOp(name, k) for k in have if k not in want]
    return [
        *(op for name in maps if name in SLOT_MAPS for op in updates[name]),
        *(op for name in maps if name not in SLOT_MAPS for op in updates[name]),
        *(op for name in maps if name not in SLOT_MAPS for op in deletes[name]),
        *(op for name in maps if name in SLOT_MAPS for op in deletes[name]),
    ]


@dataclass(frozen=True)
class EbpfPlan(Rendered):
    """The map operations of one sync, in the order ``apply`` sends them."""

    ops: tuple[MapOp, ...]
    is_full: bool = True
    #: Service ports (or one entry point of theirs) not programmed, with the reason: an
    #: unsupported protocol, an entry point another Service port holds.
    left_out: Mapping[str, str] = field(default_factory=dict)
    #: The nftables transaction of the entry points for traffic from other hosts
    #: (entry_nat.py), sent after the map operations; "" if they stay as they are.
    entry_nat: str = ""

    @property
    def full(self) -> bool:
        return self.is_full

    def kernel_inputs(self) -> list[str]:
        """Each operation as the bytes it sends, in hex: "update MAP KEY VALUE", "delete MAP
        KEY" (what ``FakeEbpfMaps.sent`` logs)."""
        return [
            f"delete {op.map} {op.key.hex()}"
            if op.value is None
            else f"update {op.map} {op.key.hex()} {op.value.hex()}"
            for op in self.ops
        ] + ([self.entry_nat] if self.entry_nat else [])

    def send(self, seam: MapSeam) -> None:
        """Send every operation in order; the seam's ``OSError`` stops at the first refused."""
        for op in self.ops:
            op.send(seam)

    def __str__(self) -> str:
        lines = [str(op) for op in self.ops]
        lines += [f"# left out: {svc}: {why}" for svc, why in sorted(self.left_out.items())]
        if self.entry_nat:
            lines += ["# nftables, traffic from other hosts:", self.entry_nat.rstrip("\n")]
        return "".join(line + "\n" for line in lines)
