"""The fake API server as the Kubernetes API source's tests use it: granting only what
kube-proxy's RBAC grants, and checking afterwards that nothing more was asked for; and a
configuration of the lab that reads from it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from apiserver import KUBE_PROXY_PERMISSIONS, FakeApiServer

from kits.cli_kit import LAB
from kubeplex.core.config.kubeproxy import default_config
from kubeplex.core.sources.kubeapi import KubeApiSource


def rbac_server(request: pytest.FixtureRequest) -> Iterator[FakeApiServer]:
    """A started server with test-short waits, overridden by ``request.param`` (a ``srv``
    fixture yields from this, so tests can parametrize it indirectly)."""
    knobs: dict[str, Any] = {"bookmark_interval": 0.2, "too_large_rv_wait": 0.2}
    knobs.update(getattr(request, "param", {}))
    server = FakeApiServer(authorizer=set(KUBE_PROXY_PERMISSIONS), **knobs).start()
    try:
        yield server
        # Every test proves kubeplex stays within kube-proxy's RBAC.
        assert server.verbs_used() <= KUBE_PROXY_PERMISSIONS, server.verbs_used()
        assert not [r for r in server.requests if r.status == 403]
    finally:
        server.stop()


def write_config(tmp_path: Path, kubeconfig: Path) -> Path:
    cfg = yaml.safe_load((LAB / "config.yaml").read_text())
    cfg["clientConnection"] = {"kubeconfig": str(kubeconfig)}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


#: The API source's knobs in tests: fast retries and short timeouts, small pages.
SOURCE_KNOBS: dict[str, Any] = {
    "qps": 500.0,
    "burst": 50,
    "watch_timeout": 30.0,
    "page_size": 2,
    "backoff_initial": 0.05,
    "backoff_max": 0.3,
    "connect_timeout": 2.0,
    "request_timeout": 10.0,
}


def api_source(srv: FakeApiServer, tmp_path: Path, node: str, **knobs: Any) -> KubeApiSource:
    """A source (not started) reading ``srv`` through a kubeconfig, with ``SOURCE_KNOBS``
    (each overridable)."""
    kubeconfig = srv.write_kubeconfig(tmp_path / "kubeconfig")
    cfg = default_config()
    cfg = replace(cfg, client_connection=replace(cfg.client_connection, kubeconfig=str(kubeconfig)))
    return KubeApiSource.from_config(cfg, node, **{**SOURCE_KNOBS, **knobs})
