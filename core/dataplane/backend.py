"""The contract between the core and a dataplane plugin (version 2).

A backend is three steps, and ``sync`` runs them in order:

* ``observe(state)`` — reads what the next render needs to know of the kernel (on a full sync:
  chains or objects left by earlier runs, objects gone missing, the node's addresses). The only
  read of the kernel on the sync path; None where nothing is needed. ``kubeplex render`` calls
  it too when it may read the kernel.
* ``render(state, observed)`` — pure: from the graph (the change set for a partial sync) and
  the observation to the whole plan, as a printable value. No system calls, no root:
  golden-testable anywhere. A backend may keep a cache of what it rendered before, to
  re-render only changed services. ``Rendered.kernel_inputs()`` is exactly what ``apply``
  will send, in order, and ``str()`` prints it.
* ``apply(rendered)`` — thin: sends the plan to the kernel and adds nothing to it. It raises
  ``BackendError`` if the kernel refused; the previous rules must then still be in place, and
  the backend's next render must be a full one.

The kernel seam is passed in: ``BackendContext.kernel`` is the object a backend programs the
kernel through (its type is the backend's ``KernelT``: ``Backend[KernelT, ObservedT]`` is
generic over it and over what ``observe`` returns; ``kubeplex.testing.fakes`` has in-memory
ones). None makes the backend open the node's real kernel (``real_kernel``), inside
``BackendContext.netns`` if set. A seam names the methods through which ``apply`` writes in
its ``writes`` class attribute: the conformance kit makes them fail to test a refused apply.

Beside the sync path, every backend answers ``cleanup()`` (remove every artifact of its mode,
nothing else, and say what was removed), ``leftovers()`` (what of its mode is programmed on
this node) and ``inspect(service_port)`` (what is programmed for one Service port, as
mode-neutral data). It contributes its own metric families (``metric_families``), fed by the
typed fields of ``SyncResult`` and by ``scrape``.

Backends never learn where objects came from (API server or manifests), and they are found
through the ``kubeplex.backends`` entry-point group, so the core imports none of them.
"""

from __future__ import annotations

import enum
import logging
import shutil
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, Protocol, cast

from typing_extensions import TypeVar

from kubeplex.core.config.kubeproxy import KubeProxyConfiguration
from kubeplex.core.model.errors import BackendError
from kubeplex.core.model.graph import ChangeSet, ProxyState, ServiceGraph
from kubeplex.core.model.types import IPFamily, ServicePortName

log = logging.getLogger(__name__)

#: The version of this contract; a plugin may check it (``kubeplex backends`` prints it).
CONTRACT_VERSION = 2

# The contract's type parameters. All but R and RenderedT (below) default to Any (PEP 696,
# from typing_extensions until Python 3.13): the core, which handles every backend alike,
# names a bare ``Backend``, and ``FamilyBackend[R, RenderedT]`` still means what it meant; a
# plugin that names its own types has its type checker hold its methods to them.

#: The kernel seam a backend programs the kernel through.
KernelT = TypeVar("KernelT", default=Any)
#: What ``observe`` reads of the kernel for the next render.
ObservedT = TypeVar("ObservedT", default=Any)
#: What one IP family's rules depend on (``FamilyBackend.family_settings``).
SettingsT = TypeVar("SettingsT", default=Any)
#: One IP family's plan (``FamilyBackend.render_family``).
PlanT = TypeVar("PlanT", default=Any)


@dataclass(frozen=True)
class BackendContext:
    """What a backend is constructed with."""

    config: KubeProxyConfiguration
    node_name: str
    families: tuple[IPFamily, ...] = (IPFamily.IPv4, IPFamily.IPv6)
    #: Run every command inside this network namespace (``ip netns exec``); None: the host's.
    netns: str | None = None
    #: The kernel seam (its type is the backend's ``KernelT``; see its documentation). None:
    #: the backend opens the node's real kernel (in ``netns``).
    kernel: object = None
    #: The node's cgroup2 folder, holding the processes of the node and of its pods (a kernel
    #: facility of the node, like ``netns``). None: the machine's, as the mode's options say.
    cgroup: Path | None = None
    #: A bpffs folder of the node's own, for what a backend pins there. None: the machine's,
    #: as the mode's options say.
    bpffs: Path | None = None


class Rendered(ABC):
    """A backend's whole plan for one sync. ``str()`` prints exactly what ``apply`` sends."""

    @property
    def full(self) -> bool:
        """True if this render rewrites everything, False for a partial (changed services)."""
        return True

    def kernel_inputs(self) -> Sequence[str]:
        """What ``apply`` hands to the kernel, in order (texts as the tools read them)."""
        return [str(self)]

    @abstractmethod
    def __str__(self) -> str: ...


# --- results and metrics --------------------------------------------------------------------


class MetricEvent(enum.Enum):
    """What, besides the backend's samples, the daemon feeds into a contributed family."""

    #: Only ``SyncResult.samples`` and ``scrape``.
    NONE = "none"
    #: +1 per IP family of every failed sync (counter, label ``ip_family``).
    SYNC_FAILED = "sync-failed"
    #: +1 per IP family of every failed partial sync.
    PARTIAL_SYNC_FAILED = "partial-sync-failed"
    #: The duration of every full sync, failed ones too (histogram, label ``ip_family``).
    FULL_SYNC_SECONDS = "full-sync-seconds"
    #: The duration of every partial sync, failed ones too.
    PARTIAL_SYNC_SECONDS = "partial-sync-seconds"


@dataclass(frozen=True)
class MetricFamily:
    """One metric a backend contributes, with upstream's name, help, type and labels."""

    name: str
    help: str
    kind: Literal["counter", "gauge", "histogram"]
    labels: tuple[str, ...] = ("ip_family",)
    #: Histograms: the bucket bounds (empty: the sync-duration buckets every mode uses).
    buckets: tuple[float, ...] = ()
    on: MetricEvent = MetricEvent.NONE
    #: Its value lives in the kernel: read through ``Backend.scrape`` at every scrape.
    scraped: bool = False


@dataclass(frozen=True)
class Sample:
    """One value for a contributed family: label values in the family's label order."""

    family: str
    labels: tuple[str, ...]
    value: float
    #: True: added to a counter; False: the gauge is set to it.
    add: bool = False


@dataclass(frozen=True)
class NoLocalEndpoints:
    """Services with a Local traffic policy and no local endpoint, by policy kind."""

    internal: int = 0
    external: int = 0


@dataclass(frozen=True)
class RuleDrift:
    """One rule of a chain the mode owns that differs from what the mode renders for it (or,
    after a sync, from what it last wrote there)."""

    chain: str
    #: "extra" (in the kernel, not rendered), "missing" (rendered, not in the kernel) or
    #: "changed" (in its place the kernel holds another rule).
    change: str
    #: The kernel's rule as its tool prints it ("" for a missing one).
    found: str = ""
    #: The rule as the mode renders it ("" for an extra one).
    expected: str = ""


@dataclass(frozen=True)
class SyncResult:
    full: bool
    #: Statistics for logs and benchmarks (rules written, chains deleted, ...); no metric is
    #: read from them.
    counts: dict[str, int] = field(default_factory=dict)
    #: Services the sync left out, by name ("namespace/name:port"), with the reason: their
    #: rules could not be rendered or the kernel refused them. Everything else was
    #: programmed; their previous rules stay, and the backend retries them on the next sync.
    failed: dict[str, str] = field(default_factory=dict)
    #: Per IP family; a family missing here is computed from the graph.
    no_local_endpoints: Mapping[IPFamily, NoLocalEndpoints] = field(default_factory=dict)
    #: Values of the backend's own metric families after this sync.
    samples: tuple[Sample, ...] = ()
    #: Rules of the mode's own chains that differed from what it last wrote (someone else
    #: changed them) and that this sync wrote again.
    repaired: tuple[RuleDrift, ...] = ()


@dataclass(frozen=True)
class Applied:
    """What one part of an apply adds to the sync's ``SyncResult`` (see ``FamilyBackend``):
    one IP family's plan, or what is sent for every family at once."""

    counts: Mapping[str, int] = field(default_factory=dict)
    #: Services of the family left out, with the reason (``SyncResult.failed``).
    failed: Mapping[str, str] = field(default_factory=dict)
    #: The family's Services without a local endpoint (None: computed from the graph).
    no_local_endpoints: NoLocalEndpoints | None = None
    samples: tuple[Sample, ...] = ()
    repaired: tuple[RuleDrift, ...] = ()


# --- cleanup, leftovers, inspection ---------------------------------------------------------


@dataclass(frozen=True)
class CleanupReport:
    """What ``cleanup`` removed, one line per artifact ("iptables nat chain KUBE-SVC-...")."""

    mode: str
    removed: tuple[str, ...] = ()
    #: Left in place, with ``drain``, because established connections still go through them
    #: and the mode itself keeps their NAT (IPVS's connection table); a later cleanup
    #: removes them. One line each, in the words of ``removed``.
    draining: tuple[str, ...] = ()


@dataclass(frozen=True)
class EndpointView:
    """One endpoint of a programmed Service port, as the kernel holds it."""

    #: Where new connections are sent (DNAT target or real server), "ip:port".
    target: str
    #: The share of new connections the kernel gives it (0..1), from its probability, slot
    #: count or weight; None where the kernel does not say.
    share: float | None = None
    #: The kernel's own weight (IPVS weight, numgen slots), if it has one.
    weight: int | None = None
    packets: int | None = None
    bytes: int | None = None


@dataclass(frozen=True)
class ProgrammedService:
    """What one IP family's kernel holds for one Service port (``Backend.inspect``)."""

    service: str
    family: IPFamily
    #: Where traffic enters: the kernel's own lines matching the Service's addresses (rules,
    #: set or map elements, virtual services), as its tools print them.
    entries: tuple[str, ...] = ()
    endpoints: tuple[EndpointView, ...] = ()
    #: Whether traffic of this Service is marked for masquerading (some or all of it).
    masquerade: bool = False
    #: ClientIP affinity timeout in seconds, if sessions stick.
    affinity_seconds: int | None = None
    #: Packets counted at the entry, where the kernel counts them.
    packets: int | None = None
    #: Names of the kernel objects that belong to this Service port (chains, sets, ...).
    objects: tuple[str, ...] = ()
    #: The Service port's own chains compared whole with what the mode renders for it now:
    #: every rule added, missing or changed (empty where the mode does not compare them).
    rule_drift: tuple[RuleDrift, ...] = ()


# --- the backend ----------------------------------------------------------------------------


class Backend(ABC, Generic[KernelT, ObservedT]):
    """Base class of every dataplane plugin: ``Backend[KernelT, ObservedT]``, generic over
    its kernel seam and what its ``observe`` returns."""

    #: The ``mode`` value that selects this backend.
    mode: str = ""
    #: Capabilities, e.g. {"localhost-nodeports", "session-affinity", "sctp", "ipv6"}.
    capabilities: frozenset[str] = frozenset()
    #: Executables this backend needs on the node.
    required_tools: tuple[str, ...] = ()
    #: Whether the daemon cleans conntrack entries after syncs (and registers upstream's
    #: conntrack reconciler metrics) for this backend.
    uses_conntrack: bool = True
    #: Seconds each IP family's render took in the last sync (``FamilyBackend`` times them),
    #: and its kernel writes, where the backend writes each family on its own: upstream runs
    #: a proxier per family, and each observes its own sync duration. The rest of a sync
    #: (its observation, one transaction for both families) is shared out in proportion;
    #: with neither, each family is given the whole sync's duration.
    render_seconds: Mapping[IPFamily, float] = {}
    write_seconds: Mapping[IPFamily, float] = {}

    def __init__(self, ctx: BackendContext) -> None:
        self.ctx = ctx
        #: The kernel seam (see ``BackendContext.kernel``).
        self.kernel: KernelT = (
            cast(KernelT, ctx.kernel) if ctx.kernel is not None else self.real_kernel()
        )

    def real_kernel(self) -> KernelT:
        """The node's real kernel seam, in ``ctx.netns``. Default: None, for a render-only
        backend (whose ``KernelT`` is None)."""
        return cast(KernelT, None)

    def missing_requirements(self) -> list[str]:
        """What this node lacks for the backend to run (empty: ready)."""
        return [
            f"executable {t!r} not found in PATH"
            for t in self.required_tools
            if not shutil.which(t)
        ]

    def missing_for_cleanup(self) -> list[str]:
        """What this node lacks for ``cleanup`` (empty: it can run). Default: what it lacks to
        run; a mode whose leftovers can be removed with less (another mode's pod, which
        mounts less) says so."""
        return self.missing_requirements()

    def sync_periods(self) -> tuple[float, float]:
        """(syncPeriod, minSyncPeriod) in seconds of the config section this mode reads;
        by default the iptables section's, as upstream's modes without their own."""
        cfg = self.ctx.config.iptables
        return cfg.sync_period, cfg.min_sync_period

    def prepare(self) -> None:
        """One-time node setup before the first apply (not called by ``kubeplex render``)."""

    def observe(self, state: ProxyState) -> ObservedT | None:
        """What the next render of ``state`` needs to know of the kernel (None: nothing)."""
        return None

    @abstractmethod
    def render(self, state: ProxyState, observed: ObservedT | None = None) -> Rendered:
        """The whole plan for ``state`` (everything if any change set is full, else the
        changed services), given what ``observe`` found."""

    @abstractmethod
    def apply(self, rendered: Rendered) -> SyncResult:
        """Send ``rendered.kernel_inputs()``; raise BackendError (leaving the old rules) if
        the kernel refuses."""

    def sync(self, state: ProxyState) -> SyncResult:
        """Observe, render, apply. A backend may override it to isolate failing services:
        program the others and name the failing ones in ``SyncResult.failed``."""
        return self.apply(self.render(state, self.observe(state)))

    def invalidate(self) -> None:
        """Forget render caches: the next render is full (called after a failed apply)."""

    def cleanup(self, keep: Collection[str] = (), drain: bool = False) -> CleanupReport:
        """Remove every artifact of this mode on the node, and nothing else (``kubeplex
        cleanup``), whoever made it; says what was removed. Default: nothing to remove.

        ``keep``: artifacts to leave in place, in the words of ``leftovers`` — what the active
        mode programmed, when another mode's leftovers are removed after a mode switch (two
        modes may share objects: the iptables and ipvs modes both write KUBE-SERVICES).
        ``drain`` (a mode switch): leave what established connections still need where the
        mode, not conntrack, holds their NAT, and list it in ``CleanupReport.draining``; the
        daemon calls again until nothing drains. Modes whose NAT lives in conntrack ignore it."""
        return CleanupReport(self.mode)

    def leftovers(self) -> list[str]:
        """What of this mode is programmed on the node (empty: nothing), one line per
        artifact, in the words of ``CleanupReport`` (a mode sharing an object with another
        names it in the same words). Default: nothing."""
        return []

    def inspect(self, service_port: ServicePortName) -> list[ProgrammedService] | None:
        """What the kernel holds for ``service_port``, one entry per IP family that has
        anything of it (empty: nothing programmed). None: this backend cannot read it back.

        Callers render the cluster state first (pure: nothing is sent), so a backend whose
        kernel objects are not named after the Service (IPVS keys them by address and port)
        knows which objects are the Service's."""
        return None

    def metric_families(self) -> Sequence[MetricFamily]:
        """The mode's own metrics (upstream's names), registered by the daemon at start."""
        return ()

    def scrape(self) -> Sequence[Sample]:
        """Values of the ``scraped`` families, read now (called at every /metrics scrape)."""
        return ()

    def describe(self) -> Sequence[str]:
        """Extra lines for ``kubeplex backends`` (which lists the capabilities already)."""
        return []


# --- the shared per-family render loop ------------------------------------------------------


class FamilyRenderer(Protocol[SettingsT]):
    """What ``FamilyBackend`` needs of a backend's per-family renderer."""

    settings: SettingsT
    #: Set to make the next render a full one.
    force_full: bool

    def invalidate(self) -> None: ...


#: A backend's per-family renderer.
R = TypeVar("R", bound=FamilyRenderer[Any])
#: A backend's whole plan of a sync.
RenderedT = TypeVar("RenderedT", bound=Rendered)


class PerFamily(Generic[R, SettingsT]):
    """A backend's renderers, one per IP family, each with the settings it was made for.

    When a family's settings change (a node address, a config value the rules use), the
    renderer takes them and its next render is full: every cached rule may depend on them.
    """

    def __init__(self, make: Callable[[SettingsT], R]) -> None:
        self._make = make
        self._renderers: dict[IPFamily, R] = {}

    def with_settings(self, family: IPFamily, settings: SettingsT) -> R:
        r = self._renderers.get(family)
        if r is None:
            r = self._renderers[family] = self._make(settings)
        elif r.settings != settings:
            r.settings = settings
            r.force_full = True
        return r

    def __getitem__(self, family: IPFamily) -> R:
        return self._renderers[family]

    def __contains__(self, family: object) -> bool:
        return family in self._renderers

    def get(self, family: IPFamily) -> R | None:
        return self._renderers.get(family)

    def __iter__(self) -> Iterator[R]:
        return iter(list(self._renderers.values()))

    def clear(self) -> None:
        """Forget every renderer (after a cleanup: nothing of ours is left to build on)."""
        self._renderers.clear()


class FamilyBackend(
    Backend[KernelT, ObservedT], Generic[R, RenderedT, KernelT, ObservedT, SettingsT, PlanT]
):
    """A backend that renders each IP family on its own, with one renderer per family:
    ``FamilyBackend[R, RenderedT, KernelT, ObservedT, SettingsT, PlanT]``, generic over its
    renderer and whole plan, its kernel seam and observation, and each family's settings and
    plan.

    Subclasses give the renderer (``make_renderer``), each family's settings, how one family
    is rendered, and how the families' plans make one ``Rendered``; the loop over families
    and ``invalidate`` are here, once. So is ``apply``'s loop, for a subclass that gives
    ``family_plans`` and ``apply_family`` (and ``apply_whole`` if it writes every family at
    once): each family is applied on its own, and one the kernel refuses does not keep the
    others from being written.
    """

    def __init__(self, ctx: BackendContext) -> None:
        super().__init__(ctx)
        self.renderers: PerFamily[R, SettingsT] = PerFamily(self.make_renderer)
        self.render_seconds: dict[IPFamily, float] = {}
        self.write_seconds: dict[IPFamily, float] = {}

    @abstractmethod
    def make_renderer(self, settings: SettingsT) -> R:
        """A new renderer of one family, for ``settings``."""

    @abstractmethod
    def family_settings(
        self, family: IPFamily, state: ProxyState, observed: ObservedT | None
    ) -> SettingsT:
        """The settings the rules of ``family`` depend on (a change re-renders everything)."""

    @abstractmethod
    def render_family(
        self, renderer: R, graph: ServiceGraph, changes: ChangeSet, observed: ObservedT | None
    ) -> PlanT:
        """One family's plan."""

    @abstractmethod
    def combine(self, plans: list[PlanT]) -> RenderedT:
        """The families' plans as one ``Rendered``."""

    def render(self, state: ProxyState, observed: ObservedT | None = None) -> RenderedT:
        plans: list[PlanT] = []
        seconds: dict[IPFamily, float] = {}
        self.write_seconds = {}  # the apply after this render fills it
        for family in self.ctx.families:
            graph = state.graphs.get(family)
            if graph is None:
                continue
            started = time.perf_counter()
            settings = self.family_settings(family, state, observed)
            renderer = self.renderers.with_settings(family, settings)
            plans.append(self.render_family(renderer, graph, state.changes[family], observed))
            seconds[family] = time.perf_counter() - started
        self.render_seconds = seconds
        return self.combine(plans)

    def invalidate(self) -> None:
        for r in self.renderers:
            r.invalidate()

    # --- the shared apply loop ------------------------------------------------------------

    def family_plans(self, rendered: RenderedT) -> Sequence[tuple[IPFamily, PlanT]]:
        """The families' plans in ``rendered``, each with its family, in apply order."""
        raise NotImplementedError(f"{type(self).__name__} gives no family_plans")

    def apply_whole(self, rendered: RenderedT) -> Applied:
        """What is sent for every family at once, before each family's ``apply_family`` (one
        transaction, say); a BackendError fails the whole sync. Default: nothing."""
        return Applied()

    def apply_family(self, family: IPFamily, plan: PlanT) -> Applied | None:
        """Write one family's plan and keep what it left (the renderer's record); None if
        there was nothing to write. A BackendError fails this family only."""
        raise NotImplementedError(f"{type(self).__name__} gives no apply_family")

    def forget_family(self, family: IPFamily) -> None:
        """After the kernel refused ``family``'s plan: nothing kept of it is to be trusted;
        its next render is full."""
        renderer = self.renderers.get(family)
        if renderer is not None:
            renderer.invalidate()

    def apply(self, rendered: Rendered) -> SyncResult:
        """``apply_whole``, then each family's plan on its own (its write timed as the
        family's): a refused family keeps its previous rules and is forgotten
        (``forget_family``), and the others are still written; the sync then fails, naming
        the refused families."""
        mine = cast(RenderedT, rendered)  # (what this backend's render returned)
        parts = [self.apply_whole(mine)]
        no_local: dict[IPFamily, NoLocalEndpoints] = {}
        refused: dict[IPFamily, str] = {}
        for family, plan in self.family_plans(mine):
            started = time.perf_counter()
            try:
                part = self.apply_family(family, plan)
            except BackendError as err:
                self.forget_family(family)
                refused[family] = f"{family.value}: {err}"
                continue
            finally:
                self.write_seconds[family] = time.perf_counter() - started
            if part is not None:
                parts.append(part)
                if part.no_local_endpoints is not None:
                    no_local[family] = part.no_local_endpoints
        failed = {svc: why for part in parts for svc, why in part.failed.items()}
        if refused:
            for svc, why in failed.items():
                log.error("service %s not programmed: %s", svc, why)
            raise BackendError("; ".join(refused.values()), families=tuple(refused))
        counts: dict[str, int] = {}
        for part in parts:
            for key, n in part.counts.items():
                counts[key] = counts.get(key, 0) + n
        counts["services_failed"] = len(failed)
        # The Proxier logs the failed services; their last good rules stay until they
        # render again.
        return SyncResult(
            full=rendered.full,
            counts=counts,
            failed=failed,
            no_local_endpoints=no_local,
            samples=tuple(s for part in parts for s in part.samples),
            repaired=tuple(d for part in parts for d in part.repaired),
        )
