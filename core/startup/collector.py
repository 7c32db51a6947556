"""The one owner of the cyclic garbage collector's switch.

Work that allocates much and frees little (a start's imports, the initial lists' decoding, a
sync's graphs and render) runs with the collector paused: each pass would scan what it made and
find little garbage. Pauses overlap, across threads (the source's lists end on one of its
threads), so they are counted: the collector is on again when the last one ends, and only if it
was on when the first began; no pause can turn it on under another.

What a start makes (modules, the cluster's objects from the initial lists) lives as long as the
process: it is frozen once (:func:`gc.freeze`), after the initial lists, so that no pass scans
it again. Freezing again at every sync would keep for good every reference cycle pending then.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

from kubeplex.core.startup import enabled

__all__ = ["Pause", "collector_paused", "freeze_once"]

_lock = threading.Lock()
#: Pauses begun and not ended yet.
_pauses = 0
#: Whether the collector was on when the first of the current pauses began.
_was_on = False
#: Whether :func:`freeze_once` has frozen.
_frozen = False


class Pause:
    """The collector paused from now until :meth:`end` (a no-op with the tricks off)."""

    __slots__ = ("_open",)

    def __init__(self) -> None:
        global _pauses, _was_on
        self._open = enabled()
        if not self._open:
            return
        with _lock:
            if _pauses == 0:
                _was_on = gc.isenabled()
                gc.disable()
            _pauses += 1

    def end(self) -> bool:
        """Ends this pause; only the first call counts (whoever comes first, from any thread).
        True if it ended it."""
        global _pauses
        with _lock:
            if not self._open:
                return False
            self._open = False
            _pauses -= 1
            if _pauses == 0 and _was_on:
                gc.enable()
            return True


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No collector passes in the block (unless the tricks are off)."""
    pause = Pause()
    try:
        yield
    finally:
        pause.end()


def freeze_once() -> bool:
    """Freezes what is alive now, the first time it is called in the process (with the tricks
    on): what the start made, after the initial lists. True if this call froze."""
    global _frozen
    with _lock:
        if _frozen or not enabled():
            return False
        _frozen = True
        gc.freeze()
        return True
