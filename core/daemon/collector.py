"""Pausing the cyclic garbage collector around work that allocates much and frees little."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["collector_paused"]


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No collector passes in the block (a render's hundreds of thousands of strings, the
    modules a start imports): what it allocates lives on, so a pass would only scan it."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
