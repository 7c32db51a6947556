"""The one place a backend runs a program: optionally inside a network namespace."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

from kubeplex.core.model.errors import BackendError


def command(argv: Sequence[str], netns: str | None = None) -> list[str]:
    return ["ip", "netns", "exec", netns, *argv] if netns else list(argv)


def run(
    argv: Sequence[str],
    netns: str | None = None,
    input: str | None = None,
    check: bool = True,
    timeout: float = 60.0,
) -> subprocess.CompletedProcess[str]:
    """Run a program; with ``check`` a non-zero exit raises BackendError with its stderr."""
    full = command(argv, netns)
    try:
        proc = subprocess.run(
            full, input=input, capture_output=True, text=True, timeout=timeout, check=False
        )
    except FileNotFoundError as err:
        raise BackendError(f"{argv[0]}: not installed ({err})") from err
    except subprocess.TimeoutExpired as err:
        raise BackendError(f"{argv[0]} timed out after {timeout:.0f}s") from err
    if check and proc.returncode != 0:
        where = f" in netns {netns}" if netns else ""
        raise BackendError(
            f"{' '.join(argv[:2])}{where} failed (exit {proc.returncode}): "
            f"{(proc.stderr or proc.stdout).strip()[:2000]}"
        )
    return proc
