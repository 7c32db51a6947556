"""FakeEbpfMaps holds to the bpf syscall's rules for hash and LRU hash maps, and its maps are
the ones the ebpf mode's layout declares (tests/kernel/test_ebpf_fake_kernel.py holds it to
the real pinned maps)."""

from __future__ import annotations

import errno

import pytest

from kubeplex.backends.ebpf import layout
from kubeplex.testing import fakes
from kubeplex.testing.fakes import FakeEbpfMaps
from kubeplex.testing.fakes.ebpf import EXIST, MAPS, NOEXIST, MapSpec


def test_its_maps_are_the_layouts() -> None:
    assert {
        name: (spec.key_size, spec.value_size, spec.max_entries) for name, spec in MAPS.items()
    } == {m.name: (m.key.size, m.value.size, m.max_entries) for m in layout.MAPS}
    assert {n for n, s in MAPS.items() if s.type == "lru_hash"} == {
        layout.REVNAT4.name,
        layout.REVNAT6.name,
        layout.AFFINITY.name,
    }


def test_for_mode_gives_a_fresh_one() -> None:
    one, two = fakes.for_mode("ebpf"), fakes.for_mode("ebpf")
    assert isinstance(one, FakeEbpfMaps) and one is not two


def _errno(call: object, *args: object) -> int:
    with pytest.raises(OSError) as err:
        call(*args)  # type: ignore[operator]
    return err.value.errno or 0


def test_update_lookup_delete_and_the_kernels_refusals() -> None:
    maps = FakeEbpfMaps()
    key = layout.backend_key(7, 0)
    value = layout.BACKEND_VALUE.pack(b"\x0a\0\0\x01".ljust(16, b"\0"), b"\0\x50", 4)
    maps.update("kpx_backends", key, value)
    assert maps.lookup("kpx_backends", key) == value
    assert maps.dump("kpx_backends") == {key: value}
    assert _errno(maps.update, "kpx_backends", key, value, NOEXIST) == errno.EEXIST
    assert _errno(maps.update, "kpx_backends", layout.backend_key(7, 1), value, EXIST) == (
        errno.ENOENT
    )
    assert _errno(maps.update, "kpx_backends", key, value, 9) == errno.EINVAL
    assert _errno(maps.update, "kpx_backends", key[:4], value) == errno.EINVAL
    assert _errno(maps.update, "kpx_backends", key, value + b"\0") == errno.EINVAL
    assert _errno(maps.update, "kpx_nothing", key, value) == errno.ENOENT
    maps.delete("kpx_backends", key)
    assert _errno(maps.delete, "kpx_backends", key) == errno.ENOENT
    assert _errno(maps.lookup, "kpx_backends", key) == errno.ENOENT
    assert maps.sent[0] == f"update kpx_backends {key.hex()} {value.hex()}"
    assert maps.sent[1].startswith("! update kpx_backends ")
    assert maps.sent[-2:] == [
        f"delete kpx_backends {key.hex()}",
        f"! delete kpx_backends {key.hex()}",
    ]


def test_a_full_hash_map_refuses_and_a_full_lru_map_evicts_the_least_recently_used() -> None:
    maps = FakeEbpfMaps({"h": MapSpec("hash", 1, 1, 2), "l": MapSpec("lru_hash", 1, 1, 2)})
    for name in ("h", "l"):
        maps.update(name, b"a", b"1")
        maps.update(name, b"b", b"2")
    maps.update("h", b"a", b"3")  # an existing key is not a new entry
    assert _errno(maps.update, "h", b"c", b"3") == errno.E2BIG
    assert maps.lookup("l", b"a") == b"1"  # a use: "b" is now the least recently used
    maps.update("l", b"c", b"3")
    assert maps.dump("l") == {b"a": b"1", b"c": b"3"}
