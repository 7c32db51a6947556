"""The start-up tricks (kubeplex.core.startup) change how soon a daemon starts, never what it
programs: ``kubeplex run --once`` against the same cluster, with ``KUBEPLEX_STARTUP_TRICKS=0``
and without, writes the same rules, and neither start writes anything beside its modules."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from apiserver import KUBE_PROXY_PERMISSIONS, FakeApiServer
from kits.cli_kit import LAB, in_netns

from kubeplex.core.startup import SWITCH

pytestmark = pytest.mark.kernel


def first_sync(srv: FakeApiServer, tmp_path: Path, netns: str, tricks: str) -> tuple[str, str]:
    """``run --once`` into ``netns`` with the tricks on ("1") or off ("0"): the rules it wrote,
    and what it imported (``-X importtime``)."""
    cfg = yaml.safe_load((LAB / "config.yaml").read_text())
    cfg["mode"] = "nftables"
    cfg["clientConnection"] = {"kubeconfig": str(srv.write_kubeconfig(tmp_path / "kubeconfig"))}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    # No build step ran for this tree of bytecode: the start finds no dataclass methods kept.
    env = dict(os.environ, PYTHONPYCACHEPREFIX=str(tmp_path / "pycache"), **{SWITCH: tricks})
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    argv = ["run", "--once", "--config", str(tmp_path / "config.yaml"), "--netns", netns]
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "kubeplex.core.cli.main", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not list((tmp_path / "pycache").rglob("dataclass-methods.*"))
    return in_netns(netns, "nft", "list", "ruleset"), proc.stderr


def test_a_start_with_the_tricks_off_programs_the_same_rules(
    tmp_path: Path, netns: str, netns2: str
) -> None:
    srv = FakeApiServer(authorizer=set(KUBE_PROXY_PERMISSIONS)).start()
    try:
        for file in ("node.yaml", "servicecidr.yaml", "web.yaml"):
            for doc in yaml.safe_load_all((LAB / "manifests" / file).read_text()):
                srv.create(doc["kind"], doc)
        (tmp_path / "on").mkdir()
        (tmp_path / "off").mkdir()
        with_tricks, imported_with = first_sync(srv, tmp_path / "on", netns, "1")
        without, imported_without = first_sync(srv, tmp_path / "off", netns2, "0")
    finally:
        srv.stop()
    assert "10.96.88.59" in with_tricks  # the lab's web Service
    assert with_tricks == without
    # The switch was heard: kubernetes/__init__ (its dynamic client) ran only without tricks.
    assert "kubernetes.dynamic" not in imported_with
    assert "kubernetes.dynamic" in imported_without
