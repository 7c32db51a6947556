"""Pausing the cyclic garbage collector around work that allocates much and frees little."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["collector_paused"]


@contextlib.contextmanager
def collector_paused(freeze: bool = False) -> Iterator[None]:
    """No collector passes in the block (a render's hundreds of thousands of strings, the
    modules a start imports): what it allocates lives on, so a pass would only scan it.

    With ``freeze``, what is alive at the end is frozen (:func:`gc.freeze`) before the
    collector resumes, so that no pass scans it at all: for what lives as long as the process
    (modules), once in it."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if freeze:
                gc.freeze()
            gc.enable()
