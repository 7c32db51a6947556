"""A client-side rate limit on requests to the API server, as client-go's ``flowcontrol`` has.

The Python client has none of its own: ``clientConnection.qps``/``burst`` drive one bucket in
front of every list and watch request, and the event recorder keeps one per object.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class TokenBucket:
    """client-go's flowcontrol token bucket: ``burst`` requests at once, ``qps`` sustained.

    ``qps <= 0`` disables the limit (as client-go does for a negative QPS).
    """

    def __init__(self, qps: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.qps = qps
        self.burst = max(1, burst)
        self._clock = clock
        self._tokens = float(self.burst)
        self._last = clock()
        self._lock = threading.Lock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.qps)
        self._last = now

    def reserve(self) -> float:
        """Take a token; return how long to wait before using it (0: now)."""
        if self.qps <= 0:
            return 0.0
        with self._lock:
            self._refill()
            self._tokens -= 1.0
            return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    def try_acquire(self) -> bool:
        """Take a token only if one is available now."""
        if self.qps <= 0:
            return True
        with self._lock:
            self._refill()
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return True
            return False

    def acquire(self, stop: threading.Event | None = None) -> bool:
        """Wait for a token; False if ``stop`` was set meanwhile."""
        delay = self.reserve()
        if delay <= 0:
            return stop is None or not stop.is_set()
        if stop is None:
            time.sleep(delay)
            return True
        return not stop.wait(delay)
