"""A bounded-frequency sync runner, like upstream's BoundedFrequencyRunner.

* a change triggers a sync, but no sooner than ``min_interval`` after the previous one starts
  (bursts of events collapse into one sync);
* a full resync runs every ``max_interval`` even with no change;
* a failed sync is retried with exponential backoff (tenacity); the sync function itself keeps
  the last good rules in place and makes the retry a full one. A change that arrives during a
  backoff ends it: the retry runs at once (no sooner than ``min_interval`` after the last
  start), as upstream's runner runs on a change whatever retry is pending.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from tenacity import RetryCallState, Retrying, retry_if_result, wait_exponential

log = logging.getLogger(__name__)

#: ``sync(full) -> ok``
SyncFn = Callable[[bool], bool]


class SyncRunner:
    def __init__(
        self,
        sync: SyncFn,
        changed: threading.Event,
        min_interval: float,
        max_interval: float,
        clock: Callable[[], float] = time.monotonic,
        max_backoff: float = 30.0,
        first_backoff: float | None = None,
    ) -> None:
        self._sync = sync
        self._changed = changed
        self.min_interval = min_interval
        self.max_interval = max_interval
        self.max_backoff = max(max_backoff, min_interval)
        #: The first retry's wait; each further one doubles it, up to max_backoff.
        self.first_backoff = max(min_interval, 0.5) if first_backoff is None else first_backoff
        self._clock = clock
        self._stop = threading.Event()
        self._last_start = float("-inf")
        self._last_full = float("-inf")
        self.syncs = 0
        self.failures = 0

    def stop(self) -> None:
        self._stop.set()
        self._changed.set()  # wake the loop

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def _sleep(self, seconds: float) -> None:
        # An interruptible sleep, so stop() ends a backoff at once.
        self._stop.wait(max(0.0, seconds))

    def _backoff(self, seconds: float) -> None:
        """Wait before a retry: until ``seconds`` pass, the runner stops, or a change arrives.

        A change must not wait out the whole backoff (its rules would be late by up to
        max_backoff, /healthz 503 meanwhile); it still waits for ``min_interval``.
        """
        if not self._changed.wait(max(0.0, seconds)) or self._stop.is_set():
            return
        self._sleep(self._last_start + self.min_interval - self._clock())

    def _run_once(self, full: bool) -> bool:
        self._last_start = self._clock()
        if full:
            self._last_full = self._last_start
        self.syncs += 1
        try:
            ok = self._sync(full)
        except Exception:  # a bug in one sync must not end the loop: retry it
            log.exception("sync raised")
            ok = False
        if not ok:
            self.failures += 1
        return ok

    def sync_with_retry(self, full: bool) -> bool:
        """One sync; on failure retry with backoff until it succeeds or the runner stops."""
        if self._run_once(full):
            return True  # the common case builds no retry state (tenacity's holds cycles)
        return self._retry()

    def _retry(self) -> bool:
        def stopped(_: RetryCallState) -> bool:
            return self._stop.is_set()

        retrying = Retrying(
            retry=retry_if_result(lambda ok: ok is False),
            wait=wait_exponential(multiplier=self.first_backoff, max=self.max_backoff),
            stop=stopped,
            sleep=self._backoff,
            retry_error_callback=lambda state: False,
            before_sleep=lambda state: log.warning(
                "sync failed (attempt %d); retrying with a full sync in %.1fs, or on a change",
                state.attempt_number,
                state.upcoming_sleep,
            ),
        )
        first = True

        def attempt() -> bool:
            nonlocal first
            if first:  # the attempt that failed already: tenacity counts it and backs off
                first = False
                return False
            if self._stop.is_set():
                return False  # stopped during the backoff: no more syncs
            # Every retry is full: the failed apply may have left the backend unsure.
            return self._run_once(True)

        return bool(retrying(attempt))

    def run(self) -> None:
        """Loop until stop(): sync on change (rate-limited) and every max_interval."""
        while not self._stop.is_set():
            now = self._clock()
            due_full = self._last_full + self.max_interval
            self._changed.wait(timeout=max(0.0, due_full - now))
            if self._stop.is_set():
                break
            earliest = self._last_start + self.min_interval
            if self._clock() < earliest:
                self._sleep(earliest - self._clock())
                if self._stop.is_set():
                    break
            self.sync_with_retry(self._clock() >= self._last_full + self.max_interval)
