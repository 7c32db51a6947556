"""ipvs mode: netlink requests, render and encode time of a sync; on an IPVS kernel, its wall time
next to the tools' own floor.

Default (any machine, no root): for each size (1,000 and 10,000 Services x 10 endpoints), a
full sync and a one-endpoint change rendered against an in-memory kernel (``FakeIpvs``):
render + reconcile time, the netlink requests the plan needs, and the time to encode them with
the mode's encoder (netlink.py) and, on a sample, with pyroute2's generic one (as the mode did
before), per request.

``--kernel`` (root, a kernel with IPVS; e.g. the test VM: ``python -m kubeplex.testing.vm --
.venv/bin/python bench/ipvs_sync.py --kernel``): in throw-away network namespaces, the wall
time of the full sync (observe, render, apply) and of a one-endpoint change at each of
``--kernel-sizes``, next to the floor of the same objects loaded by the tools: ``ipvsadm -R``
(the plan's IPVS lines: ``Op.__str__`` prints them), ``ip -batch`` (link and addresses),
``ipset restore`` and ``iptables-restore --noflush`` (the same rules text the sync restores).

Usage: python bench/ipvs_sync.py [--sizes 1000,10000] [--repeat 3]
       python bench/ipvs_sync.py --kernel [--kernel-sizes 100,1000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from common import NODE, Netns, Workspace, cluster

from kubeplex.backends.ipvs import IpvsBackend, netlink
from kubeplex.backends.ipvs.plan import IpvsRendered, Op
from kubeplex.core.daemon.proxier import collector_paused
from kubeplex.core.dataplane.backend import BackendContext
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.types import IPFamily
from kubeplex.core.sources.manifests import ManifestSource
from kubeplex.testing.fakes import FakeIpvs

V4 = IPFamily.IPv4
ROOT = Path(__file__).resolve().parent.parent
#: Ops encoded with pyroute2 per measurement (its encoder is the slow one being replaced).
PYROUTE2_SAMPLE = 2000


def _ops(r: IpvsRendered) -> list[Op]:
    return [op for p in r.plans for op in p.ops()]


def _encode_ours(ops: Sequence[Op]) -> float:
    """Seconds to pack ``ops`` as the kernel seam's send does (payload and header)."""
    t0 = time.perf_counter()
    for seq, op in enumerate(ops):
        if netlink.is_ipvs(op.kind):
            payload, mtype, flags = netlink.ipvs_payload(op), 33, netlink.ipvs_flags(op)
        elif op.kind.endswith("-address"):
            payload, mtype, flags = netlink.address_request(op, 9)
        elif op.kind != "add-link":
            payload, mtype, flags = netlink.ipset_request(op, 7, 5)
        else:
            continue
        netlink.frame(payload, mtype, flags | 5, seq)
    return time.perf_counter() - t0


def _pyroute2_encoder() -> Callable[[Op, int, int], bytes] | None:
    """pyroute2's encoding of an op (the unit test's reference builders), if importable."""
    sys.path.insert(0, str(ROOT / "tests" / "unit"))
    try:
        module = importlib.import_module("test_ipvs_netlink")
    except ImportError:
        return None
    encode: Callable[[Op, int, int], bytes] = module._pyroute2_bytes
    return encode


def _encode_pyroute2(ops: Sequence[Op], sample_size: int = PYROUTE2_SAMPLE) -> float | None:
    """Seconds per request with pyroute2's generic encoder, on a sample of ``ops``."""
    enc = _pyroute2_encoder()
    ops = [o for o in ops if o.kind != "add-link"]
    if enc is None or not ops:
        return None
    step = max(1, len(ops) // sample_size)
    sample = ops[::step][:sample_size]
    t0 = time.perf_counter()
    for op in sample:
        enc(op, 33, 5)
    return (time.perf_counter() - t0) / len(sample)


def _per_us(seconds: float | None, n: int) -> str:
    return f"{seconds / n * 1e6:.1f}" if seconds is not None and n else "-"


def _load(work: Path, n: int) -> tuple[Workspace, ClusterState]:
    work.mkdir()
    ws = Workspace.create(work, n, "ipvs")
    state = ClusterState(NODE, families=(V4,))
    ManifestSource(ws.folder, state).load()
    return ws, state


def _render(backend: IpvsBackend, state: ClusterState, full: bool) -> tuple[IpvsRendered, float]:
    snapshot = state.checkout(full=full)
    with collector_paused():
        t0 = time.perf_counter()
        rendered = backend.render(snapshot, backend.observe(snapshot))
        seconds = time.perf_counter() - t0
    assert isinstance(rendered, IpvsRendered)
    return rendered, seconds


# --- host: render, requests, encode ----------------------------------------------------------


def host_size(n: int, repeat: int, work: Path) -> dict[str, Any]:
    ws, state = _load(work / f"h{n}", n)
    backend = IpvsBackend(BackendContext(ws.config, NODE, families=(V4,), kernel=FakeIpvs()))
    backend.prepare()
    full, full_s = _render(backend, state, full=True)
    ops = _ops(full)
    out: dict[str, Any] = {
        "services": n,
        "full_requests": len(ops),
        "full_render_s": full_s,
        "full_encode_s": statistics.median(_encode_ours(ops) for _ in range(repeat)),
        "pyroute2_per_request_s": _encode_pyroute2(ops),
    }
    backend.apply(full)
    renders, encodes, requests = [], [], []
    for version in range(1, repeat + 2):
        state.set_endpoint_slice(cluster(1, version=version)[1])
        partial, seconds = _render(backend, state, full=False)
        assert not partial.full
        pops = _ops(partial)
        renders.append(seconds)
        encodes.append(_encode_ours(pops))
        requests.append(len(pops))
        backend.apply(partial)
    out.update(
        partial_requests=max(requests),
        partial_render_ms=statistics.median(renders) * 1000,
        partial_encode_us=statistics.median(encodes) * 1e6,
    )
    return out


def host_report(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| Services x 10 | full: requests | render+reconcile | encode (ours) | per request"
        " (ours / pyroute2) | 1-endpoint: requests | render+reconcile | encode |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        py = r["pyroute2_per_request_s"]
        lines.append(
            f"| {r['services']:,} | {r['full_requests']:,} | {r['full_render_s']:.3f} s"
            f" | {r['full_encode_s']:.3f} s"
            f" | {_per_us(r['full_encode_s'], r['full_requests'])} µs"
            f" / {f'{py * 1e6:.0f}' if py else '-'} µs"
            f" | {r['partial_requests']} | {r['partial_render_ms']:.2f} ms"
            f" | {r['partial_encode_us']:.0f} µs |"
        )
    return "\n".join(lines)


# --- kernel: wall time against the tools' floor -----------------------------------------------


def _netns_run(ns: str, argv: list[str], text: str) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(
        ["ip", "netns", "exec", ns, *argv], input=text, text=True, capture_output=True
    )
    seconds = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"{' '.join(argv)}: {proc.stderr.strip()[:400]}")
    return seconds


def floor_inputs(rendered: IpvsRendered) -> dict[str, str]:
    """The full plan as the tools' batch inputs (each line is ``str(op)`` less the tool)."""
    ip: list[str] = []
    ipset: list[str] = []
    ipvs: list[str] = []
    rules: list[str] = []
    for p in rendered.plans:
        for op in p.ops():
            line = str(op)
            tool, _, rest = line.partition(" ")
            {"ip": ip, "ipset": ipset, "ipvsadm": ipvs}[tool].append(rest)
        if p.iptables is not None:
            rules.append(p.iptables)
    return {
        "ip": "\n".join(ip) + "\n",
        "ipset": "\n".join(ipset) + "\n",
        "iptables": "".join(rules),
        "ipvsadm": "\n".join(ipvs) + "\n",
    }


def floor(rendered: IpvsRendered) -> dict[str, float]:
    """Seconds each tool takes to load the same objects into an empty namespace (in the order
    a sync needs them: sets before the rules that name them)."""
    inputs = floor_inputs(rendered)
    with Netns() as ns:
        return {
            "ip -batch": _netns_run(ns, ["ip", "-batch", "-"], inputs["ip"]),
            "ipset restore": _netns_run(ns, ["ipset", "restore"], inputs["ipset"]),
            "iptables-restore": _netns_run(
                ns, ["iptables-restore", "--noflush", "--wait", "5"], inputs["iptables"]
            ),
            "ipvsadm -R": _netns_run(ns, ["ipvsadm", "-R"], inputs["ipvsadm"]),
        }


def kernel_size(n: int, repeat: int, work: Path) -> dict[str, Any]:
    from kubeplex.backends.ipvs.kernel import IpvsKernel

    ws, state = _load(work / f"k{n}", n)
    out: dict[str, Any] = {"services": n}
    with Netns() as ns:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        kernel = IpvsKernel(ns)
        backend = IpvsBackend(BackendContext(ws.config, NODE, (V4,), ns, kernel=kernel))
        backend.prepare()
        kernel._ipvs()  # the family lookup, once per process: not part of a sync
        before = kernel.requests_sent
        t0 = time.perf_counter()
        full, _ = _render(backend, state, full=True)
        t1 = time.perf_counter()
        backend.apply(full)
        t2 = time.perf_counter()
        out.update(
            full_s=t2 - t0,
            full_observe_render_s=t1 - t0,
            full_apply_s=t2 - t1,
            full_requests=kernel.requests_sent - before,
            full_encode_s=statistics.median(_encode_ours(_ops(full)) for _ in range(repeat)),
            full_ops=len(_ops(full)),
        )
        walls: list[float] = []
        requests: list[tuple[int, int]] = []  # (writes, reads) per change
        for version in range(1, repeat + 2):
            state.set_endpoint_slice(cluster(1, version=version)[1])
            before = kernel.requests_sent
            t0 = time.perf_counter()
            partial, _ = _render(backend, state, full=False)
            writes = backend.apply(partial).counts["requests"]
            walls.append(time.perf_counter() - t0)
            requests.append((writes, kernel.requests_sent - before - writes))
            assert not partial.full
        out.update(partial_ms=statistics.median(walls) * 1000, partial_requests=max(requests))
        kernel.close()
    out["pyroute2_per_request_s"] = _encode_pyroute2(_ops(full), 400)
    out["floor"] = floor(full)
    return out


def kernel_report(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| Services x 10 | full sync | (observe+render / apply) | requests | encode (ours)"
        " | pyroute2 per request | floor: ipvsadm -R | ip -batch | ipset restore"
        " | iptables-restore | floor total | sync / floor | sync / ipvsadm -R"
        " | 1-endpoint change | its netlink requests (max) |",
        "|---:|" + "---:|" * 14,
    ]
    for r in rows:
        f = r["floor"]
        total = sum(f.values())
        py = r["pyroute2_per_request_s"]
        lines.append(
            f"| {r['services']:,} | {r['full_s']:.2f} s"
            f" | {r['full_observe_render_s']:.2f} / {r['full_apply_s']:.2f} s"
            f" | {r['full_requests']:,} | {r['full_encode_s']:.2f} s"
            f" ({_per_us(r['full_encode_s'], r['full_ops'])} µs each)"
            f" | {f'{py * 1e6:.0f} µs' if py else '-'}"
            f" | {f['ipvsadm -R']:.2f} s | {f['ip -batch']:.2f} s | {f['ipset restore']:.2f} s"
            f" | {f['iptables-restore']:.2f} s | {total:.2f} s"
            f" | x{r['full_s'] / total:.2f} | x{r['full_s'] / f['ipvsadm -R']:.2f}"
            f" | {r['partial_ms']:.0f} ms"
            f" | {r['partial_requests'][0]} writes + {r['partial_requests'][1]} reads |"
        )
    return "\n".join(lines)


def main() -> None:
    # The mode's start logs upstream's deprecation (an error): not a figure.
    quiet = logging.getLogger("kubeplex.backends.ipvs")
    quiet.propagate = False
    quiet.addHandler(logging.NullHandler())
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="1000,10000", help="host part: Services (x 10 endpoints)")
    p.add_argument("--kernel", action="store_true", help="on this kernel's IPVS (root)")
    p.add_argument("--kernel-sizes", default="100,1000")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "warm").mkdir()
        if not args.kernel:
            rows = [host_size(int(n), args.repeat, work) for n in args.sizes.split(",")]
            print(host_report(rows), flush=True)
            return
        if os.geteuid() != 0:
            sys.exit("--kernel needs root (network namespaces, IPVS)")
        for module in ("ip_vs", "ip_vs_rr", "dummy", "ip_set"):
            subprocess.run(["modprobe", module], capture_output=True, check=False)
        if not Path("/proc/net/ip_vs").exists():
            sys.exit(
                "this kernel has no IPVS (run it in the test VM: python -m kubeplex.testing.vm)"
            )
        # A one-Service round first, unreported: the guest loads the tools' and the kernel's
        # modules (nf_tables, ip_set types, schedulers) on first use.
        kernel_size(1, 1, work / "warm")
        rows = [kernel_size(int(n), args.repeat, work) for n in args.kernel_sizes.split(",")]
        print(kernel_report(rows), flush=True)


if __name__ == "__main__":
    main()
