"""The pinned maps behind the render's ``MapSeam``: by map name, with the bpf syscall's errors
as ``OSError``, exactly as ``kubeplex.testing.fakes.FakeEbpfMaps`` (a kernel test holds the two
to each other).

The loader's ``BpfMap`` reports a missing key as None / False; the seam raises ENOENT as the
syscall does, so a plan's delete of an entry that is not there is an error in both. A key or
value of the wrong size is refused here with EINVAL: the syscall takes a pointer, not a length,
and would read past the buffer.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable, Mapping
from typing import ClassVar

from kubeplex.backends.ebpf import libbpf
from kubeplex.backends.ebpf.loader import BpfMap
from kubeplex.backends.netfilter import nft
from kubeplex.core.dataplane import execer
from kubeplex.core.model.errors import BackendError


def _refuse(code: int, what: str) -> OSError:
    return OSError(code, f"{what}: {os.strerror(code)}")


class PinnedMaps:
    """The ``MapSeam`` over the maps a loader opened, and the node's nftables (in ``netns``)
    for the tables of entry points from other hosts."""

    #: The methods apply writes through (the contract's ``writes``).
    writes: ClassVar[tuple[str, ...]] = ("update", "delete", "transact")

    def __init__(self, maps: Mapping[str, BpfMap], netns: str | None = None) -> None:
        self.maps = dict(maps)
        self.netns = netns
        #: The maps whose batch lookup was refused: dumped key by key.
        self.no_batch: set[str] = set()

    def _map(self, name: str) -> BpfMap:
        found = self.maps.get(name)
        if found is None:
            raise _refuse(errno.ENOENT, f"map {name!r} is not pinned")
        return found

    def _keyed(self, name: str, key: bytes) -> BpfMap:
        found = self._map(name)
        size = found.layout.key.size
        if len(key) != size:
            raise _refuse(errno.EINVAL, f"{name}: key of {len(key)} bytes, the map's are {size}")
        return found

    def update(self, name: str, key: bytes, value: bytes, flags: int = libbpf.BPF_ANY) -> None:
        """Write ``key`` -> ``value`` (BPF_MAP_UPDATE_ELEM with ``flags``)."""
        found = self._keyed(name, key)
        size = found.layout.value.size
        if len(value) != size:
            raise _refuse(
                errno.EINVAL, f"{name}: value of {len(value)} bytes, the map's are {size}"
            )
        libbpf.map_update(found.fd, key, value, flags)

    def delete(self, name: str, key: bytes) -> None:
        """Remove ``key``; ENOENT when it is not there."""
        if not self._keyed(name, key).delete(key):
            raise _refuse(errno.ENOENT, f"{name}: key {key.hex()}")

    def transact(self, text: str) -> None:
        """Commits ``text`` with ``nft -f`` in the node's namespace (BackendError if refused)."""
        nft.run_transaction(text, self.netns)

    def tables(self) -> list[tuple[str, str]]:
        return nft.tables(self.netns)

    def nat_flows(self, families: Iterable[str]) -> bool:
        """``conntrack -L --any-nat`` per family: any entry listed is a NATed flow."""
        for family in families:
            try:
                listed = execer.run(["conntrack", "-L", "-f", family, "--any-nat"], self.netns)
            except BackendError:
                return True  # unreadable: as if held, so their NAT is kept
            if listed.stdout.strip():
                return True
        return False

    def lookup(self, name: str, key: bytes) -> bytes:
        """The value of ``key``; ENOENT when it is not there."""
        value = self._keyed(name, key).lookup(key)
        if value is None:
            raise _refuse(errno.ENOENT, f"{name}: key {key.hex()}")
        return value

    def dump(self, name: str) -> dict[bytes, bytes]:
        """Every entry of the map, as a new dictionary: in batches of entries, one bpf(2)
        call each, or key by key (two calls an entry) where the kernel or the map type has
        no batch lookup."""
        found = self._map(name)
        if name not in self.no_batch:
            layout = found.layout
            try:
                return dict(libbpf.map_lookup_batch(found.fd, layout.key.size, layout.value.size))
            except libbpf.LibbpfError as err:
                if err.errno not in libbpf.BATCH_REFUSED:
                    raise
                self.no_batch.add(name)
        return dict(found.items())

    def close(self) -> None:
        for opened in self.maps.values():
            opened.close()
