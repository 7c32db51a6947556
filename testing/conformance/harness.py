"""The kit from pytest: test functions and classes a backend package's tests assign."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from kubeplex.testing.conformance.common import Case, Skip
from kubeplex.testing.conformance.render import RENDER_CASES
from kubeplex.testing.conformance.runner import ALL_CASES, KERNEL_CASES, ModeKit

PluginsFile = str | os.PathLike[str] | None


def run_or_skip(kit: ModeKit, case: Case) -> None:
    """One case as a pytest test: a kit Skip is a pytest skip."""
    try:
        kit.run_case(case)
    except Skip as err:
        pytest.skip(str(err))


def params(cases: Sequence[Case] = ALL_CASES) -> list[Any]:
    """``pytest.param`` of each case, id'd by its name; kernel cases marked ``kernel``."""
    return [
        pytest.param(c, id=c.name, marks=[pytest.mark.kernel] if c.suite == "kernel" else [])
        for c in cases
    ]


def render_contract_tests(mode: str, *, plugins_file: PluginsFile = None) -> Callable[..., None]:
    """A pytest test function, one test per render check: ``test_x = render_contract_tests(m)``."""

    @pytest.mark.parametrize("case", params(RENDER_CASES))
    def test_render_contract(case: Case) -> None:
        with ModeKit(mode, plugins_file) as kit:
            run_or_skip(kit, case)

    return test_render_contract


def kernel_tests(mode: str, *, plugins_file: PluginsFile = None) -> type:
    """A pytest test class (one lab for all its tests), marked ``kernel``:
    ``TestKernel = kernel_tests(mode)``."""

    @pytest.mark.kernel
    class KernelConformance:
        kit: ModeKit

        @classmethod
        def setup_class(cls) -> None:
            cls.kit = ModeKit(mode, plugins_file)

        @classmethod
        def teardown_class(cls) -> None:
            cls.kit.close()

        @pytest.mark.parametrize("case", params(KERNEL_CASES))
        def test_kernel(self, case: Case) -> None:
            run_or_skip(self.kit, case)

    return KernelConformance
