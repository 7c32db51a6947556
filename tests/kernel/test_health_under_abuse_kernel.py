"""The daemon's health port under a flood of slow connections: 3,000 connections to /healthz's
port that send nothing or a byte a second (reopened whenever the daemon closes one), while
kubelet-like probes (a new connection, GET /healthz, a 1 s timeout) must all be answered and
a Service added meanwhile must be programmed.

The daemon starts with the usual soft descriptor limit (1,024), where a server holding a
thread and a descriptor per connection ran out of descriptors just past that limit. The
clients are a process of their own (tests/kits/flood_kit.py), so that their work does not slow
down the probes.
"""

from __future__ import annotations

import http.client
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from apiserver import KUBE_PROXY_PERMISSIONS, FakeApiServer
from kits import flood_kit
from kits.cli_kit import LAB, free_port, in_netns, wait_until

from kubeplex.core.dataplane.netns import run_in_netns

SLOW_CONNECTIONS = 3000
PROBES = 15
#: What a node's process gets unless its unit raises it.
USUAL_SOFT_LIMIT = 1024
FLOOD = Path(flood_kit.__file__)

pytestmark = pytest.mark.kernel


def established(netns: str, port: int) -> int:
    """Connections to ``port`` established now (accepted by the daemon or waiting for it)."""
    out = in_netns(netns, "ss", "-Htn", "state", "established", f"( sport = :{port} )")
    return len(out.splitlines())


def probe(netns: str, port: int) -> int | str:
    """A kubelet's HTTP probe: a new connection, GET /healthz, a 1 s timeout (for each step
    here: the test checks the whole); the status, or what went wrong."""

    def get() -> int | str:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1.0)
        try:
            conn.request("GET", "/healthz", headers={"Connection": "close"})
            return conn.getresponse().status
        except OSError as err:
            return repr(err)
        finally:
            conn.close()

    return run_in_netns(netns, get)


def open_descriptors(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def test_kubelet_probes_are_answered_while_3000_slow_connections_are_held(
    tmp_path: Path, netns: str
) -> None:
    srv = FakeApiServer(authorizer=set(KUBE_PROXY_PERMISSIONS), bookmark_interval=0.5).start()
    proc: subprocess.Popen[str] | None = None
    try:
        for file in ("node.yaml", "web.yaml"):
            for doc in yaml.safe_load_all((LAB / "manifests" / file).read_text()):
                srv.create(doc["kind"], doc)
        healthz = free_port()
        cfg = yaml.safe_load((LAB / "config.yaml").read_text())
        cfg["clientConnection"] = {"kubeconfig": str(srv.write_kubeconfig(tmp_path / "kc"))}
        cfg["healthzBindAddress"] = f"127.0.0.1:{healthz}"
        cfg["metricsBindAddress"] = f"127.0.0.1:{free_port()}"
        cfg["iptables"] = {"minSyncPeriod": "100ms", "syncPeriod": "30s"}
        (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
        log_path = tmp_path / "daemon.log"
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        argv = ["prlimit", f"--nofile={USUAL_SOFT_LIMIT}:{hard}"]
        argv += [sys.executable, "-m", "kubeplex.core.cli.main", "run", "--config"]
        argv += [str(tmp_path / "config.yaml"), "--netns", netns, "-v", "1"]
        with log_path.open("w") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, text=True)
        wait_until(lambda: probe(netns, healthz) == 200, what="healthz 200")

        answers: list[int | str] = []
        held: list[int] = []
        descriptors: list[int] = []
        waits: list[float] = []
        clients = [sys.executable, str(FLOOD), str(healthz), str(SLOW_CONNECTIONS)]
        flood = subprocess.Popen(
            ["ip", "netns", "exec", netns, *clients],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert flood.stdout is not None and flood.stdout.readline() == "ready\n"
            # Checked below with the probes' answers (a daemon that dies never gets there).
            opened_by = time.monotonic() + 20
            while established(netns, healthz) < SLOW_CONNECTIONS and time.monotonic() < opened_by:
                time.sleep(0.2)
            for i in range(PROBES):
                if i == 5:
                    srv.create(
                        "Service",
                        {
                            "metadata": {"name": "late", "namespace": "default"},
                            "spec": {"clusterIP": "10.96.0.77", "ports": [{"port": 81}]},
                        },
                    )
                held.append(established(netns, healthz))
                descriptors.append(open_descriptors(proc.pid))
                asked = time.monotonic()
                answers.append(probe(netns, healthz))
                waits.append(time.monotonic() - asked)
                time.sleep(1.0)
        finally:
            reopened, _ = flood.communicate(timeout=30)  # stdin closed: it stops
        alive = proc.poll() is None
        print(
            f"\n{SLOW_CONNECTIONS} slow connections: established {min(held)}-{max(held)} at the "
            f"probes, the daemon's descriptors {min(descriptors)}-{max(descriptors)}, "
            f"{reopened.strip()} closed by the daemon; probes: {answers}, answered in "
            f"{min(waits) * 1000:.0f}-{max(waits) * 1000:.0f} ms"
        )
        assert alive, log_path.read_text()[-3000:]
        assert answers == [200] * PROBES, log_path.read_text()[-3000:]
        assert max(waits) < 1.0  # a kubelet's timeout is for the whole probe
        # Held throughout (those the daemon closes at their deadline are opened again).
        assert sorted(held)[PROBES // 2] >= 0.95 * SLOW_CONNECTIONS
        # The daemon kept syncing: the Service added under the flood is programmed.
        wait_until(
            lambda: "default/late has no endpoints" in in_netns(netns, "iptables-save"),
            what="the Service added during the flood",
        )
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        srv.stop()
