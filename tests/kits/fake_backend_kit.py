"""An iptables-like backend without a kernel, for tests of the daemon around a backend (the
operations, health and conntrack cleanup): it renders nothing and can be made to fail."""

from __future__ import annotations

from collections.abc import Sequence

from kubeplex.core.config.kubeproxy import default_config
from kubeplex.core.dataplane.backend import (
    Backend,
    BackendContext,
    MetricEvent,
    MetricFamily,
    Rendered,
    SyncResult,
)
from kubeplex.core.model.errors import BackendError
from kubeplex.core.model.graph import ProxyState
from kubeplex.core.model.types import IPFamily


class _Rendered(Rendered):
    def __init__(self, full: bool) -> None:
        self._full = full

    @property
    def full(self) -> bool:
        return self._full

    def __str__(self) -> str:
        return ""


class FakeBackend(Backend):
    """An iptables-like backend: its failure counters, fed by the daemon's events."""

    mode = "iptables"

    def __init__(self, node: str = "node-a") -> None:
        super().__init__(BackendContext(default_config(), node, (IPFamily.IPv4,)))
        self.fail = False

    def render(self, state: ProxyState, observed: object = None) -> Rendered:
        return _Rendered(state.is_full())

    def apply(self, rendered: Rendered) -> SyncResult:
        if self.fail:
            raise BackendError("iptables-restore: simulated failure")
        return SyncResult(full=rendered.full)

    def metric_families(self) -> Sequence[MetricFamily]:
        return (
            MetricFamily(
                "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
                "Cumulative proxy iptables restore failures",
                "counter",
                on=MetricEvent.SYNC_FAILED,
            ),
            MetricFamily(
                "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total",
                "Cumulative proxy iptables partial restore failures",
                "counter",
                on=MetricEvent.PARTIAL_SYNC_FAILED,
            ),
        )
