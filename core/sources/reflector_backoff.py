"""How long a reflector waits before it lists again: client-go's reflector backoff.

client-go's Reflector runs ListAndWatch under ``wait.BackoffUntil`` with
``wait.NewExponentialBackoffManager(800ms, 30s, 2m, 2.0, 1.0)``: every list-and-watch round
that ends (a list that failed, a watch that expired with 410 or broke) is followed by the next
step before the next list. A step is 0.8 s, doubling up to 30 s, each jittered by up to as much
again (``wait.Jitter``: d + rand * d, so the longest wait is under 60 s); when no step was taken
for 2 minutes the steps start over at 0.8 s. The same steps pace a watch the server refuses
(connection refused, 429) before it is asked for again.

tenacity's waits do not fit: they are a function of the attempt number of one retried call,
which starts over as soon as the call succeeds, where these steps go on across rounds whose list
succeeded (a list that works followed by a watch that expires at once is the storm this
prevents) and start over only after 2 minutes without a step. Nor is their jitter client-go's:
``wait_exponential_jitter`` adds a fixed amount and caps after it, ``wait_random_exponential``
draws from [0, d).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

#: client-go's reflector: NewExponentialBackoffManager(800ms, 30s, 2m, 2.0, 1.0, clock).
INITIAL = 0.8
CAP = 30.0
RESET_AFTER = 120.0
FACTOR = 2.0
JITTER = 1.0

#: Waits ``seconds`` or until the event is set; whether it was set (``threading.Event.wait``).
Sleep = Callable[[threading.Event, float], bool]


def wait_or_stop(stop: threading.Event, seconds: float) -> bool:
    return stop.wait(seconds)


class ReflectorBackoff:
    """One reflector's backoff steps (not thread-safe: one reflector thread uses it)."""

    def __init__(
        self,
        initial: float = INITIAL,
        cap: float = CAP,
        *,
        reset_after: float = RESET_AFTER,
        factor: float = FACTOR,
        jitter: float = JITTER,
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
        sleep: Sleep = wait_or_stop,
    ) -> None:
        self.initial = initial
        self.cap = cap
        self.reset_after = reset_after
        self.factor = factor
        self.jitter = jitter
        self._clock = clock
        self._rand = rand
        self._sleep = sleep
        self._duration = initial
        #: the duration reached the cap: it stays there until a reset
        self._capped = False
        self._last_step = clock()

    def step(self) -> float:
        """The next wait: this step's duration, jittered; the duration doubles for the next."""
        now = self._clock()
        if now - self._last_step > self.reset_after:
            self._duration, self._capped = self.initial, False
        self._last_step = now
        duration = self._duration
        if not self._capped:
            self._duration = duration * self.factor
            if self._duration > self.cap:
                self._duration, self._capped = self.cap, True
        if self.jitter > 0:
            return duration + self._rand() * self.jitter * duration
        return duration

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        """Wait out a step unless ``stop`` is set first; whether it was."""
        return self._sleep(stop, seconds)
