"""What ``kubeplex run`` says while the API server does not answer: where the address it
dials is the ``kubernetes`` Service, which only a proxy makes reachable, it says what to set."""

from __future__ import annotations

import logging
import signal
from pathlib import Path

import pytest
from apiserver import FakeApiServer
from kits.kubeapi_kit import write_config

import kubeplex.core.cli.main as cli
from kubeplex.core.cli import run as run_command


def in_a_pod_told(service_ip: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The variables the kubelet gives a pod for a ``kubernetes`` Service at ``service_ip``."""
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", service_ip)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setenv("KUBERNETES_PORT", f"tcp://{service_ip}:443")


def run_once_unanswered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> tuple[str, list[logging.LogRecord]]:
    """``run --once`` against an address nothing listens on; its URL and the log records."""
    srv = FakeApiServer().start()
    config = write_config(tmp_path, srv.write_kubeconfig(tmp_path / "kubeconfig"))
    srv.stop()  # nothing listens on that port any more
    monkeypatch.setattr(run_command, "ONCE_SYNC_TIMEOUT", 1.0)
    monkeypatch.setattr(run_command, "SYNC_WAIT_LOG_INTERVAL", 0.3)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with caplog.at_level(logging.WARNING, logger="kubeplex"):
            assert cli.main(["run", "--config", str(config), "--once"]) == cli.EXIT_SYNC_FAILED
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    said = [r for r in caplog.records if "Kubernetes API at" in r.getMessage()]
    return srv.url, said


def test_waiting_for_the_kubernetes_service_says_what_to_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The kubelet's variables name the Service's ClusterIP, the address dialed (here a port on
    # loopback nothing listens on: the test sends nothing off the machine).
    in_a_pod_told("127.0.0.1", monkeypatch)
    url, said = run_once_unanswered(tmp_path, monkeypatch, caplog)
    waiting = [r.getMessage() for r in said if r.getMessage().startswith("waiting for")]
    assert waiting, [r.getMessage() for r in said]
    for message in [*waiting, said[-1].getMessage()]:  # every wait, and the giving up
        assert f"at {url}" in message
        assert "127.0.0.1 is the `kubernetes` Service's ClusterIP" in message
        assert "apiServer.host and apiServer.port" in message
        assert "--master https://HOST:PORT" in message
    assert said[-1].getMessage().startswith("no initial sync")


def test_waiting_for_the_api_server_itself_says_only_that(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    in_a_pod_told("10.96.0.1", monkeypatch)
    _, said = run_once_unanswered(tmp_path, monkeypatch, caplog)
    assert len(said) >= 2
    assert not [r for r in said if "apiServer.host" in r.getMessage()]
