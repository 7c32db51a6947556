"""An API server's message reaches the log escaped: whatever it holds (a colour, a bell, a
newline that starts a forged record), one record stays one line."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from apiserver import FakeApiServer
from kits.kubeapi_kit import api_source
from kits.logs_kit import root_logger_kept

from kubeplex.core.cli import logs

NODE = "node-a"
FORGED = "\x1b[31mred\x07\r\n2030-01-01 00:00:00,000 ERROR kubeplex: forged"
FORGED_ESCAPED = "\\x1b[31mred\\x07\\r\\n2030-01-01 00:00:00,000 ERROR kubeplex: forged"


@pytest.fixture(autouse=True)
def _restore_root() -> Iterator[None]:
    with root_logger_kept():
        yield


def test_a_forbidden_message_forges_no_log_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # RBAC's 403 quotes the user's name: here one that carries the forgery.
    server = FakeApiServer(authorizer=set(), user=f"system:kube-proxy{FORGED}").start()
    try:
        logs.configure(None, None)
        source = api_source(server, tmp_path, NODE).start()
        err = ""
        try:
            deadline = time.monotonic() + 10
            while "cannot list" not in err and time.monotonic() < deadline:
                time.sleep(0.05)
                err += capsys.readouterr().err
        finally:
            source.stop()
        err += capsys.readouterr().err
    finally:
        server.stop()
    said = [line for line in err.splitlines() if "cannot list" in line]
    assert said, err
    assert [line for line in err.splitlines() if not line.isprintable()] == []
    assert [line for line in err.splitlines() if line.startswith("2030-")] == []
    assert f'User "system:kube-proxy{FORGED_ESCAPED}" cannot list' in said[0]
