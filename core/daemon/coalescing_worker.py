"""A worker thread that runs jobs per key, at most one waiting per key: a job submitted while
its key's last one still waits is merged into it, so a burst of submissions costs one run,
and whoever submits never waits for a run."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
J = TypeVar("J")


class CoalescingWorker(Generic[K, J]):
    """Runs ``run(key, job)`` on its own thread (started at the first ``submit``), keys in the
    order they were queued; ``merge(waiting, newer)`` folds a newer job into a waiting one."""

    def __init__(
        self, run: Callable[[K, J], None], merge: Callable[[J, J], J], *, name: str
    ) -> None:
        self._run = run
        self._merge = merge
        self._name = name
        self._waiting: dict[K, J] = {}  # (dicts keep insertion order: first queued, first run)
        self._busy = False
        self._closed = False
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        #: Jobs folded into a waiting one (for logs and tests).
        self.merged = 0

    def submit(self, key: K, job: J) -> None:
        with self._cond:
            if self._closed:
                raise RuntimeError(f"{self._name}: closed")
            waiting = self._waiting.get(key)
            if waiting is None:
                self._waiting[key] = job
            else:
                self._waiting[key] = self._merge(waiting, job)
                self.merged += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until nothing runs or waits; False if ``timeout`` passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: not (self._waiting or self._busy), timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Drop the waiting jobs and end the thread (a run in progress finishes first, for up
        to ``timeout`` seconds); idempotent."""
        with self._cond:
            self._closed = True
            self._waiting.clear()
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._busy = False
                self._cond.notify_all()
                self._cond.wait_for(lambda: self._waiting or self._closed)
                if self._closed:
                    return
                key = next(iter(self._waiting))
                job = self._waiting.pop(key)
                self._busy = True
            try:
                self._run(key, job)
            except Exception:  # the next job must still run
                log.exception("%s: a job failed", self._name)
