"""Lists per minute the API source makes when every watch fails: a relist storm.

The in-tree API server (tests/apiserver) holds a few Services, their EndpointSlices, the Node
and a ServiceCIDR, and answers every watch badly (``--fault``): ``expired``, the watch cache's
410 Expired ERROR event (a server whose window is compacted past every resourceVersion its lists
hand out), or ``garbage``, one line that is not JSON. The API source runs against it with the
given client qps (burst twice that, at least 10) for ``--seconds`` of real time; the server's
request log gives the lists and watches of each resource.

It prints, per qps: lists and watches of each resource in the window, and lists per minute (of
all four resources together, as the server sees them). client-go's reflector backs off between
rounds (0.8 s doubling to 30 s, jittered by up to as much again), which allows 5 or 6 lists of a
resource in the first 40 s.

    .venv/bin/python bench/relist_storm.py --qps 5 --qps 50 --seconds 40
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from apiserver import FakeApiServer

from kubeplex.core.config.kubeproxy import default_config
from kubeplex.core.sources.kubeapi import RESOURCES, KubeApiSource

NODE = "bench-node"


def populate(srv: FakeApiServer, services: int) -> None:
    srv.create("Node", {"metadata": {"name": NODE}, "spec": {"podCIDR": "10.244.1.0/24"}})
    srv.create(
        "ServiceCIDR", {"metadata": {"name": "kubernetes"}, "spec": {"cidrs": ["10.96.0.0/16"]}}
    )
    for i in range(services):
        srv.create(
            "Service",
            {
                "metadata": {"name": f"s{i}", "namespace": "bench"},
                "spec": {"ports": [{"port": 80}]},
            },
        )
        srv.create(
            "EndpointSlice",
            {
                "metadata": {
                    "name": f"s{i}-a",
                    "namespace": "bench",
                    "labels": {"kubernetes.io/service-name": f"s{i}"},
                },
                "addressType": "IPv4",
                "endpoints": [{"addresses": [f"10.244.1.{i % 250 + 2}"]}],
                "ports": [{"port": 8080, "protocol": "TCP"}],
            },
        )


def storm(qps: float, seconds: float, fault: str, services: int) -> dict[str, tuple[int, int]]:
    """(lists, watches) of each resource while every watch fails for ``seconds``."""
    with tempfile.TemporaryDirectory() as tmp, FakeApiServer() as srv:
        populate(srv, services)
        srv.break_watches(fault)  # type: ignore[arg-type]
        cfg = default_config()
        kubeconfig = srv.write_kubeconfig(Path(tmp) / "kubeconfig")
        cfg = replace(
            cfg, client_connection=replace(cfg.client_connection, kubeconfig=str(kubeconfig))
        )
        source = KubeApiSource.from_config(
            cfg, NODE, qps=qps, burst=max(10, int(2 * qps)), config_sync_period=0
        )
        source.start()
        try:
            time.sleep(seconds)
            counts = {
                r: (len(srv.find_requests("list", r)), len(srv.find_requests("watch", r)))
                for r in RESOURCES
            }
        finally:
            source.stop()
        return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--qps", type=float, action="append", help="client qps (repeatable)")
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--fault", choices=("expired", "garbage", "closed"), default="expired")
    parser.add_argument("--services", type=int, default=10)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    for qps in args.qps or [5.0, 50.0]:
        counts = storm(qps, args.seconds, args.fault, args.services)
        total = sum(lists for lists, _ in counts.values())
        each = ", ".join(f"{r} {lists}/{watches}" for r, (lists, watches) in counts.items())
        print(
            f"qps {qps:g}, {args.fault}, {args.seconds:g} s: lists/watches {each};"
            f" {total} lists, {total * 60 / args.seconds:.1f} lists/min"
        )


if __name__ == "__main__":
    main()
