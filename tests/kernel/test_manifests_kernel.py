"""The daemon on a manifests folder in the namespace lab: while the file of a Service is written
in two halves, and truncated and written again, steady connections to its ClusterIP never
fail; and the daemon still follows the folder afterwards."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kits.cli_kit import in_netns, kubeplex, wait_until

from kubeplex.testing.netlab import CLIENT_POD, NODE1, Lab, ProbeResult

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "testing" / "lab"
CLUSTER_IP = "10.96.88.59"

pytestmark = pytest.mark.kernel


class SteadyTraffic:
    """New connections from the client pod to the ClusterIP, batch after batch, until stopped."""

    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self.results: list[ProbeResult] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.results += self.lab.http(
                CLIENT_POD, CLUSTER_IP, 80, "/hostname", count=20, timeout=1.0, interval=0.05
            )

    def __enter__(self) -> SteadyTraffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def write_in_two_halves(path: Path, text: str, cut: int, pause: float) -> None:
    """What a slow writer does: truncate, write a part, make it visible, pause, finish."""
    with path.open("w") as f:
        f.write(text[:cut])
        f.flush()
        os.fsync(f.fileno())
        time.sleep(pause)
        f.write(text[cut:])


@pytest.fixture
def daemon(tmp_path: Path, netlab: Lab) -> Iterator[Path]:
    """``kubeplex run --manifests`` programming the client's node; its folder is yielded."""
    folder = tmp_path / "manifests"
    folder.mkdir()
    for name in ("node.yaml", "web.yaml"):
        (folder / name).write_text((LAB / "manifests" / name).read_text())
    cfg = yaml.safe_load((LAB / "config.yaml").read_text())
    cfg["healthzBindAddress"] = "127.0.0.1:10256"  # inside the node's namespace
    cfg["metricsBindAddress"] = "127.0.0.1:10249"
    cfg["iptables"] = {"minSyncPeriod": "100ms", "syncPeriod": "30s"}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    node_ns = netlab.namespace_of(NODE1)
    argv = [sys.executable, "-m", "kubeplex.core.cli.main", "run", "--config"]
    argv += [str(tmp_path / "config.yaml"), "--manifests", str(folder), "--netns", node_ns]
    with (tmp_path / "daemon.log").open("w") as log:
        proc = subprocess.Popen([*argv, "-v", "1"], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: "KUBE-SVC-LOLE4ISW44XBNF3G" in nat(node_ns), "the first sync")
        yield folder
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        # The rules go with the daemon: the module's lab may serve other tests.
        kubeplex("cleanup", "--config", str(tmp_path / "config.yaml"), "--netns", node_ns)


def nat(ns: str) -> str:
    return in_netns(ns, "iptables-save", "-t", "nat")


def test_rewriting_a_manifest_fails_no_connection(daemon: Path, netlab: Lab) -> None:
    web = daemon / "web.yaml"
    text = web.read_text()
    cut = text.index("---\napiVersion: discovery.k8s.io/v1")  # the Services, not their slices
    with SteadyTraffic(netlab) as traffic:
        time.sleep(1.0)
        for _ in range(3):  # shorter pauses than the quiet period the daemon waits for
            write_in_two_halves(web, text, cut, pause=0.3)
            time.sleep(1.5)
        for _ in range(2):  # truncated, then written again a while later (e.g. `kubectl > f`)
            write_in_two_halves(web, text, 0, pause=1.5)
            time.sleep(1.5)
    failed = [r for r in traffic.results if not r.ok]
    assert len(traffic.results) >= 50
    assert failed == [], f"{len(failed)} of {len(traffic.results)} failed: {failed[:3]}"

    # Still following: a new Service is programmed.
    late = (
        "apiVersion: v1\nkind: Service\nmetadata: {name: late, namespace: default}\n"
        "spec: {clusterIP: 10.96.0.77, ports: [{port: 81}]}\n"
    )
    (daemon / "late.yaml").write_text(late)
    node_ns = netlab.namespace_of(NODE1)
    wait_until(
        lambda: "default/late has no endpoints" in in_netns(node_ns, "iptables-save"),
        "the late Service",
    )
