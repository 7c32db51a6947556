"""Backends as plugins, for the tests that load them (tests/unit/test_plugins.py) and run a node
on one (tests/kernel/test_plugins_kernel.py): the example backend's trust-list entry, a trust
list of one's own, and ``kubeplex`` with a given PYTHONPATH."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from kits import cli_kit
from kubeplex.core.dataplane import plugins

RECORDING = """
[backends.recording]
entry-point = "kubeplex_example_backend:RecordingBackend"
platform = "linux"
capabilities = ["ipv6", "render-only"]
"""


def own_trust_list(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test starts from the packaged default, whatever this machine has configured (an
    autouse fixture yields from this)."""
    monkeypatch.delenv(plugins.ENV_VAR, raising=False)
    monkeypatch.setattr(plugins, "SYSTEM_TRUST_FILE", Path("/nonexistent/kubeplex/plugins.toml"))
    plugins.use_trust_file(None)
    yield
    plugins.use_trust_file(None)


def require_example() -> None:
    """The example backend, installed as a third party would install it (skips, or fails in CI,
    without it)."""
    if "recording" not in plugins.available():
        message = "pip install tests/plugins/kubeplex-example-backend (scripts/setup.sh does)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


def write_trust(path: Path, *entries: str, with_default: bool = False) -> Path:
    base = Path(plugins.packaged_trust_file()).read_text() if with_default else "version = 1\n"
    path.write_text(base + "".join(entries))
    return path


def kubeplex(
    *args: str, path: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k != plugins.ENV_VAR}
    if path is not None:
        full_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(path), os.environ.get("PYTHONPATH", "")) if p
        )
    full_env.update(env or {})
    return cli_kit.kubeplex(*args, env=full_env, timeout=60)
