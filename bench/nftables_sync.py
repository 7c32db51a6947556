"""nftables mode: sync times and memory at 1,000 and 10,000 Services x 10 endpoints.

Prints, for each size, in one run (root; everything happens in throw-away network namespaces):
* floor: `nft -f` alone loading the same table (kubeplex's first transaction) into an empty
  namespace;
* `kubeplex run --once --proxy-mode nftables` as a whole (process start with compiled bytecode,
  manifest load, render, listing, the transactions over netlink), and its ratio to the floor
  (target <= 1.25 at 1,000 Services); nft must list the same table after both;
* in-process full render time (target < 1 s at 10,000), and a one-endpoint partial sync (render
  + transaction, median of several; target < 30 ms), with the render's share and which path
  the transaction took (netlink, or nft -f);
* the same one-endpoint transaction through `nft -f` (what it cost before the netlink path:
  nft fetches every chain of the netns first);
* peak RSS of the `run --once` process (should grow linearly with the cluster);
* a periodic full sync (the renderer trusts its record of the table), and the rewrite of the
  whole table after a restart or a failed sync (one transaction); then the first periodic
  full sync after that rewrite, with nothing else written since (the generation stands for a
  record: no rules read), and (up to --slow-max) after another table's commit (no record:
  the table listed whole through nft);
* the kernel's floors, over netlink (no nft userspace at all): any commit (one element added to
  a plain set: the commit walks every chain), and one rule or verdict element with a jump or
  goto (the commit then validates the table's whole jump graph).

The 10,000-Service table takes minutes to load (the kernel names each anonymous vmap by
scanning every set of the table): whole-table loads are repeated only up to --slow-max.

Usage: python bench/nftables_sync.py [--sizes 1000,10000] [--repeat 3] [--slow-max 2000]
"""

from __future__ import annotations

import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from common import NODE, Netns, Workspace, bench_sizes, cluster, installed_env, timed

from kubeplex.backends.nftables import NftablesBackend, names, netlink
from kubeplex.backends.nftables.kernel import NftKernel
from kubeplex.core.daemon.proxier import Proxier, collector_paused
from kubeplex.core.dataplane.backend import BackendContext
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.sources.manifests import ManifestSource


def netlink_ms(link: netlink.NftNetlink, text: str, undo: str, count: int = 5) -> float:
    """Median time of a transaction sent over netlink (undone after each run)."""
    do, back = netlink.compile_transaction(text), netlink.compile_transaction(undo)
    times = []
    for _ in range(count):
        t0 = time.perf_counter()
        link.apply(do)
        times.append(time.perf_counter() - t0)
        link.apply(back)
    return statistics.median(times) * 1000


def listing(ns: str) -> str:
    return subprocess.run(
        ["ip", "netns", "exec", ns, "nft", "list", "table", "ip", names.TABLE],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def kernel_floors(ns: str, service_chain: str) -> dict[str, float]:
    link = netlink.NftNetlink(ns)
    t = f"ip {names.TABLE}"
    probe = f"{t} kubeplex-probe"
    try:
        return {
            "commit_ms": netlink_ms(
                link,
                f"add element {t} cluster-ips {{ 10.99.0.1 }}\n",
                f"delete element {t} cluster-ips {{ 10.99.0.1 }}\n",
            ),
            "jump_rule_ms": netlink_ms(
                link,
                f"add chain {probe}\nadd rule {probe} jump {names.MARK_MASQ}\n",
                f"flush chain {probe}\ndelete chain {probe}\n",
            ),
            "goto_element_ms": netlink_ms(
                link,
                f"add element {t} service-ips {{ 10.99.0.1 . tcp . 80 : goto {service_chain} }}\n",
                f"delete element {t} service-ips {{ 10.99.0.1 . tcp . 80 }}\n",
            ),
        }
    finally:
        link.close()


def bench_size(n: int, repeat: int, work: Path, slow_max: int) -> dict[str, Any]:
    ws = Workspace.create(work, n, "nftables")
    cfg = ws.config
    loads = repeat if n <= slow_max else 1

    # The table kubeplex would load, as nft -f input (IPv4 only, like the floor).
    state = ClusterState(NODE)
    ManifestSource(ws.folder, state).load()
    backend = NftablesBackend(BackendContext(cfg, NODE, families=state.families[:1]))
    snapshot = state.checkout(full=True)
    with collector_paused():  # as the daemon renders
        t0 = time.perf_counter()
        rendered = backend.render(snapshot)
        full_render = time.perf_counter() - t0
    table = rendered.kernel_input()
    rules = table.count("\nadd rule ")

    floors: list[float] = []
    runs: list[float] = []
    rss_kb = 0
    env = installed_env()
    listings: set[str] = set()
    for _ in range(loads):
        with Netns() as ns:
            floors.append(timed(["ip", "netns", "exec", ns, "nft", "-f", "-"], table))
            listings.add(listing(ns))
        with Netns() as ns:
            seconds, rss = ws.run_once(ns, env, "--proxy-mode", "nftables")
            runs.append(seconds)
            rss_kb = max(rss_kb, rss)
            listings.add(listing(ns))
    # The run wrote the very table the floor loaded (nft lists both the same).
    assert len(listings) == 1, "run --once and nft -f wrote different tables"

    # Partial syncs: program a namespace in-process, then change one endpoint of one Service.
    with Netns() as ns:
        state = ClusterState(NODE, families=state.families[:1])
        source = ManifestSource(ws.folder, state)
        source.load()
        kernel = NftKernel(ns)
        backend = NftablesBackend(
            BackendContext(cfg, NODE, families=state.families, netns=ns, kernel=kernel)
        )
        backend.prepare()
        proxier = Proxier(state, backend)
        assert proxier.sync(full=True)
        version = 0

        def one_endpoint_changes(count: int) -> tuple[list[float], list[float], set[str]]:
            nonlocal version
            totals, renders, paths = [], [], set()
            for _ in range(count):
                version += 1
                state.set_endpoint_slice(cluster(1, version=version)[1])
                with collector_paused():
                    t0 = time.perf_counter()
                    checkout = state.checkout()
                    r = backend.render(checkout, backend.observe(checkout))
                    t1 = time.perf_counter()
                    backend.apply(r)
                    t2 = time.perf_counter()
                assert not r.full
                renders.append(t1 - t0)
                totals.append(t2 - t0)
                paths.add(kernel.last_path)
            return totals, renders, paths

        partials, partial_renders, paths = one_endpoint_changes(max(repeat, 5) + 1)
        # The same syncs with every transaction through nft -f (its cache fetch included).
        kernel.use_netlink = False
        nft_times = one_endpoint_changes(3)[0]
        kernel.use_netlink = True
        service_chain = names.SERVICE_PREFIX + names.cached_base("bench/svc-0/tcp/")
        floors_k = kernel_floors(ns, service_chain)
        # Periodic full syncs (the renderer trusts its record): with nothing else written
        # since (the ruleset generation tells: no rule dump), and after another writer's
        # commit (another table's: the rules are dumped and compared).
        assert proxier.sync(full=True)  # reads the tables (the floors above committed)
        quiet, foreign = [], []
        for i in range(max(repeat, 5)):
            t0 = time.perf_counter()
            assert proxier.sync(full=True)
            quiet.append(time.perf_counter() - t0)
            subprocess.run(
                ["ip", "netns", "exec", ns, "nft", f"add table inet other{i}"], check=True
            )
            t0 = time.perf_counter()
            assert proxier.sync(full=True)
            foreign.append(time.perf_counter() - t0)
        # The generation read, one round trip (two around each write while it is kubeplex's).
        t0 = time.perf_counter()
        for _ in range(100):
            kernel.generation()
        generation_ms = (time.perf_counter() - t0) * 10
        # Then the whole table rewritten as after a restart or a failed sync (render, listing
        # and the one transaction).
        backend.invalidate()
        t0 = time.perf_counter()
        assert proxier.sync(full=True)
        rewrite = time.perf_counter() - t0
        first_full = full_sync_s(proxier)
        first_foreign = None
        if n <= slow_max:
            backend.invalidate()
            assert proxier.sync(full=True)
            subprocess.run(["ip", "netns", "exec", ns, "nft", "add table inet other"], check=True)
            first_foreign = full_sync_s(proxier)
    return {
        "services": n,
        "rules": rules,
        "floor_s": statistics.median(floors),
        "run_once_s": statistics.median(runs),
        "ratio": statistics.median(runs) / statistics.median(floors),
        "full_render_s": full_render,
        "partial_sync_ms": statistics.median(partials) * 1000,
        "partial_render_ms": statistics.median(partial_renders) * 1000,
        "partial_path": "+".join(sorted(paths)),
        "nft_partial_ms": statistics.median(nft_times) * 1000,
        "peak_rss_mb": rss_kb / 1024,
        "trusted_full_s": statistics.median(quiet),
        "foreign_full_s": statistics.median(foreign),
        "generation_ms": generation_ms,
        "rewrite_s": rewrite,
        "first_full_s": first_full,
        "first_foreign_s": first_foreign,
        **floors_k,
    }


def full_sync_s(proxier: Proxier) -> float:
    t0 = time.perf_counter()
    assert proxier.sync(full=True)
    return time.perf_counter() - t0


def report(r: dict[str, Any]) -> str:
    foreign = r["first_foreign_s"]
    return (
        f"{r['services']:>6} services {r['rules']:>7} rules"
        f" | nft -f floor {r['floor_s']:.3f} s"
        f" | run --once {r['run_once_s']:.3f} s (x{r['ratio']:.2f})"
        f" | full render {r['full_render_s']:.3f} s"
        f" | 1-endpoint partial sync {r['partial_sync_ms']:.1f} ms"
        f" (render {r['partial_render_ms']:.1f} ms, via {r['partial_path']};"
        f" via nft -f {r['nft_partial_ms']:.1f} ms;"
        f" kernel floors: commit {r['commit_ms']:.1f} ms,"
        f" jump rule {r['jump_rule_ms']:.1f} ms,"
        f" goto element {r['goto_element_ms']:.1f} ms)"
        f" | periodic full sync {r['trusted_full_s']:.2f} s"
        f" (after another writer's commit {r['foreign_full_s']:.2f} s;"
        f" generation read {r['generation_ms']:.2f} ms)"
        f" | rewrite of the table (restart) {r['rewrite_s']:.2f} s"
        f" | first periodic full sync after it {r['first_full_s']:.2f} s"
        + (f" (after another writer's commit {foreign:.2f} s)" if foreign is not None else "")
        + f" | peak RSS {r['peak_rss_mb']:.0f} MB"
    )


def main() -> None:
    bench_sizes(
        bench_size,
        report,
        "--slow-max",
        "repeat whole-table loads (floor, run --once) only up to this many Services",
    )


if __name__ == "__main__":
    main()
