"""What the sync benchmarks share: a synthetic cluster, throw-away namespaces, the CLI."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubeplex.core.config.kubeproxy import KubeProxyConfiguration, parse_config

NODE = "bench-node"


def config(mode: str) -> str:
    return f"""apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: {mode}
clusterCIDR: 10.128.0.0/9
hostnameOverride: {NODE}
"""


def endpoint_ip(k: int) -> str:
    base = (10 << 24) | (128 << 16)
    v = base + k + 2
    return ".".join(str((v >> s) & 255) for s in (24, 16, 8, 0))


def cluster(n: int, endpoints: int = 10, version: int = 0) -> list[dict[str, Any]]:
    objs: list[dict[str, Any]] = []
    for i in range(n):
        name = f"svc-{i}"
        ip = f"10.96.{i // 250}.{i % 250 + 1}"
        objs.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": name, "namespace": "bench"},
                "spec": {"clusterIP": ip, "ports": [{"port": 80, "protocol": "TCP"}]},
            }
        )
        eps = []
        for j in range(endpoints):
            k = i * endpoints + j
            eps.append(
                {
                    "addresses": [endpoint_ip(k + (version if k == 0 else 0) * 7_919_000)],
                    "conditions": {"ready": True},
                    "nodeName": NODE if j % 2 == 0 else "other",
                }
            )
        objs.append(
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": f"{name}-abcde",
                    "namespace": "bench",
                    "labels": {"kubernetes.io/service-name": name},
                },
                "addressType": "IPv4",
                "ports": [{"name": "", "port": 8080, "protocol": "TCP"}],
                "endpoints": eps,
            }
        )
    # What every API server creates from --service-cluster-ip-range.
    objs.append(
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "ServiceCIDR",
            "metadata": {"name": "kubernetes"},
            "spec": {"cidrs": ["10.96.0.0/12"]},
        }
    )
    return objs


class Netns:
    def __init__(self) -> None:
        self.name = f"kpxbench{uuid.uuid4().hex[:8]}"

    def __enter__(self) -> str:
        subprocess.run(["ip", "netns", "add", self.name], check=True)
        return self.name

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["ip", "netns", "del", self.name], check=False)


def timed(argv: list[str], input: str | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(argv, input=input, text=True, check=True, capture_output=True)
    return time.perf_counter() - start


def installed_env() -> dict[str, str]:
    """The environment to run the CLI as an installed kubeplex runs: with its bytecode compiled
    (pip compiles it at install time; a source checkout run with PYTHONDONTWRITEBYTECODE set
    would compile every module at each start)."""
    root = Path(__file__).resolve().parent.parent
    dirs = [str(root / d) for d in ("core", "backends", "testing")]
    subprocess.run([sys.executable, "-m", "compileall", "-q", *dirs], check=True)
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


#: The CLI, reporting its own peak RSS (KiB, without the children it runs) on stderr.
KUBEPLEX_CMD = [
    sys.executable,
    "-c",
    "import resource, sys; from kubeplex.core.cli.main import main; rc = main(sys.argv[1:]);"
    " print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr);"
    " sys.exit(rc)",
]


@dataclass
class Workspace:
    """A size's manifests (one JSON List) and the mode's configuration, written to disk."""

    folder: Path
    config_file: Path
    config: KubeProxyConfiguration

    @classmethod
    def create(cls, work: Path, n: int, mode: str) -> Workspace:
        folder = work / f"m{n}"
        folder.mkdir()
        (folder / "cluster.json").write_text(json.dumps({"kind": "List", "items": cluster(n)}))
        config_file = work / "config.yaml"
        config_file.write_text(config(mode))
        return cls(folder, config_file, parse_config(config(mode), "bench"))

    def run_once(self, ns: str, env: dict[str, str], *extra: str) -> tuple[float, int]:
        """``kubeplex run --once`` in ``ns``: seconds, and the process's peak RSS in KiB."""
        argv = ["run", "--config", str(self.config_file), "--manifests", str(self.folder)]
        start = time.perf_counter()
        proc = subprocess.run(
            [*KUBEPLEX_CMD, *argv, "--once", *extra, "--netns", ns],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        )
        return time.perf_counter() - start, int(proc.stderr.strip().splitlines()[-1])


def bench_sizes(
    bench_size: Callable[[int, int, Path, int], dict[str, Any]],
    report: Callable[[dict[str, Any]], str],
    limit_flag: str,
    limit_help: str,
) -> None:
    """The command line both sync benchmarks share: sizes, repeats, and a size above which
    the slow whole-table loads are cut short."""
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="1000,10000")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument(limit_flag, type=int, default=2000, dest="limit", help=limit_help)
    args = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (network namespaces)")
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(s) for s in args.sizes.split(",")):
            print(report(bench_size(n, args.repeat, Path(tmp), args.limit)), flush=True)
