"""The reflector's backoff between list-and-watch rounds, as client-go's: its steps, and the
API source paced by them against the fake API server when every watch fails."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from apiserver import FakeApiServer
from kits.kubeapi_kit import api_source, rbac_server

from kubeplex.core.sources.api_errors import connection_refused
from kubeplex.core.sources.kubeapi import ENDPOINTSLICES, RESOURCES, SERVICES, KubeApiSource
from kubeplex.core.sources.kubeclient import ApiException, api_request
from kubeplex.core.sources.reflector_backoff import ReflectorBackoff

NODE = "kind-worker"


class VirtualClock:
    """A reflector's time: a backoff's wait passes at once, until the window is over, where
    the reflector is held until its source stops."""

    def __init__(self, window: float = float("inf")) -> None:
        self.now = 0.0
        self.window = window
        self.waits: list[float] = []
        self.window_over = threading.Event()

    def clock(self) -> float:
        return self.now

    def sleep(self, stop: threading.Event, seconds: float) -> bool:
        self.waits.append(seconds)
        self.now += seconds
        if self.now >= self.window:
            self.window_over.set()
            return stop.wait()
        return stop.is_set()


def backoff_on(clock: VirtualClock, rand: Callable[[], float] = lambda: 0.5) -> ReflectorBackoff:
    return ReflectorBackoff(clock=clock.clock, rand=rand, sleep=clock.sleep)


# ------------------------------------------------------------------------------------ the steps


def test_steps_double_from_0_8_to_30_seconds_jittered_by_up_to_as_much_again() -> None:
    clock = VirtualClock()
    low = ReflectorBackoff(clock=clock.clock, rand=lambda: 0.0)
    assert [low.step() for _ in range(8)] == pytest.approx(
        [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0]
    )
    high = ReflectorBackoff(clock=clock.clock, rand=lambda: 0.999)
    assert [high.step() for _ in range(7)] == pytest.approx(
        [1.5992, 3.1984, 6.3968, 12.7936, 25.5872, 51.1744, 59.97]
    )


def test_steps_start_over_after_two_minutes_without_one() -> None:
    clock = VirtualClock()
    backoff = ReflectorBackoff(clock=clock.clock, rand=lambda: 0.0)
    assert [backoff.step() for _ in range(3)] == pytest.approx([0.8, 1.6, 3.2])
    clock.now += 120.0  # two minutes exactly: not yet
    assert backoff.step() == pytest.approx(6.4)
    clock.now += 120.5
    assert backoff.step() == pytest.approx(0.8)
    assert backoff.step() == pytest.approx(1.6)


# ------------------------------------------------------------------------------------ the source


@pytest.fixture
def srv(request: pytest.FixtureRequest) -> Iterator[FakeApiServer]:
    yield from rbac_server(request)


def populate(srv: FakeApiServer) -> None:
    srv.create("Node", {"metadata": {"name": NODE}, "spec": {"podCIDR": "10.244.1.0/24"}})
    srv.create("Service", {"metadata": {"name": "web", "namespace": "default"}, "spec": {}})


@pytest.fixture
def make_source(srv: FakeApiServer, tmp_path: Path) -> Iterator[Callable[..., KubeApiSource]]:
    made: list[KubeApiSource] = []

    def make(**kwargs: Any) -> KubeApiSource:
        # client-go's steps (the test knobs make them short)
        knobs: dict[str, Any] = {"backoff_initial": 0.8, "backoff_max": 30.0, **kwargs}
        source = api_source(srv, tmp_path, NODE, **knobs)
        made.append(source)
        return source

    yield make
    for source in made:
        source.stop()


def wait_until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def lists(srv: FakeApiServer, resource: str) -> int:
    return len(srv.find_requests("list", resource))


@pytest.mark.parametrize(
    ("fault", "qps"),
    [("expired", 5.0), ("expired", 50.0), ("garbage", 50.0), ("closed", 50.0)],
)
def test_every_watch_failing_relists_as_often_as_client_go_in_40_seconds(
    srv: FakeApiServer, make_source: Callable[..., KubeApiSource], fault: Any, qps: float
) -> None:
    """A watch that expires (410), breaks or ends at once every time is not a relist storm:
    5 or 6 lists of a resource in its first 40 s (waits of 0.8, 1.6, 3.2, 6.4, 12.8 s, each
    up to twice that)."""
    populate(srv)
    srv.break_watches(fault)
    clocks = {r: VirtualClock(window=40.0) for r in RESOURCES}
    source = make_source(qps=qps, burst=int(2 * qps), backoff=lambda r: backoff_on(clocks[r]))
    source.start()
    for resource, clock in clocks.items():
        assert clock.window_over.wait(20), f"{resource}: still listing at {clock.now:.1f} s"
    for resource, clock in clocks.items():
        assert 5 <= lists(srv, resource) <= 6, (resource, clock.waits)
        assert clock.waits[:3] == pytest.approx([1.2, 2.4, 4.8])  # rand 0.5: 1.5 x the step
    assert source.synced  # every list was complete and applied meanwhile
    assert source.list_count(SERVICES) == lists(srv, SERVICES)


@pytest.mark.parametrize("fault", ["expired", "garbage"])
def test_a_watch_failing_every_time_lists_a_few_times_in_a_few_seconds(
    srv: FakeApiServer, make_source: Callable[..., KubeApiSource], fault: Any
) -> None:
    """Real time, client-go's steps: lists at 0 s, 0.8-1.6 s, then 1.6-3.2 s after that."""
    populate(srv)
    srv.break_watches(fault)
    source = make_source(qps=50.0, burst=100).start()
    assert source.wait_for_initial_sync(5)
    threading.Event().wait(3.0)
    assert 1 <= lists(srv, ENDPOINTSLICES) <= 4
    assert sum(lists(srv, r) for r in RESOURCES) <= 16


def test_a_watch_refused_with_429_is_asked_again_after_each_step_without_a_relist(
    srv: FakeApiServer, make_source: Callable[..., KubeApiSource]
) -> None:
    populate(srv)
    srv.fail_next(3, code=429, match=lambda r: r.verb == "watch" and r.resource == SERVICES)
    clocks = {r: VirtualClock() for r in RESOURCES}
    source = make_source(backoff=lambda r: backoff_on(clocks[r])).start()
    assert source.wait_for_initial_sync(5)
    srv.wait_for_watches(1, SERVICES)
    assert [r.status for r in srv.find_requests("watch", SERVICES)] == [429, 429, 429, 200]
    wait_until(lambda: source.last_error == "")  # cleared by the watch that was answered
    assert lists(srv, SERVICES) == 1
    assert clocks[SERVICES].waits == pytest.approx([1.2, 2.4, 4.8])


def test_a_watch_that_ends_cleanly_is_resumed_at_once_without_a_relist(
    srv: FakeApiServer, make_source: Callable[..., KubeApiSource]
) -> None:
    populate(srv)
    clocks = {r: VirtualClock() for r in RESOURCES}
    source = make_source(backoff=lambda r: backoff_on(clocks[r])).start()
    assert source.wait_for_initial_sync(5)
    srv.wait_for_watches(1, SERVICES)
    srv.create("Service", {"metadata": {"name": "new", "namespace": "default"}, "spec": {}})
    wait_until(lambda: source.resource_versions[SERVICES] == str(srv.resource_version))
    srv.drop_watches("close", SERVICES)  # as at timeoutSeconds
    srv.wait_for_request(
        lambda r: (
            r.verb == "watch"
            and r.resource == SERVICES
            and r.query.get("resourceVersion") == str(srv.resource_version)
        )
    )
    assert lists(srv, SERVICES) == 1
    assert clocks[SERVICES].waits == []


def test_a_refused_connection_is_told_from_other_failures(
    srv: FakeApiServer, make_source: Callable[..., KubeApiSource]
) -> None:
    """What a watch waits out without a relist: ECONNREFUSED under urllib3's wrappings."""
    source = make_source()
    srv.stop()
    try:
        with pytest.raises(Exception) as refused:
            api_request(source.api, "GET", "/api/v1/services", timeout=(2.0, 2.0))
    finally:
        srv.start()
    assert connection_refused(refused.value)
    srv.fail_next(1, code=500)
    with pytest.raises(ApiException) as failed:
        api_request(source.api, "GET", "/api/v1/services", timeout=(2.0, 2.0))
    assert not connection_refused(failed.value)
