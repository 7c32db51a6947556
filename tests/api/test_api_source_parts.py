"""The API source's parts each live in a module of their own and stand without the reflector:
a piece that starts importing the rest of the source (or the Kubernetes client, for the pure
ones) has grown a second idea."""

from __future__ import annotations

import subprocess
import sys

import pytest

SOURCES = "kubeplex.core.sources."
#: The reflector: no part imports it.
REFLECTOR = {"kubeapi", "reflector_backoff"}

#: Each part, the other parts it may bring along, and whether it needs the Kubernetes client.
PARTS = {
    "token_bucket": (set(), False),
    "list_decoder": (set(), False),
    "gated_cluster": (set(), False),
    "api_errors": (set(), True),
    "event_recorder": ({"api_errors", "token_bucket"}, True),
}

LOADED = """
import importlib, sys
importlib.import_module(sys.argv[1])
print(" ".join(sorted(m for m in sys.modules if m.startswith(sys.argv[2]))))
print("kubernetes" in sys.modules)
"""


def loaded_with(part: str) -> tuple[set[str], bool]:
    """The parts of the source (and the reflector) a fresh interpreter holds after importing
    ``part`` besides it, and whether it loaded the Kubernetes client."""
    out = subprocess.run(
        [sys.executable, "-c", LOADED, SOURCES + part, SOURCES],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    modules = {m.removeprefix(SOURCES) for m in out[0].split()}
    return modules & (set(PARTS) | REFLECTOR) - {part}, out[1] == "True"


@pytest.mark.parametrize("part", sorted(PARTS))
def test_each_part_stands_without_the_reflector(part: str) -> None:
    assert loaded_with(part) == PARTS[part]
