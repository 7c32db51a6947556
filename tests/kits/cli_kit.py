"""Running what an operator runs: the ``kubeplex`` CLI in a subprocess, and commands inside a
network namespace; the lab's configuration and manifests to run it on."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

LAB = Path(__file__).resolve().parents[2] / "testing" / "lab"
#: ``kubeplex render`` of the lab.
RENDER_LAB = ("render", "--config", str(LAB / "config.yaml"), "--manifests", str(LAB / "manifests"))


def kubeplex(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``kubeplex ARGS`` as a child process (exit code and output captured, not checked)."""
    return subprocess.run(
        [sys.executable, "-m", "kubeplex.core.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )


def kube_proxy_command() -> list[str]:
    """The installed ``kube-proxy`` console script (the same entry point otherwise)."""
    script = shutil.which("kube-proxy", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "kubeplex.core.cli.kube_proxy"]


def free_port() -> int:
    """A TCP port free on loopback now (for a server the test starts next)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def in_netns(ns: str, *argv: str) -> str:
    """The output of ``argv`` run in network namespace ``ns`` (it must succeed)."""
    return subprocess.run(
        ["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, check=True
    ).stdout


def wait_until(cond: Callable[[], bool], what: str = "", timeout: float = 20.0) -> None:
    """Poll ``cond`` every 0.1 s until it holds; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")
