"""FakeEbpfMaps against the real pinned maps: the same updates, deletes, lookups and dumps go
to a loader-made set of maps in a bpffs of the test's own (through the mode's ``PinnedMaps``
seam) and to the fake, and every outcome (the value, or the errno) is compared
(tests/unit/test_ebpf_fake.py pins the fake's behaviour without root)."""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterator
from ipaddress import ip_address

import pytest
from kits.ebpf_kit import own_bpffs, own_cgroup, own_loader

from kubeplex.backends.ebpf import layout
from kubeplex.backends.ebpf.maps import PinnedMaps
from kubeplex.testing.fakes import FakeEbpfMaps
from kubeplex.testing.fakes.ebpf import EXIST, NOEXIST

pytestmark = pytest.mark.kernel

Seam = PinnedMaps | FakeEbpfMaps
#: One step: a call on a seam; its outcome is what it returns, or the errno it raised.
Step = Callable[[Seam], object]


@pytest.fixture
def kernel() -> Iterator[PinnedMaps]:
    with own_bpffs() as bpffs, own_cgroup() as cgroup, own_loader(bpffs) as loader:
        seam = PinnedMaps(loader.start(cgroup).maps)
        try:
            yield seam
        finally:
            seam.close()


def outcome(step: Step, seam: Seam) -> object:
    try:
        return step(seam)
    except OSError as exc:
        return ("errno", exc.errno)


SVC = layout.svc_key(ip_address("10.96.0.10"), 80, layout.PROTO_TCP)
SVC_B = layout.svc_key(ip_address("10.96.0.11"), 53, layout.PROTO_UDP)
SVC6 = layout.svc_key(ip_address("fd00:96::10"), 443, layout.PROTO_TCP)
SLOT0, SLOT1 = layout.backend_key(7, 0), layout.backend_key(7, 1)
BACKEND = layout.backend_value(ip_address("10.244.1.5"), 8080)
BACKEND6 = layout.backend_value(ip_address("fd00:244::5"), 8443)
REVNAT = layout.REVNAT4_KEY.pack(1, bytes(4), b"\0\x50")
AFFINITY = layout.AFFINITY_KEY.pack(3, 7)

STEPS: list[Step] = [
    lambda s: s.update("kpx_svc4", SVC, layout.svc_value(7, 2)),
    lambda s: s.update("kpx_svc4", SVC_B, layout.svc_value(8, 0)),
    lambda s: s.update("kpx_svc6", SVC6, layout.svc_value(9, 1, layout.FLAG_AFFINITY, 30)),
    lambda s: s.update("kpx_backends", SLOT0, BACKEND),
    lambda s: s.update("kpx_backends", SLOT1, BACKEND6),
    lambda s: s.lookup("kpx_svc4", SVC),
    lambda s: s.update("kpx_svc4", SVC, layout.svc_value(7, 1)),  # overwrite
    lambda s: s.update("kpx_svc4", SVC, layout.svc_value(7, 3), NOEXIST),
    lambda s: s.update("kpx_svc4", SVC6[:8], layout.svc_value(7, 3), EXIST),
    lambda s: s.update("kpx_svc4", SVC, layout.svc_value(7, 4), EXIST),
    lambda s: s.update("kpx_backends", SLOT0, BACKEND, 8),  # no such flag
    lambda s: s.delete("kpx_backends", SLOT1),
    lambda s: s.delete("kpx_backends", SLOT1),  # no longer there
    lambda s: s.lookup("kpx_backends", SLOT1),
    lambda s: s.delete("kpx_svc4", SVC_B),
    lambda s: s.update("kpx_svc4", SVC6, layout.svc_value(1, 1)),  # a key of the wrong size
    lambda s: s.update("kpx_svc4", SVC, BACKEND),  # a value of the wrong size
    lambda s: s.delete("kpx_svc6", SVC),
    lambda s: s.update("kpx_nope", SVC, BACKEND),
    lambda s: s.dump("kpx_nope"),
    lambda s: s.update("kpx_revnat4", REVNAT, layout.REVNAT4_VALUE.pack(bytes(4), b"\0\x50")),
    lambda s: s.update("kpx_affinity", AFFINITY, layout.AFFINITY_VALUE.pack(bytes(16), b"\0P", 5)),
    lambda s: s.update(
        "kpx_slots", layout.SLOT_KEY.pack(9, b"\0P", bytes(16)), layout.slot_value(1)
    ),
    lambda s: s.update("kpx_slots", layout.SLOT_KEY.pack(9, b"\0P", bytes(16)), b"\0"),
    lambda s: s.lookup("kpx_affinity", AFFINITY),
    lambda s: s.delete("kpx_revnat4", REVNAT),
]


def test_the_same_steps_have_the_same_outcomes_and_leave_the_same_maps(
    kernel: PinnedMaps,
) -> None:
    fake = FakeEbpfMaps()
    real = [outcome(step, kernel) for step in STEPS]
    assert real == [outcome(step, fake) for step in STEPS]
    # What could differ is there: refusals of each kind, and values read back.
    assert {r[1] for r in real if isinstance(r, tuple)} == {
        errno.EEXIST,
        errno.ENOENT,
        errno.EINVAL,
    }
    assert layout.svc_value(7, 2) in real
    for m in layout.MAPS:
        assert kernel.dump(m.name) == fake.dump(m.name), m.name


def _fill(seam: Seam, name: str, count: int, value: bytes) -> None:
    for n in range(count):
        seam.update(
            name,
            layout.AFFINITY_KEY.pack(n, n)
            if name == "kpx_affinity"
            else layout.BACKEND_KEY.pack(n >> 16, n & 0xFFFF),
            value,
        )


def test_a_full_hash_map_refuses_a_new_key_but_takes_an_overwrite(kernel: PinnedMaps) -> None:
    fake, name = FakeEbpfMaps(), layout.BACKENDS.name
    for seam in (kernel, fake):
        _fill(seam, name, layout.BACKENDS.max_entries, BACKEND)
    new = layout.backend_key(0xFFFFFFFF, 0)
    steps: list[Step] = [
        lambda s: s.update(name, new, BACKEND),
        lambda s: s.update(name, layout.backend_key(0, 5), BACKEND6),
        lambda s: s.delete(name, layout.backend_key(0, 6)),
        lambda s: s.update(name, new, BACKEND),
        lambda s: len(s.dump(name)),
    ]
    real = [outcome(step, kernel) for step in steps]
    assert real == [outcome(step, fake) for step in steps]
    assert real[0] == ("errno", errno.E2BIG)
    assert real[-1] == layout.BACKENDS.max_entries


def test_a_full_lru_map_evicts_to_take_a_new_key(kernel: PinnedMaps) -> None:
    """The kernel's LRU is approximate (per-CPU lists, eviction in batches): which entries go
    and how many is not something to compare; that the new key is taken and the map stays
    within its size is."""
    fake, name = FakeEbpfMaps(), layout.AFFINITY.name
    value = layout.AFFINITY_VALUE.pack(bytes(16), b"\0\x50", 1)
    new = layout.AFFINITY_KEY.pack(1 << 40, 0)
    for seam in (kernel, fake):
        _fill(seam, name, layout.AFFINITY.max_entries, value)
    for seam in (kernel, fake):
        seam.update(name, new, value)
        assert seam.lookup(name, new) == value
        assert 0 < len(seam.dump(name)) <= layout.AFFINITY.max_entries
