"""What the sync benchmarks share: a synthetic cluster, throw-away namespaces, the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

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
    would compile every module at each start, about 30 ms)."""
    root = Path(__file__).resolve().parent.parent
    dirs = [str(root / d) for d in ("core", "backends", "testing")]
    subprocess.run([sys.executable, "-m", "compileall", "-q", *dirs], check=True)
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def kubeplex_cmd() -> list[str]:
    """The CLI, reporting its own peak RSS (KiB, without the children it runs)."""
    return [
        sys.executable,
        "-c",
        "import resource, sys; from kubeplex.core.cli import main; rc = main(sys.argv[1:]);"
        " print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr);"
        " sys.exit(rc)",
    ]
