"""SyncRunner: rate limiting, periodic full syncs, retries and stop (pure, no root, fast).

The runner waits on threading.Event with real timeouts, so these tests use tiny real
intervals (tens of ms) and, where the decision depends only on the clock, a fake clock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from itertools import pairwise

import pytest

from kubeplex.core.daemon.runner import SyncRunner


class Recorder:
    """A sync function: records (monotonic time, full), consumes the change flag like
    ClusterState.checkout does, and fails the first ``failures`` calls."""

    def __init__(self, changed: threading.Event, failures: int = 0) -> None:
        self.changed = changed
        self.failures = failures
        self.calls: list[tuple[float, bool]] = []
        self._lock = threading.Lock()

    def __call__(self, full: bool) -> bool:
        self.changed.clear()
        with self._lock:
            self.calls.append((time.monotonic(), full))
            return len(self.calls) > self.failures

    @property
    def fulls(self) -> list[bool]:
        with self._lock:
            return [full for _, full in self.calls]

    def count(self) -> int:
        with self._lock:
            return len(self.calls)


def wait_for(predicate: Callable[[], bool], timeout: float = 1.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.002)
    return predicate()


@pytest.fixture
def changed() -> threading.Event:
    return threading.Event()


@pytest.fixture
def running() -> Iterator[Callable[[SyncRunner], threading.Thread]]:
    """Start runner.run() in a thread; stop and join it after the test whatever happens."""
    started: list[tuple[SyncRunner, threading.Thread]] = []

    def start(runner: SyncRunner) -> threading.Thread:
        thread = threading.Thread(target=runner.run, daemon=True)
        thread.start()
        started.append((runner, thread))
        return thread

    yield start
    for runner, thread in started:
        runner.stop()
        thread.join(timeout=1.0)
        assert not thread.is_alive()


def test_first_sync_is_immediate_and_full(
    changed: threading.Event, running: Callable[[SyncRunner], threading.Thread]
) -> None:
    sync = Recorder(changed)
    begin = time.monotonic()
    running(SyncRunner(sync, changed, min_interval=0.05, max_interval=60))
    assert wait_for(lambda: sync.count() == 1)
    assert sync.calls[0][0] - begin < 0.05
    assert sync.fulls == [True]


def test_burst_of_changes_gives_one_rate_limited_sync(
    changed: threading.Event, running: Callable[[SyncRunner], threading.Thread]
) -> None:
    sync = Recorder(changed)
    running(SyncRunner(sync, changed, min_interval=0.1, max_interval=60))
    assert wait_for(lambda: sync.count() == 1)
    for _ in range(20):
        changed.set()
        time.sleep(0.001)
    assert wait_for(lambda: sync.count() == 2)
    time.sleep(0.15)  # long enough for a third sync, were one coming
    assert sync.fulls == [True, False]
    (first, _), (second, _) = sync.calls
    assert second - first >= 0.1 - 0.005  # min_interval after the previous start


def test_change_after_min_interval_syncs_at_once(
    changed: threading.Event, running: Callable[[SyncRunner], threading.Thread]
) -> None:
    sync = Recorder(changed)
    running(SyncRunner(sync, changed, min_interval=0.02, max_interval=60))
    assert wait_for(lambda: sync.count() == 1)
    time.sleep(0.05)
    poked = time.monotonic()
    changed.set()
    assert wait_for(lambda: sync.count() == 2)
    assert sync.calls[1][0] - poked < 0.02
    assert sync.fulls == [True, False]


def test_periodic_full_sync_without_changes(
    changed: threading.Event, running: Callable[[SyncRunner], threading.Thread]
) -> None:
    sync = Recorder(changed)
    running(SyncRunner(sync, changed, min_interval=0.01, max_interval=0.05))
    time.sleep(0.3)
    count = sync.count()
    assert 4 <= count <= 8  # about 0.3 / 0.05 + the first
    assert all(sync.fulls)
    times = [t for t, _ in sync.calls]
    assert min(b - a for a, b in pairwise(times)) >= 0.05 - 0.005


def test_retry_with_backoff_after_failures() -> None:
    changed = threading.Event()
    sync = Recorder(changed, failures=2)
    runner = SyncRunner(sync, changed, min_interval=0.01, max_interval=60, max_backoff=0.02)
    begin = time.monotonic()
    assert runner.sync_with_retry(False)
    assert time.monotonic() - begin < 0.5
    assert sync.fulls == [False, True, True]  # the retries are full
    assert runner.syncs == 3
    assert runner.failures == 2
    times = [t for t, _ in sync.calls]
    assert all(b - a >= 0.015 for a, b in pairwise(times))  # backed off


def test_retries_inside_run(
    changed: threading.Event, running: Callable[[SyncRunner], threading.Thread]
) -> None:
    sync = Recorder(changed, failures=2)
    runner = SyncRunner(sync, changed, min_interval=0.01, max_interval=60, max_backoff=0.02)
    running(runner)
    assert wait_for(lambda: sync.count() == 3)
    time.sleep(0.05)
    assert sync.fulls == [True, True, True]
    assert runner.failures == 2
    changed.set()
    assert wait_for(lambda: sync.count() == 4)
    assert sync.fulls[3] is False  # after a success, syncs are partial again


def test_stop_ends_run_promptly(
    changed: threading.Event, running: Callable[[SyncRunner], threading.Thread]
) -> None:
    sync = Recorder(changed)
    runner = SyncRunner(sync, changed, min_interval=30, max_interval=60)
    thread = running(runner)
    assert wait_for(lambda: sync.count() == 1)
    changed.set()  # the runner now waits out min_interval (30 s)
    time.sleep(0.02)
    begin = time.monotonic()
    runner.stop()
    thread.join(timeout=1.0)
    assert not thread.is_alive()
    assert time.monotonic() - begin < 0.2
    assert runner.stopped
    assert sync.count() == 1


def test_stop_interrupts_a_backoff() -> None:
    changed = threading.Event()
    sync = Recorder(changed, failures=1_000)
    runner = SyncRunner(sync, changed, min_interval=0.01, max_interval=60, max_backoff=30)
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(runner.sync_with_retry(False)))
    thread.start()
    assert wait_for(lambda: sync.count() == 1)
    time.sleep(0.02)  # in the first backoff (0.5 s)
    begin = time.monotonic()
    runner.stop()
    thread.join(timeout=1.0)
    assert not thread.is_alive()
    assert time.monotonic() - begin < 0.2
    assert result == [False]
    assert sync.count() <= 2


def test_no_sync_after_stop_during_backoff() -> None:
    changed = threading.Event()
    sync = Recorder(changed, failures=1_000)
    runner = SyncRunner(sync, changed, min_interval=0.01, max_interval=60, max_backoff=30)
    thread = threading.Thread(target=runner.sync_with_retry, args=(False,))
    thread.start()
    assert wait_for(lambda: sync.count() == 1)
    time.sleep(0.02)
    runner.stop()
    thread.join(timeout=1.0)
    assert sync.count() == 1


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_raising_sync_does_not_end_the_loop(changed: threading.Event) -> None:
    calls: list[bool] = []

    def sync(full: bool) -> bool:
        changed.clear()
        calls.append(full)
        if len(calls) == 1:
            raise RuntimeError("backend exploded")
        return True

    runner = SyncRunner(sync, changed, min_interval=0.01, max_interval=60, max_backoff=0.02)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    try:
        assert wait_for(lambda: len(calls) >= 1)
        changed.set()
        assert wait_for(lambda: len(calls) >= 2, timeout=0.2)
    finally:
        runner.stop()
        thread.join(timeout=1.0)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_full_or_partial_decided_by_the_clock(
    changed: threading.Event, running: Callable[[SyncRunner], threading.Thread]
) -> None:
    clock = FakeClock()
    sync = Recorder(changed)
    running(SyncRunner(sync, changed, min_interval=0.04, max_interval=10, clock=clock))
    assert wait_for(lambda: sync.count() == 1)  # at t=0, full

    clock.now = 5.0  # well after min_interval, before max_interval: partial, at once
    changed.set()
    assert wait_for(lambda: sync.count() == 2, timeout=0.03)

    clock.now = 5.01  # 0.03 s before the rate limit allows another: wait that long (real)
    poked = time.monotonic()
    changed.set()
    assert wait_for(lambda: sync.count() == 3)
    assert sync.calls[2][0] - poked >= 0.025

    clock.now = 20.0  # past max_interval since the last full sync: full
    changed.set()
    assert wait_for(lambda: sync.count() == 4)
    assert sync.fulls == [True, False, False, True]


class ScriptedChange(threading.Event):
    """The runner's ``changed`` event on a fake clock: ``wait`` records its timeout, then a
    change arrives ``arrives_after`` seconds into it (None: none arrives, the wait times out)."""

    def __init__(self, clock: FakeClock, arrives_after: float | None) -> None:
        super().__init__()
        self.clock = clock
        self.arrives_after = arrives_after
        self.waits: list[float] = []
        self._set = False

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.waits.append(timeout)
        if self.arrives_after is None or self.arrives_after > timeout:
            self.clock.now += timeout
            return self._set
        self.clock.now += self.arrives_after
        self._set = True
        return True

    def set(self) -> None:
        self._set = True

    def clear(self) -> None:
        self._set = False

    def is_set(self) -> bool:
        return self._set


def scripted_retry(
    monkeypatch: pytest.MonkeyPatch, arrives_after: float | None
) -> tuple[list[tuple[float, bool]], list[float], ScriptedChange]:
    """One failed sync at t=0 with a 20 s backoff and min_interval 1 s, then its retry.

    Returns the syncs as (fake time, full), the runner's other sleeps, and the event."""
    clock = FakeClock()
    change = ScriptedChange(clock, arrives_after)
    calls: list[tuple[float, bool]] = []

    def sync(full: bool) -> bool:
        change.clear()  # as ClusterState.checkout does
        calls.append((clock.now, full))
        return len(calls) > 1

    runner = SyncRunner(
        sync,
        change,
        min_interval=1.0,
        max_interval=600,
        clock=clock,
        max_backoff=30,
        first_backoff=20,
    )
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        clock.now += max(0.0, seconds)

    monkeypatch.setattr(runner, "_sleep", sleep)
    assert runner.sync_with_retry(False)
    return calls, sleeps, change


def test_a_change_during_a_backoff_retries_after_min_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls, sleeps, change = scripted_retry(monkeypatch, arrives_after=0.3)
    assert change.waits == [20.0]  # the backoff, cut short by the change at t=0.3
    assert sleeps == [pytest.approx(0.7)]  # then the rest of min_interval
    assert calls == [(0.0, False), (pytest.approx(1.0), True)]


def test_a_change_late_in_a_backoff_retries_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls, sleeps, _ = scripted_retry(monkeypatch, arrives_after=5.0)
    assert all(s <= 0 for s in sleeps)  # min_interval is long past: no further wait
    assert calls == [(0.0, False), (5.0, True)]


def test_without_a_change_the_backoff_is_waited_out(monkeypatch: pytest.MonkeyPatch) -> None:
    calls, sleeps, change = scripted_retry(monkeypatch, arrives_after=None)
    assert change.waits == [20.0]
    assert sleeps == []
    assert calls == [(0.0, False), (20.0, True)]


def test_a_change_during_a_long_backoff_is_synced_long_before_it_ends(
    changed: threading.Event, running: Callable[[SyncRunner], threading.Thread]
) -> None:
    sync = Recorder(changed, failures=1)
    runner = SyncRunner(
        sync, changed, min_interval=0.05, max_interval=600, max_backoff=20, first_backoff=20
    )
    running(runner)
    assert wait_for(lambda: sync.count() == 1)  # failed: a 20 s backoff begins
    changed.set()
    # Well inside the 20 s backoff (the bound only keeps a broken runner from hanging).
    assert wait_for(lambda: sync.count() == 2, timeout=10)
    (first, _), (second, _) = sync.calls
    assert second - first >= 0.05 - 0.005  # still rate-limited by min_interval
    assert sync.fulls == [True, True]
    assert runner.failures == 1
