"""``kubeplex run --once`` reading from the API server (the fake one, through the real
``kubernetes`` client) programs a scratch network namespace (tests/api/test_kubeapi_source.py
drives the source without root)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from apiserver import FakeApiServer
from kits.cli_kit import LAB, in_netns
from kits.kubeapi_kit import rbac_server, write_config


@pytest.fixture
def srv(request: pytest.FixtureRequest) -> Iterator[FakeApiServer]:
    yield from rbac_server(request)


@pytest.mark.kernel
def test_run_once_from_the_api_programs_a_namespace(
    srv: FakeApiServer, tmp_path: Path, netns: str
) -> None:
    for file in ("node.yaml", "web.yaml"):
        for doc in yaml.safe_load_all((LAB / "manifests" / file).read_text()):
            srv.create(doc["kind"], doc)
    config = write_config(tmp_path, srv.write_kubeconfig(tmp_path / "kubeconfig"))
    args = ["--config", str(config), "--netns", netns]
    proc = subprocess.run(
        [sys.executable, "-m", "kubeplex.core.cli.main", "run", *args, "--once", "-v", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    try:
        assert proc.returncode == 0, proc.stderr
        assert "initial list complete" in proc.stderr
        saved = in_netns(netns, "iptables-save", "-t", "nat")
        assert "-A KUBE-SVC-LOLE4ISW44XBNF3G" in saved
        assert "--dport 30080" in saved
    finally:
        subprocess.run(
            [sys.executable, "-m", "kubeplex.core.cli.main", "cleanup", *args],
            capture_output=True,
            check=False,
        )
    assert {("list", "services"), ("list", "endpointslices"), ("list", "nodes")} <= srv.verbs_used()
