"""The fuzz suite: Hypothesis profiles (fuzz_profiles) loaded before any test module, and the
``fuzz`` marker on every test here (``-m "not fuzz"`` skips them)."""

from __future__ import annotations

import fuzz_profiles  # noqa: F401  (registers and loads the profile)
import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "fuzz" in item.path.parts:
            item.add_marker(pytest.mark.fuzz)
