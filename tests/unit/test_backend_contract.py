"""The backend contract's own defaults and its shared per-family render loop
(core/dataplane/backend.py), with backends that are nothing but the contract."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kits.render_kit import config, endpoint_slice, ep, port, service

from kubeplex.core.dataplane.backend import (
    CONTRACT_VERSION,
    Backend,
    BackendContext,
    CleanupReport,
    FamilyBackend,
    PerFamily,
    Rendered,
    SyncResult,
)
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.graph import ChangeSet, ProxyState, ServiceGraph
from kubeplex.core.model.types import IPFamily, ServicePortName

NODE = "node-a"
V4, V6 = IPFamily.IPv4, IPFamily.IPv6


@dataclass
class Text(Rendered):
    lines: list[str]
    is_full: bool = True

    @property
    def full(self) -> bool:
        return self.is_full

    def __str__(self) -> str:
        return "".join(f"{line}\n" for line in self.lines)


class Minimal(Backend):
    """Only what is abstract: render and apply."""

    mode = "minimal"

    def __init__(self, ctx: BackendContext) -> None:
        self.calls: list[tuple[str, Any]] = []
        super().__init__(ctx)

    def real_kernel(self) -> Any:
        self.calls.append(("real_kernel", None))
        return "the node's kernel"

    def observe(self, state: ProxyState) -> Any:
        self.calls.append(("observe", state))
        return "what the kernel holds"

    def render(self, state: ProxyState, observed: Any = None) -> Text:
        self.calls.append(("render", observed))
        return Text([f"observed: {observed}"])

    def apply(self, rendered: Rendered) -> SyncResult:
        self.calls.append(("apply", str(rendered)))
        return SyncResult(full=rendered.full)


def ctx(**kw: Any) -> BackendContext:
    return BackendContext(config({}), NODE, (V4,), **kw)


def state(families: tuple[IPFamily, ...] = (V4,)) -> ClusterState:
    cluster = ClusterState(NODE, families)
    cluster.set_service(service("default", "web", "10.96.0.10", [port()]))
    cluster.set_endpoint_slice(endpoint_slice("default", "web", [ep("10.244.1.1")]))
    return cluster


def test_the_hooks_default_to_a_backend_with_nothing_to_read_back() -> None:
    b = Minimal(ctx())
    assert CONTRACT_VERSION == 2
    assert b.cleanup() == CleanupReport("minimal", ())
    assert b.leftovers() == []
    assert b.inspect(ServicePortName("default", "web", "http", "TCP")) is None  # cannot read
    assert b.metric_families() == () and b.scrape() == ()
    assert b.uses_conntrack is True
    cfg = b.ctx.config.iptables
    assert b.sync_periods() == (cfg.sync_period, cfg.min_sync_period)
    assert Rendered.kernel_inputs(Text(["a", "b"])) == ["a\nb\n"]


def test_the_kernel_seam_comes_from_the_context_else_from_the_backend() -> None:
    injected = Minimal(ctx(kernel="a fake"))
    assert injected.kernel == "a fake" and ("real_kernel", None) not in injected.calls
    real = Minimal(ctx())
    assert real.kernel == "the node's kernel" and real.calls == [("real_kernel", None)]


def test_sync_observes_then_renders_what_it_observed_then_applies_that() -> None:
    b = Minimal(ctx(kernel="fake"))
    checked_out = state().checkout(full=True)
    result = b.sync(checked_out)
    assert result.full
    assert [c[0] for c in b.calls] == ["observe", "render", "apply"]
    assert b.calls[0][1] is checked_out
    assert b.calls[1][1] == "what the kernel holds"
    assert b.calls[2][1] == "observed: what the kernel holds\n"


@dataclass
class Renderer:
    settings: Any
    force_full: bool = True
    invalidated: int = 0
    rendered: list[tuple[bool, str]] = field(default_factory=list)

    def invalidate(self) -> None:
        self.invalidated += 1
        self.force_full = True

    def render(self, graph: ServiceGraph, changes: ChangeSet) -> str:
        full = changes.full or self.force_full
        self.force_full = False
        self.rendered.append((full, self.settings))
        return f"{graph.family.value} {'full' if full else 'partial'} {sorted(graph.services)}"


class PerFamilyText(FamilyBackend[Renderer, Text]):
    mode = "per-family"

    def __init__(self, ctx: BackendContext) -> None:
        self.setting = "a"
        super().__init__(ctx)

    def make_renderer(self, settings: Any) -> Renderer:
        return Renderer(settings)

    def family_settings(self, family: IPFamily, state: ProxyState, observed: Any) -> Any:
        return f"{family.value}:{self.setting}:{observed}"

    def render_family(
        self, renderer: Renderer, graph: ServiceGraph, changes: ChangeSet, observed: Any
    ) -> Any:
        return renderer.render(graph, changes)

    def combine(self, plans: list[Any]) -> Text:
        return Text(plans, is_full=any(" full " in p for p in plans))

    def apply(self, rendered: Rendered) -> SyncResult:
        return SyncResult(full=rendered.full)


def test_the_shared_loop_renders_each_served_family_with_its_own_renderer() -> None:
    b = PerFamilyText(BackendContext(config({}), NODE, (V4, V6)))
    cluster = state((V4,))  # only IPv4 is served: no IPv6 graph, no IPv6 renderer
    first = b.render(cluster.checkout(full=True))
    assert isinstance(first, Text) and first.full
    assert len(first.lines) == 1 and first.lines[0].startswith("IPv4 full")
    assert V4 in b.renderers and V6 not in b.renderers
    assert b.render(cluster.checkout()).lines[0].startswith("IPv4 partial")


def test_changed_settings_make_that_familys_next_render_full() -> None:
    b = PerFamilyText(BackendContext(config({}), NODE, (V4, V6)))
    cluster = state((V4, V6))
    b.render(cluster.checkout(full=True))
    b.setting = "b"
    again = b.render(cluster.checkout())
    assert [line.split()[:2] for line in again.lines] == [["IPv4", "full"], ["IPv6", "full"]]
    assert b.renderers[V4].rendered[-1] == (True, "IPv4:b:None")
    assert b.render(cluster.checkout(), observed="seen").full  # the observation is a setting


def test_invalidate_reaches_every_renderer_once_and_clear_forgets_them() -> None:
    b = PerFamilyText(BackendContext(config({}), NODE, (V4, V6)))
    cluster = state((V4, V6))
    b.render(cluster.checkout(full=True))
    b.invalidate()
    assert [r.invalidated for r in b.renderers] == [1, 1]
    assert all(line.split()[1] == "full" for line in b.render(cluster.checkout()).lines)
    renderers: PerFamily[Renderer] = b.renderers
    renderers.clear()
    assert list(renderers) == [] and V4 not in renderers
