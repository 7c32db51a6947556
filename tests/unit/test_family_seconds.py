"""How a sync's duration is shared out between the IP families it programmed."""

from __future__ import annotations

from typing import Any

import pytest

from kubeplex.core.config.kubeproxy import default_config
from kubeplex.core.daemon.metrics import family_seconds
from kubeplex.core.dataplane.backend import Backend, BackendContext, Rendered, SyncResult
from kubeplex.core.model.graph import ProxyState
from kubeplex.core.model.types import IPFamily

V4, V6 = IPFamily.IPv4, IPFamily.IPv6


class Timed(Backend):
    mode = "timed"

    def render(self, state: ProxyState, observed: Any = None) -> Rendered:
        raise NotImplementedError

    def apply(self, rendered: Rendered) -> SyncResult:
        raise NotImplementedError


def backend(render: dict[IPFamily, float], write: dict[IPFamily, float]) -> Backend:
    b = Timed(BackendContext(default_config(), "node-a"))
    b.render_seconds, b.write_seconds = render, write
    return b


def test_timed_parts_are_each_familys_and_the_rest_is_shared_in_proportion() -> None:
    got = family_seconds(backend({V4: 0.3, V6: 0.1}, {V4: 0.5, V6: 0.1}), [V4, V6], 1.2)
    # 0.2 s untimed (the observation): 0.8 of it IPv4's, 0.2 IPv6's.
    assert got == pytest.approx({V4: 0.96, V6: 0.24})


def test_one_transaction_for_both_is_shared_by_the_renders() -> None:
    got = family_seconds(backend({V4: 0.09, V6: 0.01}, {}), [V4, V6], 1.0)
    assert got == pytest.approx({V4: 0.9, V6: 0.1})


def test_a_backend_that_times_nothing_gives_each_family_the_whole_sync() -> None:
    assert family_seconds(backend({}, {}), [V4, V6], 0.5) == {V4: 0.5, V6: 0.5}
