"""ebpf mode: sync times at 1,000 and 10,000 Services x 10 endpoints, against the map-update floor.

Prints, for each size, in one run (root; the programs are attached to a cgroup2 folder of the
bench's own, never the node's root cgroup, the maps pinned on bpffs mounts of its own, and the
mode's nftables table for entry points reached from other hosts written in a throw-away
network namespace):
* the first full sync after a start, into empty pinned maps: the dump of the maps, the
  render (graph to map operations) and the apply (one bpf(2) update per operation, and the
  nftables transaction of the entry points), each timed, and their total (median of
  --repeat starts, each on a fresh bpffs);
* a periodic full sync with nothing changed (dump, render, diff: no operation sent);
* a one-endpoint partial sync (render + apply of the changed Service's entries, median of
  several), and the operations it sent;
* the floors, with the same entries written into empty pinned maps: `bpftool batch file`
  (one `map update pinned ...` line per entry: what a shell script of bpftool would cost),
  a bare loop of bpf_map_update_elem through libbpf (the same syscalls, no render), and
  bpf_map_update_batch (one syscall per map: the kernel's own cost); the one-endpoint change
  through bpftool as well. The maps must hold the same entries after the sync and the floors.

Usage: python bench/ebpf_sync.py [--sizes 1000,10000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from common import NODE, Netns, cluster
from common import config as config_text

from kubeplex.backends.ebpf import EbpfBackend, libbpf
from kubeplex.backends.ebpf.layout import PIN_FOLDER
from kubeplex.backends.ebpf.loader import Loader
from kubeplex.backends.ebpf.plan import RENDERED_MAPS, EbpfPlan, MapOp
from kubeplex.core.config.kubeproxy import parse_config
from kubeplex.core.daemon.proxier import collector_paused
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import BackendContext
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.types import IPFamily
from kubeplex.testing.labkernel import scratch_bpffs, scratch_cgroup


@contextmanager
def own_bpffs() -> Iterator[Path]:
    """A bpffs mount of the bench's own; whatever the mode pinned there is removed first."""
    with scratch_bpffs("kpx-bench-bpffs-") as folder:
        try:
            yield folder
        finally:
            Loader(folder).cleanup()


def backend_on(bpffs: Path, cgroup: Path, ns: str) -> EbpfBackend:
    """The mode's backend, attached to ``cgroup`` and pinned on ``bpffs``; its nftables table
    for the entry points reached from other hosts goes into the namespace ``ns``."""
    cfg = parse_config(config_text("ebpf"), "bench", plugins.known_modes())
    options = {"bpffs": str(bpffs), "cgroup": str(cgroup)}
    ctx = BackendContext(cfg, NODE, families=(IPFamily.IPv4,), netns=ns)
    backend = EbpfBackend(ctx, options)
    backend.prepare()
    return backend


def cluster_state(n: int) -> ClusterState:
    state = ClusterState(NODE, families=(IPFamily.IPv4,))
    for obj in cluster(n):
        if obj["kind"] == "Service":
            state.set_service(obj)
        elif obj["kind"] == "EndpointSlice":
            state.set_endpoint_slice(obj)
        else:
            state.set_service_cidr(obj)
    return state


def held(bpffs: Path) -> dict[str, dict[bytes, bytes]]:
    """What the pinned maps the render writes hold."""
    maps = Loader(bpffs).open_maps()
    try:
        return {name: dict(maps[name].items()) for name in RENDERED_MAPS}
    finally:
        for opened in maps.values():
            opened.close()


def bpftool_batch(bpffs: Path, ops: Sequence[MapOp], work: Path) -> float:
    """Seconds `bpftool batch file` takes to send ``ops``, one line each."""
    pins = bpffs / PIN_FOLDER
    lines = []
    for op in ops:
        key = f"pinned {pins / op.map} key hex {op.key.hex(' ')}"
        if op.value is None:
            lines.append(f"map delete {key}\n")
        else:
            lines.append(f"map update {key} value hex {op.value.hex(' ')}\n")
    batch = work / "batch.txt"
    batch.write_text("".join(lines))
    t0 = time.perf_counter()
    subprocess.run(["bpftool", "batch", "file", str(batch)], check=True, capture_output=True)
    return time.perf_counter() - t0


def update_loop(bpffs: Path, ops: Sequence[MapOp]) -> float:
    """Seconds a bare loop of bpf_map_update_elem takes to write ``ops`` (fds opened before)."""
    maps = Loader(bpffs).open_maps()
    fds = {name: m.fd for name, m in maps.items()}
    pairs = [(fds[op.map], op.key, op.value or b"") for op in ops]
    try:
        t0 = time.perf_counter()
        for fd, key, value in pairs:
            libbpf.map_update(fd, key, value)
        return time.perf_counter() - t0
    finally:
        for opened in maps.values():
            opened.close()


def update_batch(bpffs: Path, ops: Sequence[MapOp]) -> float:
    """Seconds bpf_map_update_batch takes to write ``ops``: one call per map."""
    fn = libbpf.library().bpf_map_update_batch
    fn.restype = ctypes.c_int
    fn.argtypes = [
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_uint32),
        ctypes.c_void_p,
    ]
    maps = Loader(bpffs).open_maps()
    per_map: dict[str, tuple[bytes, bytes, int]] = {}
    for name in RENDERED_MAPS:
        mine = [op for op in ops if op.map == name]
        keys = b"".join(op.key for op in mine)
        values = b"".join(op.value or b"" for op in mine)
        per_map[name] = (keys, values, len(mine))
    try:
        t0 = time.perf_counter()
        for name, (keys, values, count) in per_map.items():
            if not count:
                continue
            done = ctypes.c_uint32(count)
            rc = fn(maps[name].fd, keys, values, ctypes.byref(done), None)
            if rc < 0 or done.value != count:
                raise OSError(-rc, f"bpf_map_update_batch {name}: {done.value} of {count}")
        return time.perf_counter() - t0
    finally:
        for opened in maps.values():
            opened.close()


def timed_sync(backend: EbpfBackend, state: ClusterState, full: bool) -> dict[str, Any]:
    """One sync as the daemon runs it (checkout, observe, render, apply), each step timed."""
    with collector_paused():
        t0 = time.perf_counter()
        checkout = state.checkout(full=full)
        observed = backend.observe(checkout)
        t1 = time.perf_counter()
        plan = backend.render(checkout, observed)
        t2 = time.perf_counter()
        backend.apply(plan)
        t3 = time.perf_counter()
    assert plan.full == full and not plan.left_out, plan.left_out
    return {"read": t1 - t0, "render": t2 - t1, "apply": t3 - t2, "total": t3 - t0, "plan": plan}


def median(runs: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in runs))


def bench_size(n: int, repeat: int, work: Path) -> dict[str, Any]:
    state = cluster_state(n)
    firsts: list[dict[str, Any]] = []
    with scratch_cgroup("kpx-bench") as cgroup, Netns() as ns:
        for i in range(repeat):
            with own_bpffs() as bpffs:
                backend = backend_on(bpffs, cgroup, ns)
                firsts.append(timed_sync(backend, state, full=True))
                if i < repeat - 1:
                    backend.cleanup()
                    continue
                full_plan: EbpfPlan = firsts[-1]["plan"]
                desired = {name: dict(m) for name, m in backend.renderer.desired.items()}
                assert held(bpffs) == desired
                periodic = [timed_sync(backend, state, full=True) for _ in range(repeat)]
                assert all(not r["plan"].ops for r in periodic)
                partials = []
                for version in range(1, max(repeat, 5) + 2):
                    state.set_endpoint_slice(cluster(1, version=version)[1])
                    partials.append(timed_sync(backend, state, full=False))
                partial_ops = partials[-1]["plan"].ops
                with tempfile.TemporaryDirectory(dir=work) as tmp:
                    bpftool_partial = bpftool_batch(bpffs, partial_ops, Path(tmp))
                backend.cleanup()
        # The floors: the first full sync's entries, written into empty maps.
        ops = full_plan.ops
        assert all(op.value is not None for op in ops)
        floors: dict[str, list[float]] = {"bpftool": [], "loop": [], "batch": []}
        for _ in range(repeat):
            for kind in floors:
                with own_bpffs() as bpffs:
                    backend = backend_on(bpffs, cgroup, ns)
                    backend.kernel.close()  # (the floor opens its own fds)
                    if kind == "bpftool":
                        floors[kind].append(bpftool_batch(bpffs, ops, work))
                    elif kind == "loop":
                        floors[kind].append(update_loop(bpffs, ops))
                    else:
                        floors[kind].append(update_batch(bpffs, ops))
                    assert held(bpffs) == desired, f"{kind} wrote other entries"
                    backend.cleanup()
    first_total = median(firsts, "total")
    bpftool_s = statistics.median(floors["bpftool"])
    return {
        "services": n,
        "entries": len(ops),
        "first_read_s": median(firsts, "read"),
        "first_render_s": median(firsts, "render"),
        "first_apply_s": median(firsts, "apply"),
        "first_total_s": first_total,
        "periodic_s": median(periodic, "total"),
        "periodic_read_s": median(periodic, "read"),
        "partial_ms": median(partials, "total") * 1000,
        "partial_render_ms": median(partials, "render") * 1000,
        "partial_apply_ms": median(partials, "apply") * 1000,
        "partial_ops": len(partial_ops),
        "bpftool_s": bpftool_s,
        "loop_s": statistics.median(floors["loop"]),
        "batch_s": statistics.median(floors["batch"]),
        "bpftool_partial_ms": bpftool_partial * 1000,
        "ratio_bpftool": first_total / bpftool_s,
        "ratio_apply_loop": median(firsts, "apply") / statistics.median(floors["loop"]),
    }


def report(r: dict[str, Any]) -> str:
    return (
        f"{r['services']:>6} services {r['entries']:>7} map entries"
        f" | first full sync {r['first_total_s']:.3f} s (dump {r['first_read_s']:.3f} s,"
        f" render {r['first_render_s']:.3f} s, apply {r['first_apply_s']:.3f} s)"
        f" | floors: bpftool batch {r['bpftool_s']:.3f} s (sync x{r['ratio_bpftool']:.2f}),"
        f" update loop {r['loop_s']:.3f} s (apply x{r['ratio_apply_loop']:.2f}),"
        f" update batch {r['batch_s']:.3f} s"
        f" | periodic full sync {r['periodic_s']:.3f} s (dump {r['periodic_read_s']:.3f} s)"
        f" | 1-endpoint partial sync {r['partial_ms']:.2f} ms"
        f" (render {r['partial_render_ms']:.2f} ms, apply {r['partial_apply_ms']:.2f} ms,"
        f" {r['partial_ops']} op; bpftool {r['bpftool_partial_ms']:.1f} ms)"
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="1000,10000")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (bpffs mounts, cgroup2 folders, bpf(2))")
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(s) for s in args.sizes.split(",")):
            line = report(bench_size(n, args.repeat, Path(tmp)))
            load = " ".join(f"{x:.2f}" for x in os.getloadavg())
            print(f"{line} | load average after: {load}", flush=True)


if __name__ == "__main__":
    main()
