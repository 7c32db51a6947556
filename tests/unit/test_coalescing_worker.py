"""The worker that runs the conntrack cleanups off the sync loop: one job waits per key, a
newer one is folded into it, the submitter never waits."""

from __future__ import annotations

import threading

import pytest

from kubeplex.core.daemon.coalescing_worker import CoalescingWorker


class Recorder:
    """Runs jobs into ``ran``; the first run is held until ``go`` (so the next ones wait)."""

    def __init__(self, fail: str = "") -> None:
        self.ran: list[tuple[str, tuple[int, ...]]] = []
        self.running = threading.Event()
        self.go = threading.Event()
        self.fail = fail

    def run(self, key: str, job: tuple[int, ...]) -> None:
        self.running.set()
        assert self.go.wait(10)
        self.ran.append((key, job))
        if key == self.fail:
            raise RuntimeError(f"job {key} broke")


def worker(rec: Recorder) -> CoalescingWorker[str, tuple[int, ...]]:
    return CoalescingWorker(rec.run, lambda old, new: old + new, name="test-worker")


def test_jobs_behind_a_running_one_are_folded_per_key_and_run_in_first_queued_order() -> None:
    rec = Recorder()
    w = worker(rec)
    try:
        w.submit("v4", (1,))
        assert rec.running.wait(5)  # held: everything below waits behind it
        for key, n in (("v6", 2), ("v4", 3), ("v6", 4), ("v4", 5)):
            w.submit(key, (n,))
        assert w.merged == 2 and rec.ran == []
        rec.go.set()
        assert w.wait_idle(5)
    finally:
        rec.go.set()
        w.close()
    assert rec.ran == [("v4", (1,)), ("v6", (2, 4)), ("v4", (3, 5))]


def test_a_failing_job_does_not_stop_the_next(caplog: pytest.LogCaptureFixture) -> None:
    rec = Recorder(fail="v4")
    rec.go.set()
    w = worker(rec)
    try:
        w.submit("v4", (1,))
        assert w.wait_idle(5)
        w.submit("v6", (2,))
        assert w.wait_idle(5)
    finally:
        w.close()
    assert rec.ran == [("v4", (1,)), ("v6", (2,))]
    assert "job v4 broke" in caplog.text


def test_close_drops_what_waits_and_refuses_more() -> None:
    rec = Recorder()
    w = worker(rec)
    w.submit("v4", (1,))
    assert rec.running.wait(5)
    w.submit("v6", (2,))
    w.close(timeout=0)  # while v4 runs: v6 is dropped
    rec.go.set()
    w.close()  # (again: now it waits for v4's end)
    assert rec.ran == [("v4", (1,))] and w.wait_idle(0)
    with pytest.raises(RuntimeError, match="closed"):
        w.submit("v4", (3,))
