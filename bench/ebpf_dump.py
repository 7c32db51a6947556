"""ebpf mode: the full sync's dump of the maps, key by key against batched, at 1,000 and 10,000
Services x 10 endpoints.

Prints, for each size (root; pinned on a bpffs of the bench's own, attached to a cgroup2 folder
of its own): the entries the full sync reads (every map it observes), the seconds a dump takes
key by key (BPF_MAP_GET_NEXT_KEY and BPF_MAP_LOOKUP_ELEM: two bpf(2) calls an entry) and in
batches (BPF_MAP_LOOKUP_BATCH, what ``PinnedMaps.dump`` does), median of --repeat, and checks
that both read the same entries.

Usage: python bench/ebpf_dump.py [--sizes 1000,10000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from ebpf_sync import backend_on, cluster_state, own_bpffs, own_cgroup

from kubeplex.backends.ebpf.maps import PinnedMaps
from kubeplex.backends.ebpf.plan import OBSERVED_MAPS

Dump = dict[str, dict[bytes, bytes]]


def key_by_key(maps: PinnedMaps) -> Dump:
    return {name: dict(maps.maps[name].items()) for name in OBSERVED_MAPS}


def batched(maps: PinnedMaps) -> Dump:
    return {name: maps.dump(name) for name in OBSERVED_MAPS}


def timed(dump: Callable[[PinnedMaps], Dump], maps: PinnedMaps, repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        dump(maps)
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"{'services':>9} {'entries':>8} {'key by key':>11} {'batched':>9} {'speed-up':>8}")
    for n in (int(s) for s in args.sizes.split(",")):
        state = cluster_state(n)
        with own_cgroup() as cgroup, own_bpffs() as bpffs:
            backend = backend_on(bpffs, cgroup)
            backend.sync(state.checkout(full=True))
            assert isinstance(backend.kernel, PinnedMaps)
            maps = backend.kernel
            assert key_by_key(maps) == batched(maps) and not maps.no_batch
            entries = sum(len(m) for m in batched(maps).values())
            slow = timed(key_by_key, maps, args.repeat)
            fast = timed(batched, maps, args.repeat)
            print(f"{n:>9,} {entries:>8,} {slow:>10.3f}s {fast:>8.3f}s {slow / fast:>7.1f}x")
            backend.cleanup()


if __name__ == "__main__":
    main()
