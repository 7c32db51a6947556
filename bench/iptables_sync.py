"""iptables mode: sync times and memory at 1,000 and 10,000 Services x 10 endpoints.

Prints, for each size, in one run (root; everything happens in a throw-away network namespace):
* floor: `iptables-restore --noflush` alone loading the full ruleset into an empty namespace;
* `kubeplex run --once` as a whole (process start, manifest load, render, restore), and its
  ratio to the floor (target <= 1.25 at 1,000 Services);
* in-process full render time (target < 1 s at 10,000), and a one-endpoint partial sync
  (render + restore, target < 50 ms at 10,000);
* peak RSS of the `run --once` process (should grow linearly with the cluster);
* the kernel's floor for any partial sync: one jump rule appended to the populated nat table
  (the nf_tables commit validates the table, so this grows with the cluster whatever the tool).

Usage: python bench/iptables_sync.py [--sizes 1000,10000] [--repeat 3]
"""

from __future__ import annotations

import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from common import NODE, Netns, Workspace, bench_sizes, cluster, installed_env, timed

from kubeplex.backends.iptables import IptablesBackend
from kubeplex.core.daemon.proxier import Proxier, collector_paused
from kubeplex.core.dataplane.backend import BackendContext
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.sources.manifests import ManifestSource


def bench_size(n: int, repeat: int, work: Path, floor_max: int) -> dict[str, Any]:
    ws = Workspace.create(work, n, "iptables")
    cfg = ws.config

    # The ruleset kubeplex would load, as iptables-restore input (IPv4 only, like the floor).
    state = ClusterState(NODE)
    ManifestSource(ws.folder, state).load()
    backend = IptablesBackend(BackendContext(cfg, NODE, families=state.families[:1]))
    snapshot = state.checkout(full=True)
    with collector_paused():  # as the daemon renders
        t0 = time.perf_counter()
        rendered = backend.render(snapshot)
        full_render = time.perf_counter() - t0
    ruleset = rendered.plans[0].restore_input()
    rules = ruleset.count("\n-A ")

    floors: list[float] = []
    runs: list[float] = []
    rss_kb = 0
    env = installed_env()
    for _ in range(repeat):
        # One iptables-restore input of 10,000 Services takes tens of minutes here.
        if n <= floor_max:
            with Netns() as ns:
                # The ruleset's nfacct matches need their counters, as kubeplex creates them.
                for counter in ("localhost_nps_accepted_pkts", "ct_state_invalid_dropped_pkts"):
                    subprocess.run(
                        ["ip", "netns", "exec", ns, "nfacct", "add", counter], check=True
                    )
                floors.append(
                    timed(
                        ["ip", "netns", "exec", ns, "iptables-restore", "--noflush", "--wait", "5"],
                        ruleset,
                    )
                )
        with Netns() as ns:
            seconds, rss = ws.run_once(ns, env)
            runs.append(seconds)
            rss_kb = max(rss_kb, rss)

    # Partial sync: program a namespace in-process, then change one endpoint of one Service.
    with Netns() as ns:
        state = ClusterState(NODE, families=state.families[:1])
        source = ManifestSource(ws.folder, state)
        source.load()
        backend = IptablesBackend(BackendContext(cfg, NODE, families=state.families, netns=ns))
        backend.prepare()
        proxier = Proxier(state, backend)
        assert proxier.sync(full=True)
        partials, partial_renders = [], []
        # The kernel's part: one jump rule appended to the populated nat table, by any tool.
        probe = ["ip", "netns", "exec", ns, "iptables", "-t", "nat"]
        subprocess.run([*probe, "-N", "KUBEPLEX-PROBE"], check=True)
        one_rule = timed([*probe, "-A", "KUBEPLEX-PROBE", "-j", "RETURN"])
        subprocess.run([*probe, "-F", "KUBEPLEX-PROBE"], check=True)
        subprocess.run([*probe, "-X", "KUBEPLEX-PROBE"], check=True)
        for version in range(1, repeat + 2):
            changed = cluster(1, version=version)[1]
            state.set_endpoint_slice(changed)
            with collector_paused():
                t0 = time.perf_counter()
                r = backend.render(state.checkout())
                t1 = time.perf_counter()
                backend.apply(r)
                t2 = time.perf_counter()
            assert not r.full
            partial_renders.append(t1 - t0)
            partials.append(t2 - t0)
    return {
        "services": n,
        "rules": rules,
        "floor_s": statistics.median(floors) if floors else float("nan"),
        "run_once_s": statistics.median(runs),
        "ratio": statistics.median(runs) / statistics.median(floors) if floors else float("nan"),
        "full_render_s": full_render,
        "partial_sync_ms": statistics.median(partials) * 1000,
        "partial_render_ms": statistics.median(partial_renders) * 1000,
        "one_rule_ms": one_rule * 1000,
        "peak_rss_mb": rss_kb / 1024,
    }


def report(r: dict[str, Any]) -> str:
    return (
        f"{r['services']:>6} services {r['rules']:>7} rules"
        f" | restore floor {r['floor_s']:.3f} s"
        f" | run --once {r['run_once_s']:.3f} s (x{r['ratio']:.2f})"
        f" | full render {r['full_render_s']:.3f} s"
        f" | 1-endpoint partial sync {r['partial_sync_ms']:.1f} ms"
        f" (render {r['partial_render_ms']:.1f} ms;"
        f" kernel floor: one rule {r['one_rule_ms']:.1f} ms)"
        f" | peak RSS {r['peak_rss_mb']:.0f} MB"
    )


def main() -> None:
    bench_sizes(
        bench_size,
        report,
        "--floor-max",
        "measure the one-input iptables-restore floor only up to this many Services",
    )


if __name__ == "__main__":
    main()
