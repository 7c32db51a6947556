"""Memory under churn: the daemon's RSS over a long run, which must be flat after warm-up.

Runs the real daemon (`kubeplex run` from the virtualenv) in a throw-away network namespace
per mode, against the test API server (tests/apiserver: the real list/watch protocol) holding
500 Services x 10 endpoints. Every 200 ms one EndpointSlice changes (an endpoint's address,
with a `last-change-trigger-time`, as the EndpointSlice controller writes it); syncPeriod is
2 s, so a full resync runs every 2 s between the partial ones, and configSyncPeriod 2m (each
relist of the API source replaces every object: a step in RSS the first time, so the run sees
a dozen rather than upstream's one every 15 minutes, half-way). Every 10 s the daemon's VmRSS
is sampled from /proc/PID/status.

Prints the series; the RSS after the first sync, at the end of the warm-up (--warmup) and at
the end; and over the second half, the least-squares slope (KB/min) of the per-minute floor
(the lowest sample of each minute: a sample that lands in a full sync sees that sync's
transient megabytes, a leak raises the floor), with the slope of all samples alongside.
Verdict: flat if the floor's slope stays under --threshold.

Why 60 KB/min by default: the leak this bench found (cycles kept by gc.freeze(), ~2.6 KB per
sync) grew ~150 KB/min at the soak's rate of about one sync a second, ~9 MB an hour. In 15
minutes 60 KB/min is under 1 MB, what the allocator's high-water marks move RSS by anyway;
the slope's standard error is printed so a run can tell noise from a trend.

--trace runs the daemon with tracemalloc from the end of the warm-up on and writes, every
--trace-every seconds, the allocation sites of what was allocated since and is still alive,
with the collector's counts (live and frozen objects), to FILE.<mode>: where the growth goes.

Usage (root): python bench/soak.py [--mode iptables|nftables|both] [--duration 1800]
              [--source api|manifests] [--services 500] [--warmup 120] [--trace FILE]
              [--logs DIR]
Both modes at once share one API server (the same churn reaches both daemons). The source
"manifests" is a folder of one file per object, a change rewriting one slice's file (the
manifests source applies changes once the folder is quiet: under this churn, mostly full
syncs). Ctrl-C
or SIGTERM stop it early: the daemons are stopped and their namespaces deleted either way.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from common import NODE, Netns, cluster, config, endpoint_ip, installed_env

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from apiserver import KUBE_PROXY_PERMISSIONS, FakeApiServer  # noqa: E402

KUBEPLEX = Path(sys.executable).parent / "kubeplex"
NODE_OBJECT: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}},
    "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.2"}]},
}

#: Runs the CLI under tracemalloc; a thread appends the growth since the warm-up to a file.
TRACED = """
import gc, signal, sys, threading, time, tracemalloc
from kubeplex.core.cli.main import main
out, warmup, every = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
def report():
    # Tracing from the warm-up's end on: what a snapshot holds then is what stayed since.
    time.sleep(warmup)
    tracemalloc.start(6)
    while True:
        time.sleep(every)
        snap = tracemalloc.take_snapshot()
        with open(out, "a") as f:
            print(f"== t+{time.monotonic() - start:.0f}s alive since warm-up"
                  f" {tracemalloc.get_traced_memory()[0] >> 10} KiB, gc objects"
                  f" {len(gc.get_objects())}, frozen {gc.get_freeze_count()}", file=f)
            for stat in snap.statistics("traceback")[:12]:
                print(f"{stat.size >> 10:8d} KiB {stat.count:8d} blocks", file=f)
                for line in stat.traceback.format()[-6:]:
                    print("    " + line, file=f)
def frozen_garbage(*_):
    # Run at the end (SIGUSR1): the garbage the collector finds once the frozen objects are
    # back in its generations, by type (sizes without what the objects merely refer to).
    frozen = gc.get_freeze_count()
    gc.unfreeze()
    gc.set_debug(gc.DEBUG_SAVEALL)
    gc.collect()
    types = {}
    for obj in gc.garbage:
        n, size = types.get(type(obj).__name__, (0, 0))
        types[type(obj).__name__] = (n + 1, size + sys.getsizeof(obj))
    with open(out, "a") as f:
        total = sum(size for _, size in types.values())
        print(f"== at the end: {frozen} frozen objects; garbage in cycles:"
              f" {len(gc.garbage)} objects, {total >> 10} KiB", file=f)
        for name, (n, size) in sorted(types.items(), key=lambda kv: -kv[1][1])[:12]:
            print(f"{size >> 10:8d} KiB {n:8d} {name}", file=f)
start = time.monotonic()
signal.signal(signal.SIGUSR1, frozen_garbage)
threading.Thread(target=report, daemon=True).start()
sys.exit(main(sys.argv[4:]))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


@dataclass
class Daemon:
    mode: str
    proc: subprocess.Popen[bytes]
    log: Path
    samples: list[tuple[float, int]] = field(default_factory=list)
    #: Seconds into the run of the first sample after the first sync (None: not synced yet).
    first_synced: float | None = None

    def sample(self, t: float) -> int:
        self.samples.append((t, rss_kb(self.proc.pid)))
        if self.first_synced is None and "synced " in self.log.read_text():
            self.first_synced = t
        return self.samples[-1][1]


def daemon_config(mode: str, feed: ApiFeed | ManifestFeed, args: argparse.Namespace) -> str:
    section = "iptables" if mode == "iptables" else "nftables"
    min_sync = args.min_sync_period
    return (
        config(mode)
        + feed.source_config()
        + (
            f"configSyncPeriod: {args.config_sync_period}\n"
            f"healthzBindAddress: 127.0.0.1:{free_port()}\n"
            f"metricsBindAddress: 127.0.0.1:{free_port()}\n"
            f"{section}:\n  syncPeriod: 2s\n  minSyncPeriod: {min_sync}\n"
        )
    )


@contextmanager
def daemon(
    mode: str,
    work: Path,
    feed: ApiFeed | ManifestFeed,
    args: argparse.Namespace,
    env: dict[str, str],
) -> Iterator[Daemon]:
    cfg = work / f"config-{mode}.yaml"
    cfg.write_text(daemon_config(mode, feed, args))
    with Netns() as ns:
        argv = ["run", "--config", str(cfg), *feed.source_args(), "--netns", ns, "-v", "1"]
        if args.trace:
            trace = f"{args.trace}.{mode}"
            Path(trace).write_text("")
            cmd = [sys.executable, "-c", TRACED, trace, str(args.warmup), str(args.trace_every)]
        else:
            cmd = [str(KUBEPLEX)]
        log = work / f"daemon-{mode}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen([*cmd, *argv], stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            yield Daemon(mode, proc, log)
        finally:
            if args.trace and proc.poll() is None:
                proc.send_signal(signal.SIGUSR1)  # the frozen-garbage count, then stop
                time.sleep(5)
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def trigger_time() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def churned(es: dict[str, Any], i: int, step: int, n: int) -> dict[str, Any]:
    """Slice ``i`` at change ``step``: its first endpoint moves between two addresses (every
    slice moves away in the first round over the slices, and back in the next)."""
    moved = 1 - (step // n) % 2
    es["endpoints"][0]["addresses"] = [endpoint_ip(i * 10 + moved * 7_919_000)]
    meta = es["metadata"]
    meta.setdefault("annotations", {})["endpoints.kubernetes.io/last-change-trigger-time"] = (
        trigger_time()
    )
    return es


class ApiFeed:
    """The cluster in the test API server; a change is an EndpointSlice update (a watch event)."""

    def __init__(self, objs: list[dict[str, Any]], stack: ExitStack, work: Path) -> None:
        self.srv = FakeApiServer(authorizer=set(KUBE_PROXY_PERMISSIONS), bookmark_interval=5)
        self.srv.start()
        stack.callback(self.srv.stop)
        for obj in [NODE_OBJECT, *objs]:
            self.srv.create(obj["kind"], obj)
        self.slices = [
            self.srv.get("EndpointSlice", o["metadata"]["name"], namespace="bench")
            for o in objs
            if o["kind"] == "EndpointSlice"
        ]
        self.kubeconfig = self.srv.write_kubeconfig(work / "kubeconfig")

    def source_config(self) -> str:
        return f"clientConnection:\n  kubeconfig: {self.kubeconfig}\n"

    def source_args(self) -> list[str]:
        return []

    def change(self, step: int) -> None:
        i = step % len(self.slices)
        self.srv.update("EndpointSlice", churned(self.slices[i], i, step, len(self.slices)))


class ManifestFeed:
    """The cluster as a folder, one file per object; a change rewrites one slice's file (the
    daemon polls the folder every second)."""

    def __init__(self, objs: list[dict[str, Any]], stack: ExitStack, work: Path) -> None:
        self.folder = work / "manifests"
        self.folder.mkdir()
        self.slices: list[tuple[Path, dict[str, Any]]] = []
        for k, obj in enumerate([NODE_OBJECT, *objs]):
            file = self.folder / f"{k:05d}.json"
            file.write_text(json.dumps(obj))
            if obj["kind"] == "EndpointSlice":
                self.slices.append((file, obj))

    def source_config(self) -> str:
        return ""

    def source_args(self) -> list[str]:
        return ["--manifests", str(self.folder)]

    def change(self, step: int) -> None:
        i = step % len(self.slices)
        file, es = self.slices[i]
        churned(es, i, step, len(self.slices))
        tmp = file.with_suffix(".tmp")  # whole files only: the daemon never reads half of one
        tmp.write_text(json.dumps(es))
        tmp.rename(file)


def slope_kb_per_min(samples: list[tuple[float, int]]) -> tuple[float, float]:
    """Least-squares slope of RSS over time (KB/min), and its standard error."""
    ts = [t / 60 for t, _ in samples]
    ys = [float(r) for _, r in samples]
    if len(ts) < 3:
        return 0.0, float("inf")
    tm, ym = statistics.fmean(ts), statistics.fmean(ys)
    sxx = sum((t - tm) ** 2 for t in ts)
    slope = sum((t - tm) * (y - ym) for t, y in zip(ts, ys, strict=True)) / sxx
    resid = [y - (ym + slope * (t - tm)) for t, y in zip(ts, ys, strict=True)]
    se = (sum(r * r for r in resid) / (len(ts) - 2) / sxx) ** 0.5
    return slope, se


def at(samples: list[tuple[float, int]], t: float) -> int:
    """The first sample at or after ``t`` seconds."""
    return next((r for s, r in samples if s >= t), samples[-1][1])


def floors(samples: list[tuple[float, int]], window: float) -> list[tuple[float, int]]:
    """The lowest sample of each ``window`` seconds: what the daemon keeps between syncs.

    A sample that lands in a sync sees that sync's transient allocations (megabytes for a full
    render); a leak raises the floor, a busy moment only a sample.
    """
    groups: dict[int, list[tuple[float, int]]] = {}
    for t, r in samples:
        groups.setdefault(int(t // window), []).append((t, r))
    return [min(g, key=lambda x: x[1]) for g in groups.values()]


def report(d: Daemon, args: argparse.Namespace) -> bool:
    s = d.samples
    if not s:
        print(f"[{d.mode}] no samples", flush=True)
        return False
    half = [x for x in s if x[0] >= s[-1][0] / 2]
    raw, raw_se = slope_kb_per_min(half)
    minutes = floors(half, 60)
    slope, se = slope_kb_per_min(minutes)
    flat = len(minutes) >= 3 and slope < float(args.threshold)
    verdict = "flat" if flat else "RISING" if len(minutes) >= 3 else "too short to tell"
    start = at(s, d.first_synced if d.first_synced is not None else 0)
    last = [r for _, r in half]
    print(
        f"[{d.mode}] RSS after the first sync {start / 1024:.1f} MB, at the warm-up end"
        f" ({args.warmup:.0f} s) {at(s, args.warmup) / 1024:.1f} MB, at the end"
        f" ({s[-1][0]:.0f} s) {s[-1][1] / 1024:.1f} MB; second half"
        f" {min(last) / 1024:.1f}-{max(last) / 1024:.1f} MB, slope of the per-minute floor"
        f" {slope:+.1f} KB/min (s.e. {se:.1f}; all samples {raw:+.1f}, s.e. {raw_se:.1f})"
        f" -> {verdict} (threshold {args.threshold:.0f} KB/min)",
        flush=True,
    )
    return flat


def soak(args: argparse.Namespace) -> bool:
    modes = ["iptables", "nftables"] if args.mode == "both" else [args.mode]
    env = installed_env()
    # The daemons (in the stack) stop before their folder goes.
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        work = Path(tmp)
        feed = (ApiFeed if args.source == "api" else ManifestFeed)(
            cluster(args.services), stack, work
        )
        daemons = [stack.enter_context(daemon(m, work, feed, args, env)) for m in modes]
        started = time.monotonic()
        next_sample = started
        step = 0
        print(
            f"soak: {args.services} Services from the {args.source} source, an EndpointSlice"
            " change every"
            f" {args.interval * 1000:.0f} ms, syncPeriod 2 s, {args.duration:.0f} s;"
            f" modes {', '.join(modes)}; pids {', '.join(str(d.proc.pid) for d in daemons)}",
            flush=True,
        )
        while (now := time.monotonic()) < started + args.duration:
            for d in daemons:
                if d.proc.poll() is not None:
                    log = d.log.read_text()[-3000:]
                    raise SystemExit(f"[{d.mode}] daemon exited ({d.proc.returncode}):\n{log}")
            if now >= next_sample:
                line = [f"t={now - started:6.0f}s"]
                for d in daemons:
                    line.append(f"{d.mode} {d.sample(now - started):7d} KB")
                print("  ".join(line), flush=True)
                next_sample += args.sample_every
            feed.change(step)
            step += 1
            time.sleep(max(0.0, started + step * args.interval - time.monotonic()))
        for d in daemons:
            log = d.log.read_text()
            full, partial = log.count("rules (full)"), log.count("rules (partial)")
            failed = log.count("sync failed")
            print(
                f"[{d.mode}] {step} slice changes; syncs: {full} full, {partial} partial,"
                f" {failed} failed"
            )
            if args.logs:
                Path(args.logs, f"daemon-{d.mode}.log").write_text(log)
        return all([report(d, args) for d in daemons])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=("iptables", "nftables", "both"), default="both")
    p.add_argument("--duration", type=float, default=1800, help="seconds (default 1800)")
    p.add_argument("--services", type=int, default=500)
    p.add_argument("--source", choices=("api", "manifests"), default="api")
    p.add_argument("--interval", type=float, default=0.2, help="seconds between slice changes")
    p.add_argument("--min-sync-period", default="1s", help="the daemon's minSyncPeriod")
    p.add_argument(
        "--config-sync-period",
        default="2m",
        help="the daemon's relist period (default 2m: a relist is a step in RSS, so the run"
        " sees many, the warm-up included, rather than upstream's one every 15m)",
    )
    p.add_argument("--warmup", type=float, default=120, help="seconds")
    p.add_argument("--sample-every", type=float, default=10, help="seconds")
    p.add_argument("--threshold", type=float, default=60, help="KB/min above which RSS rises")
    p.add_argument("--logs", metavar="DIR", help="keep the daemons' logs in DIR")
    p.add_argument("--trace", metavar="FILE", help="tracemalloc growth report per mode")
    p.add_argument("--trace-every", type=float, default=60, help="seconds")
    args = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (network namespaces)")
    # Ctrl-C and kill both unwind through the context managers: daemons stopped, netns gone.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started in background
    try:
        ok = soak(args)
    except KeyboardInterrupt:
        sys.exit("interrupted: daemons stopped, namespaces deleted")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
