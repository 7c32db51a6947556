"""The daemon as operators run it: `kubeplex run` against an API server, kept in sync through
watch drops, with /healthz, /livez and /metrics answering, and stopped by SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from apiserver import KUBE_PROXY_PERMISSIONS, FakeApiServer
from kits.cli_kit import LAB, free_port, in_netns, wait_until

pytestmark = pytest.mark.kernel


def nat(ns: str) -> str:
    return in_netns(ns, "iptables-save", "-t", "nat")


def http_in(ns: str, port: int, path: str) -> tuple[int, str]:
    """GET 127.0.0.1:port/path from inside the namespace (where the daemon's servers listen)."""
    code = (
        "import sys, urllib.request, urllib.error\n"
        "try:\n"
        f"    r = urllib.request.urlopen('http://127.0.0.1:{port}{path}', timeout=3)\n"
        "    print(r.status); print(r.read().decode())\n"
        "except urllib.error.HTTPError as e:\n"
        "    print(e.code); print(e.read().decode())\n"
    )
    out = subprocess.run(
        ["ip", "netns", "exec", ns, sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=10,
    ).stdout
    status, _, body = out.partition("\n")
    return int(status), body


def test_daemon_follows_the_api_through_watch_drops(tmp_path: Path, netns: str) -> None:
    srv = FakeApiServer(authorizer=set(KUBE_PROXY_PERMISSIONS), bookmark_interval=0.5).start()
    proc: subprocess.Popen[str] | None = None
    try:
        for file in ("node.yaml", "web.yaml"):
            for doc in yaml.safe_load_all((LAB / "manifests" / file).read_text()):
                srv.create(doc["kind"], doc)
        healthz, metrics = free_port(), free_port()
        cfg = yaml.safe_load((LAB / "config.yaml").read_text())
        cfg["clientConnection"] = {"kubeconfig": str(srv.write_kubeconfig(tmp_path / "kc"))}
        cfg["healthzBindAddress"] = f"127.0.0.1:{healthz}"
        cfg["metricsBindAddress"] = f"127.0.0.1:{metrics}"
        cfg["iptables"] = {"minSyncPeriod": "100ms", "syncPeriod": "30s"}
        (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
        log = (tmp_path / "daemon.log").open("w")
        # Its bytecode goes here.
        env = dict(os.environ, PYTHONPYCACHEPREFIX=str(tmp_path / "pycache"))
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kubeplex.core.cli.main",
                "run",
                "--config",
                str(tmp_path / "config.yaml"),
                "--netns",
                netns,
                "-v",
                "1",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        wait_until(lambda: "KUBE-SVC-LOLE4ISW44XBNF3G" in nat(netns), what="the first sync")
        # A running daemon writes nothing beside its modules (the image's build step does).
        assert not list((tmp_path / "pycache").rglob("dataclass-methods.*"))
        wait_until(lambda: http_in(netns, healthz, "/healthz")[0] == 200, what="healthz 200")
        status, body = http_in(netns, healthz, "/healthz")
        assert json.loads(body)["nodeEligible"] is True
        assert http_in(netns, healthz, "/livez")[0] == 200

        # A Service added while the watch runs is programmed.
        srv.create(
            "Service",
            {
                "metadata": {"name": "late", "namespace": "default"},
                "spec": {"clusterIP": "10.96.0.77", "ports": [{"port": 81}]},
            },
        )
        wait_until(
            lambda: (
                "default/late has no endpoints" in in_netns(netns, "iptables-save", "-t", "filter")
            ),
            what="the late Service",
        )

        # The connections drop; while the daemon is cut off a Service is deleted and the history
        # compacted: only a relist can tell, and no other rule may be lost meanwhile.
        before = nat(netns)
        relists = len(srv.find_requests("list", "services"))
        srv.pause()
        srv.drop_watches(mode="reset")
        srv.delete("Service", "web-nodeport", namespace="default")
        srv.compact()
        time.sleep(0.5)  # the daemon is disconnected for a while, as in a real outage
        assert "KUBE-SVC-LOLE4ISW44XBNF3G" in nat(netns)
        srv.resume()
        wait_until(lambda: "default/web-nodeport" not in nat(netns), what="the relisted delete")
        assert len(srv.find_requests("list", "services")) > relists
        after = nat(netns)
        assert "KUBE-SVC-LOLE4ISW44XBNF3G" in before and "KUBE-SVC-LOLE4ISW44XBNF3G" in after
        assert srv.verbs_used() <= set(KUBE_PROXY_PERMISSIONS)

        status, text = http_in(netns, metrics, "/metrics")
        assert status == 200
        assert "kubeproxy_sync_proxy_rules_duration_seconds_bucket" in text
        assert 'kubeproxy_sync_proxy_rules_iptables_total{ip_family="IPv4",table="nat"}' in text

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        # Stopping leaves the rules in place (a restart must not cause an outage).
        assert "KUBE-SVC-LOLE4ISW44XBNF3G" in nat(netns)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        srv.stop()


def nft_table(ns: str) -> str:
    return subprocess.run(
        ["ip", "netns", "exec", ns, "nft", "list", "table", "ip", "kube-proxy"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout


def nft_objects(listing: str) -> dict[str, list[str]]:
    """A table listing by object (the order of objects and of a set's elements aside: a new
    process re-creates the base chains, which lists them last)."""
    objects: dict[str, list[str]] = {}
    current: list[str] = []
    for line in listing.splitlines():
        if line.startswith("\t") and not line.startswith("\t\t") and line.endswith("{"):
            current = objects.setdefault(line.strip(), [])
        elif line.startswith("\t\t"):
            # An element listed last has no comma; the first, the "elements = {" prefix.
            current.append(line.strip().removeprefix("elements = { ").rstrip(",").rstrip(" }"))
    return {
        name: lines if name.startswith("chain ") else sorted(lines)
        for name, lines in objects.items()
    }


def test_nftables_daemon_syncs_periodically_and_restarts_without_a_gap(
    tmp_path: Path, netns: str
) -> None:
    """nftables mode as a daemon: the first sync, periodic full syncs every second, a change
    from the API (a partial sync), then a restart: the new process rewrites the table it
    finds in one transaction, and the table is the same as before the restart."""
    srv = FakeApiServer(authorizer=set(KUBE_PROXY_PERMISSIONS), bookmark_interval=0.5).start()
    procs: list[subprocess.Popen[str]] = []
    try:
        for file in ("node.yaml", "web.yaml", "servicecidr.yaml"):
            for doc in yaml.safe_load_all((LAB / "manifests" / file).read_text()):
                srv.create(doc["kind"], doc)
        metrics = free_port()
        cfg = yaml.safe_load((LAB / "config.yaml").read_text())
        cfg["mode"] = "nftables"
        cfg["clientConnection"] = {"kubeconfig": str(srv.write_kubeconfig(tmp_path / "kc"))}
        cfg["healthzBindAddress"] = f"127.0.0.1:{free_port()}"
        cfg["metricsBindAddress"] = f"127.0.0.1:{metrics}"
        cfg["nftables"] = {"minSyncPeriod": "100ms", "syncPeriod": "1s"}
        (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
        log = (tmp_path / "daemon.log").open("w")
        argv = [sys.executable, "-m", "kubeplex.core.cli.main", "run", "--config"]
        argv += [str(tmp_path / "config.yaml"), "--netns", netns, "-v", "1"]

        def start() -> subprocess.Popen[str]:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, text=True)
            procs.append(proc)
            return proc

        def synced_total() -> int:
            try:
                status, text = http_in(netns, metrics, "/metrics")
            except subprocess.CalledProcessError:
                return 0  # not listening yet
            lines = [
                line
                for line in text.splitlines()
                if line.startswith("kubeproxy_sync_proxy_rules_duration_seconds_count")
            ]
            return int(float(lines[0].split()[-1])) if status == 200 and lines else 0

        proc = start()
        chain = "service-PFISGYVC-default/web/tcp/"
        wait_until(lambda: chain in nft_table(netns), what="the first sync")
        assert "ip daddr 10.96.0.0/16 drop" in nft_table(netns)  # the lab's ServiceCIDR
        wait_until(lambda: synced_total() >= 3, what="periodic full syncs")

        # An endpoint change from the API: a partial sync.
        slice_ = next(
            doc
            for doc in yaml.safe_load_all((LAB / "manifests" / "web.yaml").read_text())
            if doc["kind"] == "EndpointSlice" and doc["metadata"]["name"] == "web-7x2kq"
        )
        slice_["endpoints"] = slice_["endpoints"][:1]
        srv.update("EndpointSlice", slice_)
        wait_until(lambda: "numgen random mod 1 " in nft_table(netns), what="the endpoint change")
        before = nft_table(netns)

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert nft_table(netns) == before  # stopping leaves the table in place
        proc = start()
        wait_until(lambda: synced_total() >= 2, what="syncs after the restart")
        assert nft_objects(nft_table(netns)) == nft_objects(before)
        assert "sync failed" not in (tmp_path / "daemon.log").read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        srv.stop()
