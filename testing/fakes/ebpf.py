"""In-memory BPF maps: the ebpf mode's map seam (update, delete, lookup, dump) without a kernel.

``FakeEbpfMaps`` holds the maps the ebpf mode's programs share with the daemon, pinned under
``<bpffs>/kubeplex/``, as the bpf syscall keeps them: each map a dictionary of raw key bytes
to raw value bytes, with the map's type, key and value sizes and maximum number of entries
(``MAPS``, the same layout the C programs declare; a unit test holds the two to each other).
It refuses what the kernel refuses, raising ``OSError`` with the syscall's errno:

* a map that is not pinned: ``ENOENT``;
* a key or value of the wrong size: ``EINVAL``;
* ``update`` with ``NOEXIST`` of a present key: ``EEXIST``; with ``EXIST`` of a missing one:
  ``ENOENT``; an unknown flag: ``EINVAL``;
* a new key in a full ``hash`` map: ``E2BIG``. A full ``lru_hash`` map evicts its least
  recently used entry instead (an update or a lookup counts as a use);
* ``delete`` or ``lookup`` of a missing key: ``ENOENT``.

Every update and delete received is logged in ``sent`` (refused ones too, after "! "), as
"update MAP KEYHEX VALUEHEX" and "delete MAP KEYHEX". ``dump`` lists a map in insertion
order (the kernel's hash order is not something to depend on). What it cannot model: the
programs themselves (no socket is ever redirected, so nothing is written to the reverse NAT
or affinity maps unless a test writes it), the kernel's memory accounting, and the
per-CPU and batch operations, which the mode does not use.

The seam also carries the node's nftables tables of entry points from other hosts:
``transact(text)`` records each transaction in ``transactions`` and keeps which tables a
``table FAMILY NAME`` line made and a ``delete table FAMILY NAME`` line removed; ``tables()``
lists them. nft's parser is not modelled: a transaction is never refused. ``nat_flows``
(does conntrack hold a NATed flow?) answers ``holds_nat_flows``.

Usage::

    from kubeplex.testing.fakes import FakeEbpfMaps

    maps = FakeEbpfMaps()
    maps.update("kpx_backends", key, value)
    assert maps.dump("kpx_backends") == {key: value}
    maps.delete("kpx_backends", key)

tests/kernel/test_ebpf_fake_kernel.py holds it to the real pinned maps (the mode's
``PinnedMaps`` seam): the same steps, the same outcomes.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import ClassVar, Literal

#: The bpf syscall's update flags (BPF_ANY, BPF_NOEXIST, BPF_EXIST).
ANY, NOEXIST, EXIST = 0, 1, 2


@dataclass(frozen=True)
class MapSpec:
    """What the kernel knows of one map from its definition."""

    type: Literal["hash", "lru_hash"]
    key_size: int
    value_size: int
    max_entries: int


#: The maps the ebpf mode pins, as bpf/kubeplex_lb.h declares them (sizes with C padding).
MAPS: Mapping[str, MapSpec] = {
    "kpx_svc4": MapSpec("hash", 8, 12, 65536),
    "kpx_svc6": MapSpec("hash", 20, 12, 65536),
    "kpx_backends": MapSpec("hash", 8, 20, 262144),
    "kpx_slots": MapSpec("hash", 24, 4, 262144),
    "kpx_revnat4": MapSpec("lru_hash", 16, 8, 262144),
    "kpx_revnat6": MapSpec("lru_hash", 32, 20, 262144),
    "kpx_affinity": MapSpec("lru_hash", 16, 32, 65536),
}


def _refuse(code: int, what: str) -> OSError:
    return OSError(code, f"{what}: {os.strerror(code)}")


class FakeEbpfMaps:
    """See the module's documentation."""

    writes: ClassVar[tuple[str, ...]] = ("update", "delete", "transact")

    def __init__(self, maps: Mapping[str, MapSpec] = MAPS) -> None:
        self.specs = dict(maps)
        self.maps: dict[str, dict[bytes, bytes]] = {name: {} for name in self.specs}
        #: Every update and delete received ("! " before a refused one).
        self.sent: list[str] = []
        #: Every nftables transaction received, and the tables they left.
        self.transactions: list[str] = []
        self.present: set[tuple[str, str]] = set()
        #: What ``nat_flows`` answers: set it to model a node holding NATed flows.
        self.holds_nat_flows = False

    def _map(self, name: str) -> tuple[MapSpec, dict[bytes, bytes]]:
        spec = self.specs.get(name)
        if spec is None:
            raise _refuse(errno.ENOENT, f"map {name!r} is not pinned")
        return spec, self.maps[name]

    def _check_key(self, name: str, spec: MapSpec, key: bytes) -> None:
        if len(key) != spec.key_size:
            raise _refuse(
                errno.EINVAL, f"{name}: key of {len(key)} bytes, the map's are {spec.key_size}"
            )

    def update(self, name: str, key: bytes, value: bytes, flags: int = ANY) -> None:
        """Write ``key`` -> ``value`` (BPF_MAP_UPDATE_ELEM)."""
        line = f"update {name} {key.hex()} {value.hex()}"
        try:
            spec, entries = self._map(name)
            self._check_key(name, spec, key)
            if len(value) != spec.value_size:
                raise _refuse(
                    errno.EINVAL,
                    f"{name}: value of {len(value)} bytes, the map's are {spec.value_size}",
                )
            if flags not in (ANY, NOEXIST, EXIST):
                raise _refuse(errno.EINVAL, f"{name}: update flags {flags}")
            present = key in entries
            if flags == NOEXIST and present:
                raise _refuse(errno.EEXIST, f"{name}: key {key.hex()}")
            if flags == EXIST and not present:
                raise _refuse(errno.ENOENT, f"{name}: key {key.hex()}")
            if not present and len(entries) >= spec.max_entries:
                if spec.type != "lru_hash":
                    raise _refuse(errno.E2BIG, f"{name}: {spec.max_entries} entries")
                del entries[next(iter(entries))]
        except OSError:
            self.sent.append("! " + line)
            raise
        self.sent.append(line)
        entries.pop(key, None)  # (re)inserted last: the most recently used
        entries[bytes(key)] = bytes(value)

    def delete(self, name: str, key: bytes) -> None:
        """Remove ``key`` (BPF_MAP_DELETE_ELEM)."""
        line = f"delete {name} {key.hex()}"
        try:
            spec, entries = self._map(name)
            self._check_key(name, spec, key)
            if key not in entries:
                raise _refuse(errno.ENOENT, f"{name}: key {key.hex()}")
        except OSError:
            self.sent.append("! " + line)
            raise
        self.sent.append(line)
        del entries[key]

    def lookup(self, name: str, key: bytes) -> bytes:
        """The value of ``key`` (BPF_MAP_LOOKUP_ELEM); a use, for an LRU map."""
        spec, entries = self._map(name)
        self._check_key(name, spec, key)
        value = entries.get(key)
        if value is None:
            raise _refuse(errno.ENOENT, f"{name}: key {key.hex()}")
        if spec.type == "lru_hash":
            entries[key] = entries.pop(key)
        return value

    def dump(self, name: str) -> dict[bytes, bytes]:
        """Every entry of the map (BPF_MAP_GET_NEXT_KEY and lookups), as a new dictionary."""
        return dict(self._map(name)[1])

    def transact(self, text: str) -> None:
        """One nftables transaction of the node (``nft -f``)."""
        self.transactions.append(text)
        for line in text.splitlines():
            words = line.split()
            if words[:1] == ["table"] and len(words) >= 3:
                self.present.add((words[1], words[2]))
            elif words[:2] == ["delete", "table"] and len(words) == 4:
                self.present.discard((words[2], words[3]))

    def tables(self) -> list[tuple[str, str]]:
        """The (family, name) of every table the transactions left."""
        return sorted(self.present)

    def nat_flows(self, families: Iterable[str]) -> bool:
        """``holds_nat_flows`` (conntrack is not modelled)."""
        return self.holds_nat_flows
