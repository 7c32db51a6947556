"""The conformance kit against every in-tree Linux backend: one test, every case, every mode.

The modes are the packaged trust list's entries for Linux. Render cases need no root (the kit
applies to the mode's fake kernel); kernel cases are marked ``kernel`` and share one namespace
lab per mode (dual-stack where the backend declares ``ipv6``), reset before each case. Cases a
mode cannot do are skipped by its declared capabilities, never by its name.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kubeplex.core.dataplane import plugins
from kubeplex.testing.conformance import Case, ModeKit, linux_modes, params
from kubeplex.testing.conformance.harness import run_or_skip

#: The in-tree backends are the packaged trust list's, whatever this machine has configured.
IN_TREE = plugins.packaged_trust_file()


@pytest.fixture(scope="module", params=linux_modes(IN_TREE))
def kit(request: pytest.FixtureRequest) -> Iterator[ModeKit]:
    if request.param not in plugins.available():
        pytest.skip(f"mode {request.param}: no backend installed")
    with ModeKit(request.param, IN_TREE) as kit:
        yield kit


@pytest.mark.parametrize("case", params())
def test_conformance(kit: ModeKit, case: Case) -> None:
    run_or_skip(kit, case)
