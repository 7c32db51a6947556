"""Hypothesis profiles of the fuzz suite (HYPOTHESIS_PROFILE selects one; "ci" by default).

"ci" is what .ci/run runs: a fixed number of examples per property, derandomized and without an
example database, so every run tries the same inputs. "deep" is for long runs by hand.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_SLOW_DATA = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example]

settings.register_profile(
    "ci",
    max_examples=150,
    derandomize=True,
    database=None,
    deadline=5000,  # ms per example: a stall, not a speed check (the machine is shared)
    suppress_health_check=_SLOW_DATA,
    print_blob=True,
)
settings.register_profile(
    "deep",
    max_examples=5_000,
    derandomize=False,
    deadline=10_000,
    suppress_health_check=_SLOW_DATA,
    print_blob=True,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def scaled(fraction: float, *, deadline_ms: int | None = None) -> settings:
    """The loaded profile with a share of its examples (for properties that cost more per
    example, like those through the API server), and a longer deadline if given."""
    current = settings()
    return settings(
        current,
        max_examples=max(10, int(current.max_examples * fraction)),
        deadline=current.deadline if deadline_ms is None else deadline_ms,
    )
