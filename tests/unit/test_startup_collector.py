"""The cyclic collector's one owner: overlapping pauses, from any thread, and one freeze."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from kubeplex.core.startup import SWITCH, collector
from kubeplex.core.startup.collector import Pause, collector_paused, freeze_once


@pytest.fixture(autouse=True)
def collector_on() -> Iterator[None]:
    """The collector on and nothing frozen, as in a process that starts; restored after."""
    was = gc.isenabled()
    gc.enable()
    try:
        yield
    finally:
        gc.unfreeze()
        if was:
            gc.enable()
        else:
            gc.disable()


def test_the_collector_comes_back_when_the_last_of_overlapping_pauses_ends() -> None:
    lists = Pause()  # the source's, ended on one of its threads
    with collector_paused():  # a sync's, on the proxier's
        ender = threading.Thread(target=lists.end)
        ender.start()
        ender.join()
        assert not gc.isenabled()  # not turned on under the sync
    assert gc.isenabled()


def test_a_pause_ends_once_whoever_ends_it() -> None:
    pause = Pause()
    other = Pause()
    assert pause.end()
    assert not pause.end()  # a second end does not end someone else's pause
    assert not gc.isenabled()
    assert other.end()
    assert gc.isenabled()


def test_a_collector_turned_off_by_someone_else_stays_off() -> None:
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled()


def test_what_is_alive_is_frozen_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(collector, "_frozen", False)
    assert freeze_once()
    assert gc.get_freeze_count() > 0
    gc.unfreeze()
    assert not freeze_once()
    assert gc.get_freeze_count() == 0


def test_the_switch_turns_pauses_and_the_freeze_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SWITCH, "0")
    monkeypatch.setattr(collector, "_frozen", False)
    with collector_paused():
        assert gc.isenabled()
    assert not freeze_once()
    assert gc.get_freeze_count() == 0
