"""Keeping the cyclic collector off the long-lived graph without keeping garbage for good.

After a full sync the graph and the render caches live until the next one: gc.freeze() moves
every live object to the permanent generation, so the collector does not scan them again and
again. But the collector never examines frozen objects at all. A reference cycle frozen while
it was pending (the collector is paused during a sync, for every thread: the watches and HTTP
servers make cycles meanwhile), or alive then and dropped later (a watch's response, a
request's frames), would stay in memory for good — one more batch at every full sync.

So now and then, at a full sync, the frozen objects get one full collection before the new
freeze: what they hold in cycles is freed within ``interval``, and the collection, which scans
the whole graph, runs at most once per interval however short the syncPeriod.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

#: Seconds between full collections of the frozen generation: frozen cycles live at most this
#: long. A collection at 10,000 Services scans ~500,000 objects (a fraction of a full render).
COLLECT_INTERVAL = 60.0


def _malloc_trim() -> Callable[[], object]:
    """glibc's malloc_trim(0), or a no-op where there is none: after a full sync's garbage is
    freed, it hands the free pages inside the heap back to the kernel, so RSS follows what is
    alive instead of the highest sync's peak (fragmentation)."""
    # Looked up at the first collection, not at start: ctypes and ctypes.util cost about
    # 10 ms to import, on the path to the first sync. The C library is in the process.
    import ctypes

    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return lambda: None
    trim.argtypes = [ctypes.c_size_t]
    return lambda: trim(0)


class Freezer:
    def __init__(
        self, interval: float = COLLECT_INTERVAL, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval = interval
        self._clock = clock
        self._last = clock()
        self.collections = 0
        self._trim: Callable[[], object] | None = None

    def after_full_sync(self) -> None:
        """Freeze what is alive now; first collect the frozen generation if it is due."""
        now = self._clock()
        if now - self._last >= self.interval:
            started = time.monotonic()
            gc.unfreeze()  # back to the oldest generation, where a full collection sees them
            found = gc.collect()
            if self._trim is None:
                self._trim = _malloc_trim()
            self._trim()
            self._last = now
            self.collections += 1
            log.debug(
                "collected %d unreachable objects in %.1f ms",
                found,
                (time.monotonic() - started) * 1000,
            )
        gc.freeze()
