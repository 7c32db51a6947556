"""The maps the ebpf mode's programs read, byte for byte (bpf/kubeplex_lb.h is the same in C).

Host-order integers use the native byte order ("=": no padding, so every pad byte is written
out explicitly as in the C structs); addresses and ports are in network order, packed as bytes.
All maps are pinned under ``<bpffs folder>/kubeplex/`` by their names.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address
from typing import Final

#: The folder under the bpffs mount that holds every pinned map and link of the mode.
PIN_FOLDER: Final = "kubeplex"
#: The default bpffs mount (an option of the mode).
DEFAULT_BPFFS: Final = "/sys/fs/bpf"

PROTO_TCP: Final = 6
PROTO_UDP: Final = 17

#: Service value flag: pick the client's previous backend while its affinity entry is fresh.
FLAG_AFFINITY: Final = 1 << 0

FAMILY_V4: Final = 4
FAMILY_V6: Final = 6


@dataclass(frozen=True, slots=True)
class MapLayout:
    """One map: its pinned name, its key and value structs and its capacity."""

    name: str
    key: struct.Struct
    value: struct.Struct
    max_entries: int


# kpx_svc4 / kpx_svc6 (HASH): {addr, port be16, proto u8, pad u8} -> SVC_VALUE.
SVC4_KEY: Final = struct.Struct("=4s2sBx")
SVC6_KEY: Final = struct.Struct("=16s2sBx")
# {svc_id u32, count u16 (0: refuse), flags u16, affinity_timeout u32 seconds}
SVC_VALUE: Final = struct.Struct("=IHHI")

# kpx_backends (HASH): {svc_id u32, slot u16, pad u16} -> {addr[16] (IPv4: first 4), port be16,
# family u8, pad u8}
BACKEND_KEY: Final = struct.Struct("=IHxx")
BACKEND_VALUE: Final = struct.Struct("=16s2sBx")

# kpx_slots (HASH), for Services with affinity: {svc_id u32, port be16, pad u16, addr[16]} ->
# {slot u16, pad u16}. An affinity entry names its endpoint; this says in which slot it is now.
SLOT_KEY: Final = struct.Struct("=I2sxx16s")
SLOT_VALUE: Final = struct.Struct("=Hxx")

# kpx_revnat4 / kpx_revnat6 (LRU_HASH): {socket cookie u64, backend addr, backend port be16, pad}
# -> {service addr, service port be16, pad}. The IPv6 key pads to the u64's alignment.
REVNAT4_KEY: Final = struct.Struct("=Q4s2sxx")
REVNAT4_VALUE: Final = struct.Struct("=4s2sxx")
REVNAT6_KEY: Final = struct.Struct("=Q16s2sxxxxxx")
REVNAT6_VALUE: Final = struct.Struct("=16s2sxx")

# kpx_affinity (LRU_HASH): {netns cookie u64, svc_id u32, pad u32} -> {endpoint addr[16],
# endpoint port be16, pad u16, pad u32, last_used_ns u64}
AFFINITY_KEY: Final = struct.Struct("=QIxxxx")
AFFINITY_VALUE: Final = struct.Struct("=16s2sxxxxxxQ")

SVC4: Final = MapLayout("kpx_svc4", SVC4_KEY, SVC_VALUE, 65536)
SVC6: Final = MapLayout("kpx_svc6", SVC6_KEY, SVC_VALUE, 65536)
BACKENDS: Final = MapLayout("kpx_backends", BACKEND_KEY, BACKEND_VALUE, 262144)
SLOTS: Final = MapLayout("kpx_slots", SLOT_KEY, SLOT_VALUE, 262144)
REVNAT4: Final = MapLayout("kpx_revnat4", REVNAT4_KEY, REVNAT4_VALUE, 262144)
REVNAT6: Final = MapLayout("kpx_revnat6", REVNAT6_KEY, REVNAT6_VALUE, 262144)
AFFINITY: Final = MapLayout("kpx_affinity", AFFINITY_KEY, AFFINITY_VALUE, 65536)

MAPS: Final = (SVC4, SVC6, BACKENDS, SLOTS, REVNAT4, REVNAT6, AFFINITY)

#: The programs (libbpf SEC names "cgroup/<name>"), one pinned link each.
PROGRAMS: Final = (
    "connect4",
    "connect6",
    "sendmsg4",
    "sendmsg6",
    "recvmsg4",
    "recvmsg6",
    "getpeername4",
    "getpeername6",
)
#: The function name of a program in the object: kpx_<hook>.
PROGRAM_PREFIX: Final = "kpx_"


def svc_key(addr: IPv4Address | IPv6Address, port: int, proto: int) -> bytes:
    """The kpx_svc4 / kpx_svc6 key (pick the map by ``addr.version``)."""
    layout = SVC4_KEY if addr.version == 4 else SVC6_KEY
    return layout.pack(addr.packed, port.to_bytes(2, "big"), proto)


def svc_value(svc_id: int, count: int, flags: int = 0, affinity_timeout: int = 0) -> bytes:
    return SVC_VALUE.pack(svc_id, count, flags, affinity_timeout)


def backend_key(svc_id: int, slot: int) -> bytes:
    return BACKEND_KEY.pack(svc_id, slot)


def backend_value(addr: IPv4Address | IPv6Address, port: int) -> bytes:
    family = FAMILY_V4 if addr.version == 4 else FAMILY_V6
    return BACKEND_VALUE.pack(addr.packed.ljust(16, b"\0"), port.to_bytes(2, "big"), family)


def slot_key(svc_id: int, backend: bytes) -> bytes:
    """The kpx_slots key of an endpoint, from its kpx_backends value."""
    addr, port, _family = BACKEND_VALUE.unpack(backend)
    return SLOT_KEY.pack(svc_id, port, addr)


def slot_value(slot: int) -> bytes:
    return SLOT_VALUE.pack(slot)


def affinity_value(backend: bytes, last_used_ns: int) -> bytes:
    """An affinity entry naming the endpoint of a kpx_backends value."""
    addr, port, _family = BACKEND_VALUE.unpack(backend)
    return AFFINITY_VALUE.pack(addr, port, last_used_ns)
