"""The manifests path on a real API dump: ``kubeplex run --once --manifests`` of what
``kubectl get services,endpointslices,nodes -A -o yaml`` writes for N Services x 10 endpoints,
against the kernel's floor for the same ruleset.

The dump is one YAML ``kind: List`` as kubectl writes it (keys sorted, sequences not indented
under their key, no line wrapping): the ``kubernetes`` Service and its EndpointSlice, the N
Services, their N EndpointSlices and the Node, 2N + 3 objects as the API server holds them
(uid, resourceVersion, creationTimestamp, managedFields, owner and pod references, the Service
defaults). For each mode (root; each run in a throw-away network namespace) it prints, as
medians of ``--repeat`` interleaved runs:

  floor      ``nft -f`` / ``iptables-restore --noflush`` alone loading the ruleset kubeplex
             renders for the dump, into an empty namespace
  run        ``kubeplex run --once --manifests`` of the dump, process start to exit, and its
             ratio to the floor
  yaml       parsing the dump alone, in this process: PyYAML's CSafeLoader, and kubeplex's
             manifest loader (what ``run`` spends on it)

``--baseline DIR`` also runs the kubeplex package under DIR (``DIR/kubeplex/core``, ...),
interleaved run by run; ``--kubeplex DIR`` runs the one under DIR instead of the installed
one. ``--write FILE`` only writes the dump.

``--bare`` writes the objects without what a cluster adds to them (1.8 MB at 1,000 Services).

Usage: python bench/manifests_dump.py [--services 1000] [--modes nftables,iptables]
           [--repeat 3] [--bare] [--baseline DIR] [--write FILE]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from cold_start import CREATED, NAMESPACE, _uid, as_served, baseline_env, with_defaults
from common import KUBEPLEX_CMD, NODE, Netns, cluster, config, installed_env, timed

from kubeplex.core.config.kubeproxy import parse_config
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import BackendContext
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.sources import manifest_loader
from kubeplex.core.sources.manifests import ManifestSource

# ------------------------------------------------------------------------------ the dump


def _served(obj: dict[str, Any], rv: int) -> dict[str, Any]:
    meta = obj["metadata"]
    meta.setdefault("creationTimestamp", CREATED)
    meta["resourceVersion"] = str(rv)
    meta["uid"] = _uid(f"{obj['kind']}/{meta.get('namespace', '')}/{meta['name']}")
    if obj["kind"] == "EndpointSlice":
        meta["generation"] = 1
    return obj


#: The ``kubernetes`` Service's ClusterIP: inside the ServiceCIDR, apart from the bench's.
KUBERNETES_IP = "10.111.255.254"


def kubernetes_objects() -> list[dict[str, Any]]:
    """The ``default/kubernetes`` Service every cluster has, and its EndpointSlice."""
    svc = with_defaults(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": "kubernetes",
                "namespace": "default",
                "labels": {"component": "apiserver", "provider": "kubernetes"},
            },
            "spec": {
                "clusterIP": KUBERNETES_IP,
                "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}],
            },
        }
    )
    eps = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": "kubernetes",
            "namespace": "default",
            "labels": {"kubernetes.io/service-name": "kubernetes"},
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["172.18.0.2"], "conditions": {"ready": True}}],
        "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}],
    }
    return [svc, eps]


def node() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": NODE,
            "labels": {
                "kubernetes.io/hostname": NODE,
                "kubernetes.io/os": "linux",
                "topology.kubernetes.io/zone": "zone-a",
            },
        },
        "spec": {"podCIDR": "10.128.0.0/24", "podCIDRs": ["10.128.0.0/24"]},
        "status": {
            "addresses": [
                {"address": "172.18.0.5", "type": "InternalIP"},
                {"address": NODE, "type": "Hostname"},
            ]
        },
    }


def dump(n: int, bare: bool = False) -> str:
    """The YAML ``kubectl get services,endpointslices,nodes -A -o yaml`` writes; ``bare``: of
    objects created as they are written in common.cluster (no owner or pod references, zones,
    managedFields: a cluster whose EndpointSlices a script wrote)."""
    objs = [o for o in cluster(n) if o["kind"] in ("Service", "EndpointSlice")]
    served = (lambda o: o) if bare else as_served
    services = [with_defaults(served(copy.deepcopy(o))) for o in objs if o["kind"] == "Service"]
    slices = [served(copy.deepcopy(o)) for o in objs if o["kind"] == "EndpointSlice"]
    k_svc, k_eps = kubernetes_objects()
    items = [k_svc, *services, k_eps, *slices, node()]
    for rv, obj in enumerate(items, start=100):
        _served(obj, rv)
    doc = {"apiVersion": "v1", "items": items, "kind": "List", "metadata": {"resourceVersion": ""}}
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump(doc, Dumper=dumper, default_flow_style=False, sort_keys=True, width=1 << 20)


# ------------------------------------------------------------------------------ the floor

NFACCT_COUNTERS = ("localhost_nps_accepted_pkts", "ct_state_invalid_dropped_pkts")


def floor_input(mode: str, folder: Path, cfg_text: str) -> tuple[list[str], str]:
    """The command and input that load the ruleset kubeplex renders for ``folder`` (IPv4, as
    the dump holds), without kubeplex."""
    cfg = parse_config(cfg_text, "bench")
    state = ClusterState(NODE)
    ManifestSource(folder, state).load()
    backend = plugins.load_backend(mode, BackendContext(cfg, NODE, families=state.families[:1]))
    rendered = backend.render(state.checkout(full=True))
    if mode == "nftables":
        return ["nft", "-f", "-"], rendered.kernel_input()  # type: ignore[attr-defined]
    return (
        ["iptables-restore", "--noflush", "--wait", "5"],
        rendered.plans[0].restore_input(),  # type: ignore[attr-defined]
    )


# ------------------------------------------------------------------------------ runs


def run_once(folder: Path, cfg: Path, mode: str, env: dict[str, str]) -> float:
    with Netns() as ns:
        argv = ["run", "--config", str(cfg), "--manifests", str(folder), "--once"]
        start = time.perf_counter()
        subprocess.run(
            [*KUBEPLEX_CMD, *argv, "--proxy-mode", mode, "--netns", ns],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        )
        return time.perf_counter() - start


def parse_times(path: Path, repeat: int) -> tuple[float, float]:
    data = path.read_bytes()
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    plain, ours = [], []
    for _ in range(repeat):
        start = time.perf_counter()
        list(yaml.load_all(data.decode(), Loader=loader))
        plain.append(time.perf_counter() - start)
        start = time.perf_counter()
        manifest_loader.load_documents(str(path), data)
        ours.append(time.perf_counter() - start)
    return statistics.median(plain), statistics.median(ours)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--services", type=int, default=1000)
    p.add_argument("--modes", default="nftables,iptables")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--baseline", type=Path)
    p.add_argument("--kubeplex", type=Path, help="run the kubeplex package under this directory")
    p.add_argument("--write", type=Path, help="only write the dump here")
    p.add_argument("--bare", action="store_true", help="objects without what a cluster adds")
    args = p.parse_args()
    text = dump(args.services, args.bare)
    if args.write is not None:
        args.write.write_text(text)
        print(f"{args.write}: {text.count(chr(10) + '- ')} objects, {len(text) / 1e6:.2f} MB")
        return
    if os.geteuid() != 0:
        sys.exit("needs root (network namespaces)")
    env = installed_env()
    variants = {"": env if args.kubeplex is None else baseline_env(env, args.kubeplex.resolve())}
    if args.baseline is not None:
        variants["baseline"] = baseline_env(env, args.baseline.resolve())
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "dump"
        folder.mkdir()
        path = folder / "cluster.yaml"
        path.write_text(text)
        items = len(yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))["items"])
        plain, ours = parse_times(path, args.repeat)
        print(
            f"# {args.services} services x 10 endpoints ({NAMESPACE}): {items} objects,"
            f" {len(text.encode()) / 1e6:.2f} MB of YAML; parsed alone in {plain:.3f}s"
            f" (CSafeLoader), {ours:.3f}s (kubeplex's manifest loader)",
            flush=True,
        )
        for mode in [m for m in args.modes.split(",") if m in plugins.available()]:
            cfg = Path(tmp) / f"{mode}.yaml"
            cfg.write_text(config(mode))
            argv, table = floor_input(mode, folder, config(mode))
            floors: list[float] = []
            runs: dict[str, list[float]] = {name: [] for name in variants}
            for _ in range(args.repeat):
                with Netns() as ns:
                    if mode == "iptables":  # its nfacct matches need their counters, as kubeplex
                        for counter in NFACCT_COUNTERS:  # creates them
                            subprocess.run(
                                ["ip", "netns", "exec", ns, "nfacct", "add", counter], check=True
                            )
                    floors.append(timed(["ip", "netns", "exec", ns, *argv], table))
                for name, venv in variants.items():
                    runs[name].append(run_once(folder, cfg, mode, venv))
            floor = statistics.median(floors)
            for name, times in runs.items():
                run = statistics.median(times)
                print(
                    f"{mode:9s}{' ' + name if name else ''}: run --once {run:.2f}s"
                    f" (runs {', '.join(f'{t:.2f}' for t in times)}); floor {floor:.3f}s"
                    f" (runs {', '.join(f'{t:.3f}' for t in floors)}); ratio {run / floor:.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
