"""A burst of new Services: N Services x 10 endpoints added at once to a synced cluster of M.

Prints, per mode (root; every case in a throw-away network namespace that first holds the M
Services, programmed by kubeplex):
* the partial sync that takes the burst, the way kubeplex sends it (nftables: the new
  services' chains in stages ahead of one last transaction, when there are many), with the
  number of transactions;
* nftables: the same partial sync as one transaction (what it was before the stages), unless
  --skip-one-transaction (it costs O(N^2) in the kernel: about a minute at 6,000);
* a full sync that takes the burst instead (the renderer trusts its record of the table);
* the floor: the partial sync's own additions loaded by the tool alone (`nft -f`,
  `iptables-restore --noflush`), one transaction, unless --skip-floor (quadratic in the
  input's size: minutes for iptables-restore at 3,000);
* nftables: that every case leaves the kernel's table listing the same.

Usage: python bench/burst_sync.py [--modes nftables,iptables] [--base 1000] [--burst 6000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from common import NODE, Netns, cluster, config, timed

import kubeplex.backends.nftables as nftables_mode
from kubeplex.backends.iptables import IptablesBackend
from kubeplex.backends.nftables import NftablesBackend, names
from kubeplex.backends.nftables.kernel import NftKernel
from kubeplex.core.config.kubeproxy import parse_config
from kubeplex.core.daemon.proxier import Proxier
from kubeplex.core.dataplane.backend import Backend, BackendContext, SyncResult
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.graph import ProxyState


def feed(state: ClusterState, objs: list[dict[str, Any]]) -> None:
    for obj in objs:
        kind = obj["kind"]
        if kind == "Service":
            state.set_service(obj)
        elif kind == "EndpointSlice":
            state.set_endpoint_slice(obj)
        else:
            state.set_service_cidr(obj)


class Synced:
    """A namespace holding the first ``base`` Services, synced by kubeplex in ``mode``."""

    def __init__(self, mode: str, ns: str, base: list[dict[str, Any]]) -> None:
        self.ns = ns
        self.state = ClusterState(NODE)
        feed(self.state, base)
        cfg = parse_config(config(mode), "bench")
        families = self.state.families[:1]
        self.backend: Backend
        if mode == "nftables":
            kernel = NftKernel(ns)
            ctx = BackendContext(cfg, NODE, families=families, netns=ns, kernel=kernel)
            self.backend = NftablesBackend(ctx)
        else:
            self.backend = IptablesBackend(BackendContext(cfg, NODE, families=families, netns=ns))
        self.backend.prepare()
        self.proxier = Proxier(self.state, self.backend)
        self.results: list[SyncResult] = []
        self.proxier.listeners.append(lambda _s, result, _e: self.results.append(result))
        assert self.proxier.sync(full=True)

    def sync(self, objs: list[dict[str, Any]], full: bool) -> tuple[float, float, SyncResult]:
        """The sync's seconds, and the CPU seconds it took, the kernel's included (steadier
        than the wall clock on a busy machine)."""
        feed(self.state, objs)
        t0, c0 = time.perf_counter(), time.process_time()
        assert self.proxier.sync(full=full)
        return time.perf_counter() - t0, time.process_time() - c0, self.results[-1]

    def burst_input(self, objs: list[dict[str, Any]]) -> str:
        """The partial sync's own additions as one transaction of the mode's tool (rendered,
        never applied: this namespace is for the floor only)."""
        feed(self.state, objs)
        state: ProxyState = self.state.checkout()
        if isinstance(self.backend, NftablesBackend):
            return self.backend.render(state).kernel_input()
        return self.backend.render(state).plans[0].restore_input()


def nft_listing(ns: str) -> str:
    argv = ["ip", "netns", "exec", ns, "nft", "list", "table", "ip", names.TABLE]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


@contextmanager
def one_transaction() -> Iterator[None]:
    """nftables syncs without the stages of new services' chains (as before them)."""
    saved = nftables_mode.STAGE_MIN_LINES
    nftables_mode.STAGE_MIN_LINES = sys.maxsize
    try:
        yield
    finally:
        nftables_mode.STAGE_MIN_LINES = saved


def tool_alone(
    mode: str, base: list[dict[str, Any]], added: list[dict[str, Any]]
) -> tuple[float, str | None]:
    """The partial sync's additions loaded by the mode's tool, in one input: seconds, and
    (nftables) the table's listing after."""
    with Netns() as ns:
        text = Synced(mode, ns, base).burst_input(added)
        if mode == "nftables":
            seconds = timed(["ip", "netns", "exec", ns, "nft", "-f", "-"], text)
            return seconds, nft_listing(ns)
        restore = ["ip", "netns", "exec", ns, "iptables-restore", "--noflush", "--wait", "5"]
        return timed(restore, text), None


def burst(mode: str, m: int, n: int, one_tx: bool, floor: bool) -> dict[str, Any]:
    objs = cluster(m + n)
    cidrs = [o for o in objs if o["kind"] == "ServiceCIDR"]
    services = [o for o in objs if o["kind"] != "ServiceCIDR"]
    base, added = [*cidrs, *services[: 2 * m]], services[2 * m :]
    out: dict[str, Any] = {"mode": mode, "base": m, "burst": n}
    listings: dict[str, str] = {}
    cases: list[tuple[str, bool, Callable[[], AbstractContextManager[None]]]] = [
        ("partial", False, nullcontext)
    ]
    if mode == "nftables" and one_tx:
        cases.append(("one_transaction", False, one_transaction))
    cases.append(("full", True, nullcontext))
    for case, full, around in cases:
        with Netns() as ns:
            synced = Synced(mode, ns, base)
            with around():
                seconds, cpu, result = synced.sync(added, full)
            out[f"{case}_s"] = seconds
            out[f"{case}_cpu_s"] = cpu
            # As it goes (a slow case shows which it is).
            print(f"{mode} {case}: {seconds:.2f} s, CPU {cpu:.2f} s", file=sys.stderr, flush=True)
            out[f"{case}_transactions"] = result.counts.get("transactions")
            if mode == "nftables":
                listings[case] = nft_listing(ns)
    if floor:
        out["floor_s"], listing = tool_alone(mode, base, added)
        if listing is not None:
            listings["floor"] = listing
    if listings:
        out["same_table"] = len(set(listings.values())) == 1
    return out


def report(r: dict[str, Any]) -> str:
    parts = [f"{r['mode']:>8}: {r['burst']} Services added to {r['base']}"]
    for case, title in (
        ("partial", "partial sync"),
        ("one_transaction", "as one transaction"),
        ("full", "full sync"),
    ):
        if f"{case}_s" in r:
            count = r[f"{case}_transactions"]
            many = f", {count} transactions" if count is not None else ""
            parts.append(f"{title} {r[f'{case}_s']:.2f} s (CPU {r[f'{case}_cpu_s']:.2f} s{many})")
    if "floor_s" in r:
        tool = "nft -f" if r["mode"] == "nftables" else "iptables-restore --noflush"
        parts.append(f"floor ({tool} of the additions) {r['floor_s']:.2f} s")
    if "same_table" in r:
        parts.append("same table listed after each" if r["same_table"] else "TABLES DIFFER")
    return " | ".join(parts)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--modes", default="nftables,iptables")
    p.add_argument("--base", type=int, default=1000)
    p.add_argument("--burst", type=int, default=6000)
    p.add_argument("--skip-one-transaction", action="store_true")
    p.add_argument("--skip-floor", action="store_true", help="iptables: minutes at 6,000")
    args = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (network namespaces)")
    for mode in args.modes.split(","):
        r = burst(mode, args.base, args.burst, not args.skip_one_transaction, not args.skip_floor)
        print(report(r), flush=True)


if __name__ == "__main__":
    main()
