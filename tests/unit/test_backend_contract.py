"""The backend contract's own defaults and its shared per-family render loop
(core/dataplane/backend.py), with backends that are nothing but the contract."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from kits.render_kit import config, endpoint_slice, ep, port, service

from kubeplex.core.dataplane.backend import (
    CONTRACT_VERSION,
    Applied,
    Backend,
    BackendContext,
    CleanupReport,
    FamilyBackend,
    NoLocalEndpoints,
    PerFamily,
    Rendered,
    RuleDrift,
    Sample,
    SyncResult,
)
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.errors import BackendError
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


class PerFamilyWrites(PerFamilyText):
    """The shared apply loop: one write per family (a family named in ``refuse`` is refused
    by its "kernel"), after one write for both."""

    def __init__(self, ctx: BackendContext, refuse: tuple[IPFamily, ...] = ()) -> None:
        self.refuse = refuse
        self.written: list[str] = []
        self.forgotten: list[IPFamily] = []
        super().__init__(ctx)

    def family_plans(self, rendered: Text) -> list[tuple[IPFamily, str]]:
        return [(V6 if line.startswith("IPv6") else V4, line) for line in rendered.lines]

    def apply_whole(self, rendered: Text) -> Applied:
        self.written.append("both")
        return Applied(counts={"transactions": 1}, samples=(Sample("whole", (), 1.0),))

    def apply_family(self, family: IPFamily, plan: str) -> Applied | None:
        if family in self.refuse:
            raise BackendError(f"{family.value} refused")
        self.written.append(plan.split()[0])
        drift = RuleDrift("KUBE-SVC-X", "extra", found=f"-A {family.value}")
        return Applied(
            counts={"transactions": 1, "rules": 2},
            failed={f"default/{family.value}:p": "no"},
            no_local_endpoints=NoLocalEndpoints(internal=1),
            samples=(Sample("rules", (family.value,), 2.0),),
            repaired=(drift,),
        )

    def forget_family(self, family: IPFamily) -> None:
        self.forgotten.append(family)
        super().forget_family(family)

    apply = FamilyBackend.apply  # (PerFamilyText's own apply writes nothing)


def test_the_shared_apply_loop_writes_each_family_and_sums_what_they_did() -> None:
    b = PerFamilyWrites(BackendContext(config({}), NODE, (V4, V6)))
    result = b.apply(b.render(state((V4, V6)).checkout(full=True)))
    assert b.written == ["both", "IPv4", "IPv6"]
    assert result.full
    assert result.counts == {"transactions": 3, "rules": 4, "services_failed": 2}
    assert result.failed == {"default/IPv4:p": "no", "default/IPv6:p": "no"}
    assert result.no_local_endpoints == {V4: NoLocalEndpoints(1), V6: NoLocalEndpoints(1)}
    assert [s.family for s in result.samples] == ["whole", "rules", "rules"]
    assert [d.found for d in result.repaired] == ["-A IPv4", "-A IPv6"]
    assert set(b.write_seconds) == {V4, V6}


def test_a_refused_family_fails_alone_and_is_rendered_in_full_next() -> None:
    b = PerFamilyWrites(BackendContext(config({}), NODE, (V4, V6)), refuse=(V4,))
    cluster = state((V4, V6))
    with pytest.raises(BackendError) as err:
        b.apply(b.render(cluster.checkout(full=True)))
    assert err.value.families == (V4,) and str(err.value) == "IPv4: IPv4 refused"
    assert b.written == ["both", "IPv6"]  # the other family was written all the same
    assert b.forgotten == [V4]
    assert [line.split()[:2] for line in b.render(cluster.checkout()).lines] == [
        ["IPv4", "full"],
        ["IPv6", "partial"],
    ]
