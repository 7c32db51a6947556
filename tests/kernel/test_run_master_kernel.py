"""``kubeplex run --master``: a node whose pods cannot reach the API server through the
``kubernetes`` Service (no proxy has programmed it yet) is given the API server's own address.

Each case runs in a namespace whose only link is loopback, where the test API server listens:
the in-cluster address 10.96.0.1 that the kubelet's variables and the kubeconfig name is
unreachable there, as it is on a node without kube-proxy, so only ``--master`` gets the lists.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from apiserver import KUBE_PROXY_PERMISSIONS, TLS_CERT, FakeApiServer
from kits.cli_kit import LAB, in_netns, kube_proxy_command, wait_until

from kubeplex.core.dataplane.netns import run_in_netns

pytestmark = pytest.mark.kernel

#: What the kubelet gives every pod for the ``kubernetes`` Service of a kind cluster.
IN_CLUSTER_ENV = {
    "KUBERNETES_SERVICE_HOST": "10.96.0.1",
    "KUBERNETES_SERVICE_PORT": "443",
    "KUBERNETES_PORT": "tcp://10.96.0.1:443",
}
SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
SEED_CHAIN = "KUBE-SVC-LOLE4ISW44XBNF3G"


def seeded_server(netns: str, **knobs: object) -> FakeApiServer:
    """A server on the namespace's loopback holding the lab's node and Service, granting only
    what kube-proxy's role grants."""
    srv = FakeApiServer(authorizer=set(KUBE_PROXY_PERMISSIONS), **knobs)  # type: ignore[arg-type]
    run_in_netns(netns, srv.start)
    for file in ("node.yaml", "web.yaml"):
        for doc in yaml.safe_load_all((LAB / "manifests" / file).read_text()):
            srv.create(doc["kind"], doc)
    return srv


def write_config(tmp_path: Path, kubeconfig: Path | None = None) -> Path:
    cfg = yaml.safe_load((LAB / "config.yaml").read_text())
    cfg["conntrack"] = {"maxPerCore": 0}  # a daemon leaves the host-wide conntrack limit alone
    if kubeconfig is not None:
        cfg["clientConnection"] = {"kubeconfig": str(kubeconfig)}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def kubeconfig_naming_the_service(srv: FakeApiServer, tmp_path: Path) -> Path:
    """A kubeconfig with ``srv``'s credentials and CA, whose server is the in-cluster address."""
    kubeconfig = srv.write_kubeconfig(tmp_path / "kubeconfig")
    doc = json.loads(kubeconfig.read_text())
    doc["clusters"][0]["cluster"]["server"] = "https://10.96.0.1:443"
    kubeconfig.write_text(json.dumps(doc))
    return kubeconfig


def run_once(
    netns: str, *args: str, wrap: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """``kubeplex run --once ARGS`` in ``netns`` with the kubelet's in-cluster variables."""
    argv = ["ip", "netns", "exec", netns, *wrap]
    argv += [sys.executable, "-m", "kubeplex.core.cli.main", "run", "--once", *args]
    env = {**os.environ, **IN_CLUSTER_ENV}
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


def test_master_reaches_the_api_where_the_in_cluster_address_does_not(
    tmp_path: Path, netns: str
) -> None:
    srv = seeded_server(netns)
    try:
        done = run_once(netns, "--config", str(write_config(tmp_path)), "--master", srv.url)
        assert done.returncode == 0, done.stderr
        assert SEED_CHAIN in in_netns(netns, "iptables-save", "-t", "nat")
        # No service account is mounted here: the address alone, as client-go makes it.
        assert {r.headers.get("Authorization") for r in srv.requests} == {None}
    finally:
        srv.stop()


def test_master_overrides_the_kubeconfig_s_server_and_keeps_its_credentials(
    tmp_path: Path, netns: str
) -> None:
    srv = seeded_server(netns, tls=True, token="s3cret")
    try:
        config = write_config(tmp_path, kubeconfig_naming_the_service(srv, tmp_path))
        # A host:port pair: https, since the kubeconfig has a CA (client-go's default).
        done = run_once(netns, "--config", str(config), "--master", f"127.0.0.1:{srv.port}")
        assert done.returncode == 0, done.stderr
        assert SEED_CHAIN in in_netns(netns, "iptables-save", "-t", "nat")
        assert srv.find_requests("list", "services")[0].status == 200
    finally:
        srv.stop()


def test_kube_proxy_s_master_overrides_the_kubeconfig_s_server_for_good(
    tmp_path: Path, netns: str
) -> None:
    # Every credential refresh (before each request) loads the kubeconfig's server again:
    # --master must outlast it, in every reflector thread.
    srv = seeded_server(netns, tls=True, token="s3cret")
    proc: subprocess.Popen[str] | None = None
    try:
        config = write_config(tmp_path, kubeconfig_naming_the_service(srv, tmp_path))
        argv = ["ip", "netns", "exec", netns, *kube_proxy_command()]
        argv += [f"--config={config}", f"--master={srv.url}"]
        log = (tmp_path / "kube-proxy.log").open("w")
        env = {**os.environ, **IN_CLUSTER_ENV}
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        wait_until(
            lambda: SEED_CHAIN in in_netns(netns, "iptables-save", "-t", "nat"),
            what="the seed Service's rules",
            timeout=30,
        )
        assert "10.96.0.1" not in (tmp_path / "kube-proxy.log").read_text()
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)
        srv.stop()


def test_a_pod_s_service_account_goes_to_the_master_address(tmp_path: Path, netns: str) -> None:
    srv = seeded_server(netns, tls=True, token="s3cret")
    try:
        secrets = tmp_path / "serviceaccount"
        secrets.mkdir()
        (secrets / "token").write_text("s3cret")
        (secrets / "ca.crt").write_bytes(TLS_CERT.read_bytes())
        # The service account mounted where a pod has it, in a mount namespace of its own.
        mount = (
            f"mount -t tmpfs kubeplex-test /run && mkdir -p {SERVICE_ACCOUNT} && "
            f'cp {secrets}/token {secrets}/ca.crt {SERVICE_ACCOUNT}/ && exec "$@"'
        )
        wrap = ("unshare", "--mount", "--propagation", "private", "sh", "-c", mount, "sh")
        config = write_config(tmp_path)
        done = run_once(netns, "--config", str(config), "--master", srv.url, wrap=wrap)
        assert done.returncode == 0, done.stderr
        assert SEED_CHAIN in in_netns(netns, "iptables-save", "-t", "nat")
        assert srv.find_requests("list", "services")[0].status == 200
        assert not Path(SERVICE_ACCOUNT).exists()  # the node's own /run is untouched
    finally:
        srv.stop()


def test_a_master_that_is_no_address_is_refused_by_name(tmp_path: Path, netns: str) -> None:
    done = run_once(netns, "--config", str(write_config(tmp_path)), "--master", "https://h/api")
    assert done.returncode == 4
    assert "--master 'https://h/api': must be a URL or a host:port pair" in done.stderr
    assert "Traceback" not in done.stderr
