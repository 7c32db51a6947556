"""kubeadm's kube-proxy DaemonSet with only the image swapped: ``kube-proxy
--config=/var/lib/kube-proxy/config.conf --hostname-override=$(NODE_NAME)`` runs, programs the
seed Service, and exits (for the kubelet to restart it) once its config file is rewritten;
``--init-only`` and ``--cleanup`` on the same command line."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml
from apiserver import KUBE_PROXY_PERMISSIONS, FakeApiServer
from kits.cli_kit import LAB, in_netns, kube_proxy_command, wait_until

from kubeplex.core.dataplane.netns import run_in_netns

pytestmark = pytest.mark.kernel


def start_in_netns(srv: FakeApiServer, netns: str) -> None:
    """Start ``srv`` listening on the namespace's loopback, where a pod on the node's network
    would reach it (setns from a short-lived thread: the listening socket is made there)."""
    run_in_netns(netns, srv.start)


def test_kubeadm_command_line_runs_and_exits_when_its_config_changes(
    tmp_path: Path, netns: str
) -> None:
    srv = FakeApiServer(authorizer=set(KUBE_PROXY_PERMISSIONS), bookmark_interval=0.5)
    start_in_netns(srv, netns)
    proc: subprocess.Popen[str] | None = None
    try:
        for file in ("node.yaml", "web.yaml"):
            for doc in yaml.safe_load_all((LAB / "manifests" / file).read_text()):
                srv.create(doc["kind"], doc)
        cfg = yaml.safe_load((LAB / "config.yaml").read_text())
        del cfg["hostnameOverride"]  # the node's name comes from the flag, as with kubeadm
        cfg["clientConnection"] = {"kubeconfig": str(srv.write_kubeconfig(tmp_path / "kc"))}
        cfg["iptables"] = {"minSyncPeriod": "100ms"}
        # Leave the host-wide conntrack limit (and hash size) alone.
        cfg["conntrack"] = {"maxPerCore": 0}
        config = tmp_path / "config.conf"
        config.write_text(yaml.safe_dump(cfg))

        env = {**os.environ, "NODE_NAME": "kind-worker"}
        # The DaemonSet's args, as the kubelet expands $(NODE_NAME) in them.
        argv = [f"--config={config}", f"--hostname-override={env['NODE_NAME']}"]
        log = (tmp_path / "kube-proxy.log").open("w")
        proc = subprocess.Popen(
            ["ip", "netns", "exec", netns, *kube_proxy_command(), *argv],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        wait_until(
            lambda: "KUBE-SVC-LOLE4ISW44XBNF3G" in in_netns(netns, "iptables-save", "-t", "nat"),
            what="the seed Service's rules",
            timeout=15,
        )
        assert proc.poll() is None

        # A ConfigMap edit: the file changes, the process exits for the kubelet to restart it.
        cfg["iptables"]["syncPeriod"] = "45s"
        config.write_text(yaml.safe_dump(cfg))
        assert proc.wait(timeout=5) == 1
        text = (tmp_path / "kube-proxy.log").read_text()
        assert f"the configuration file {config} was written" in text
        # Exiting leaves the rules in place (the restarted process takes over without a gap).
        assert "KUBE-SVC-LOLE4ISW44XBNF3G" in in_netns(netns, "iptables-save", "-t", "nat")
        assert srv.verbs_used() <= set(KUBE_PROXY_PERMISSIONS)

        # --init-only does the start-up work and exits; --cleanup removes every mode's rules.
        def once(*flags: str) -> subprocess.CompletedProcess[str]:
            cmd = ["ip", "netns", "exec", netns, *kube_proxy_command(), *argv, *flags]
            return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=30)

        assert once("--init-only").returncode == 0
        cleaned = once("--cleanup")
        assert cleaned.returncode == 0, cleaned.stderr
        assert "KUBE-SVC-LOLE4ISW44XBNF3G" not in in_netns(netns, "iptables-save", "-t", "nat")
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        srv.stop()
