"""The iptables dataplane: upstream kube-proxy's iptables mode, rule for rule.

The kernel seam is ``kubeplex.backends.netfilter.iptables.IptablesSeam`` (both families;
the real one is ``Iptables(netns)``). ``observe`` reads, for each family whose next render is
full, the saved ruleset and the node's interface addresses; the render then plans everything
apply writes: the leftover service chains to delete, missing canary chains and jumps, the
route_localnet sysctl, and what the kernel held for a rollback.
"""

from __future__ import annotations

import ipaddress
import logging
import shutil
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from kubeplex.backends.iptables import metrics, names, readback
from kubeplex.backends.iptables.prelude import prelude
from kubeplex.backends.iptables.readback import FIXED_CHAINS as FIXED_CHAINS
from kubeplex.backends.iptables.render import FamilyPlan, FamilyRenderer, IptablesRendered
from kubeplex.backends.iptables.rules import (
    NFACCT_INVALID_DROPPED,
    NFACCT_LOCALHOST_NODEPORTS,
    FamilySettings,
)
from kubeplex.backends.netfilter.artifacts import Artifacts, removal
from kubeplex.backends.netfilter.iptables import Iptables, IptablesSeam, SavedRuleset
from kubeplex.backends.netfilter.rollback import Before, restore_all
from kubeplex.core.config.localdetect import local_detector
from kubeplex.core.dataplane.backend import (
    Applied,
    BackendContext,
    CleanupReport,
    FamilyBackend,
    MetricFamily,
    NoLocalEndpoints,
    ProgrammedService,
    Sample,
)
from kubeplex.core.dataplane.nodeports import node_port_ips
from kubeplex.core.model.graph import ChangeSet, ProxyState, ServiceGraph
from kubeplex.core.model.types import IPFamily, ServicePortName, family_of

log = logging.getLogger(__name__)

NFACCT_COUNTERS = (NFACCT_LOCALHOST_NODEPORTS, NFACCT_INVALID_DROPPED)
ROUTE_LOCALNET = readback.ROUTE_LOCALNET


@dataclass(frozen=True)
class IptablesObserved:
    """One family's kernel before a full sync."""

    saved: SavedRuleset
    #: Every address on the node's interfaces (NodePort addresses follow them).
    addresses: tuple[str, ...]


#: What ``IptablesBackend.observe`` returns: the families whose next render is full.
Observation = Mapping[IPFamily, IptablesObserved]


def admits_loopback(addresses: tuple[str, ...]) -> bool:
    """Upstream's ContainsIPv4Loopback: a nodePortAddresses CIDR holding 127.0.0.1."""
    loopback = ipaddress.ip_address("127.0.0.1")
    return any(
        a != "primary"
        and family_of(a) is IPFamily.IPv4
        and loopback in ipaddress.ip_network(a, strict=False)
        for a in addresses
    )


class IptablesBackend(
    FamilyBackend[
        FamilyRenderer, IptablesRendered, IptablesSeam, Observation, FamilySettings, FamilyPlan
    ]
):
    mode = "iptables"
    capabilities = frozenset(
        {"localhost-nodeports", "session-affinity", "sctp", "ipv6", "load-balancer-source-ranges"}
    )
    required_tools = ("iptables", "iptables-restore", "iptables-save")
    #: The kernel seam (``BackendContext.kernel``, else ``Iptables(ctx.netns)``).
    kernel: IptablesSeam

    def __init__(self, ctx: BackendContext) -> None:
        super().__init__(ctx)
        #: nfacct counters: assumed present (any current kernel has nfacct) until prepare()
        #: finds out, so a render does not depend on the machine it runs on.
        self._nfacct = frozenset(NFACCT_COUNTERS)
        #: Per family, the interface addresses its renderer's settings were made with (the
        #: last observation); until the first, the Node's own.
        self._addresses: dict[IPFamily, tuple[str, ...]] = {}
        self._prepared = False

    def real_kernel(self) -> IptablesSeam:
        return Iptables(self.ctx.netns)

    # --- observe and render -----------------------------------------------------------------

    def observe(self, state: ProxyState) -> Observation | None:
        """The saved ruleset of every family whose next render is full, and the addresses."""
        full = [
            f
            for f in self.ctx.families
            if f in state.graphs and self._next_is_full(f, state, state.graphs[f])
        ]
        if not full:
            return None
        addresses = self.kernel.interface_addresses()
        return {
            f: IptablesObserved(SavedRuleset.parse(self.kernel.save(f)), addresses) for f in full
        }

    def _next_is_full(self, family: IPFamily, state: ProxyState, graph: ServiceGraph) -> bool:
        if family not in self.renderers:
            return True
        renderer = self.renderers[family]
        if renderer.settings != self.family_settings(family, state, None):
            return True
        return renderer.next_is_full(graph, state.changes[family])

    def make_renderer(self, settings: FamilySettings) -> FamilyRenderer:
        return FamilyRenderer(settings)

    def family_settings(
        self, family: IPFamily, state: ProxyState, observed: Observation | None
    ) -> FamilySettings:
        seen = observed.get(family) if observed else None
        if seen is not None:
            self._addresses[family] = seen.addresses
        node = state.node
        cfg = self.ctx.config
        addresses = self._addresses.get(family, node.addresses)
        npa = tuple(cfg.node_port_addresses)
        ports_ips = node_port_ips(npa, node, family, addresses)
        return FamilySettings(
            family=family,
            masquerade_mark=f"{1 << cfg.iptables.masquerade_bit:#08x}",
            masquerade_all=cfg.iptables.masquerade_all,
            local=local_detector(cfg, node, family),
            # As upstream: only IPv4, and only if nodePortAddresses admits 127.0.0.1 at all.
            localhost_node_ports=bool(cfg.iptables.localhost_node_ports)
            and family is IPFamily.IPv4
            and (ports_ips is None or admits_loopback(npa)),
            node_port_ips=ports_ips,
            node_ips=node.addresses_of(family),
            nfacct_counters=self._nfacct,
            conntrack_tcp_liberal=cfg.conntrack.tcp_be_liberal,
        )

    def render_family(
        self,
        renderer: FamilyRenderer,
        graph: ServiceGraph,
        changes: ChangeSet,
        observed: Observation | None,
    ) -> FamilyPlan:
        plan = renderer.render(graph, changes)
        seen = observed.get(plan.family) if observed else None
        if plan.full and seen is not None:
            saved = seen.saved
            # Before the plan is committed: the renderer's record is what the last sync wrote.
            written = {"filter": renderer.applied_filter, "nat": renderer.applied_nat}
            plan.repaired = readback.written_drift(written, saved)
            plan.before = Before(saved=saved)
            plan.existing = saved.chains.get("nat", set())
            # Chains left by an earlier run (or process) that nothing needs any more.
            for chain in saved.chains.get("nat", set()):
                if names.is_service_chain(chain) and chain not in plan.nat_wanted:
                    plan.delete.add(chain)
            plan.prelude = prelude(saved, {"filter": set(plan.filter), "nat": set(plan.nat)})
            if plan.family is IPFamily.IPv4 and renderer.settings.localhost_node_ports:
                # Localhost NodePorts need martian 127/8 destinations to be routable.
                plan.sysctls = ((ROUTE_LOCALNET, "1"),)
        else:
            applied = renderer.applied_nat
            plan.before = Before(applied={"filter": renderer.applied_filter, "nat": applied})
            plan.existing = frozenset(
                c for c in plan.nat if not names.is_service_chain(c) and c in applied
            )
        return plan

    def combine(self, plans: list[FamilyPlan]) -> IptablesRendered:
        return IptablesRendered(plans)

    # --- apply ------------------------------------------------------------------------------

    def prepare(self) -> None:
        """One-time node setup before the first apply: the nfacct counters."""
        if self._prepared:
            return
        self._nfacct = self.kernel.ensure_nfacct(NFACCT_COUNTERS)
        self._prepared = True

    def family_plans(self, rendered: IptablesRendered) -> list[tuple[IPFamily, FamilyPlan]]:
        return [(plan.family, plan) for plan in rendered.plans]

    def apply_family(self, family: IPFamily, plan: FamilyPlan) -> Applied | None:
        """One family all or nothing (``restore_all``); the other family's write does not
        depend on it."""
        for key, value in plan.sysctls:
            self.kernel.sysctl(key, value)
        inputs = plan.inputs()
        if inputs:
            restore_all(self.kernel, family, inputs, plan.before)
        renderer = self.renderers[family]
        renderer.commit(plan)
        if not inputs:
            return None
        samples = []
        for table, written in (("filter", plan.filter), ("nat", plan.nat)):
            total, last = renderer.rules_owned[table], sum(map(len, written.values()))
            samples.append(Sample(metrics.IPTABLES_TOTAL, (family.value, table), total))
            samples.append(Sample(metrics.IPTABLES_LAST, (family.value, table), last))
        return Applied(
            counts={
                "rules": plan.rule_count,
                "chains_deleted": len(plan.delete),
                "restores": 1,
            },
            failed=plan.errors,
            no_local_endpoints=NoLocalEndpoints(
                plan.no_local_endpoints.get("internal", 0),
                plan.no_local_endpoints.get("external", 0),
            ),
            samples=tuple(samples),
            repaired=tuple(plan.repaired),
        )

    # --- beside the sync path ---------------------------------------------------------------

    def metric_families(self) -> Sequence[MetricFamily]:
        return metrics.FAMILIES

    def scrape(self) -> Sequence[Sample]:
        out = []
        for counter, family in metrics.NFACCT_FAMILIES.items():
            try:
                packets = self.kernel.read_nfacct(counter)
            except Exception:  # a scrape never fails on it: the counter is left out
                log.exception("reading nfacct counter %s failed", counter)
                packets = None
            if packets is not None:
                out.append(Sample(family, (), packets))
        return out

    def _found(self, keep: Collection[str] = ()) -> list[tuple[IPFamily, list[Artifacts]]]:
        return [
            (f, readback.artifacts(SavedRuleset.parse(self.kernel.save(f)), f, keep))
            for f in self.ctx.families
        ]

    def cleanup(self, keep: Collection[str] = (), drain: bool = False) -> CleanupReport:
        """Remove every chain and jump kubeplex (or upstream kube-proxy) made, in every
        family, but what ``keep`` names. KUBE-FIREWALL goes only where it is the mode's own
        copy (``readback.firewall_is_ours``), and route_localnet, which it guarded, with it."""
        saved = [(f, SavedRuleset.parse(self.kernel.save(f))) for f in self.ctx.families]
        removed: list[str] = []
        if not any(readback.artifacts(ruleset, f) for f, ruleset in saved):
            # Nothing of the mode here: ``keep`` (maybe read only when asked) is not needed.
            self.invalidate()
            return CleanupReport(self.mode, ())
        keep = set(keep)
        if readback.ROUTE_LOCALNET_LINE in keep:  # the active mode needs it: keep its guard
            keep.add(readback.GUARD_LINE)
        for family, ruleset in saved:
            found = readback.artifacts(ruleset, family, keep)
            text = removal(found)
            if not text:
                continue
            if readback.removes_martian_guard(family, found):
                # Before the guard goes: 127/8 must never be routable without it.
                self.kernel.sysctl(ROUTE_LOCALNET, "0")
            self.kernel.restore(family, text)
            lines = readback.describe(family, found)
            removed += [ln for ln in lines if ln not in keep]
            log.info("removed iptables rules (%s)", family.value)
        self.invalidate()
        return CleanupReport(self.mode, tuple(removed))

    def leftovers(self) -> list[str]:
        return [line for f, found in self._found() for line in readback.describe(f, found)]

    def inspect(self, service_port: ServicePortName) -> list[ProgrammedService] | None:
        out = []
        for family in self.ctx.families:
            nat = SavedRuleset.parse(self.kernel.save(family, "nat", counters=True))
            filter_ = SavedRuleset.parse(self.kernel.save(family, "filter"))
            # What the last render (the caller's) made of the service port's own chains.
            renderer = self.renderers.get(family)
            fragment = renderer.fragments.get(service_port) if renderer is not None else None
            chains = fragment.chains if fragment is not None else None
            found = readback.programmed(service_port, family, nat, filter_, chains)
            if found is not None:
                out.append(found)
        return out

    def missing_requirements(self) -> list[str]:
        missing = super().missing_requirements()
        if IPFamily.IPv6 in self.ctx.families and not shutil.which("ip6tables-restore"):
            missing.append("executable 'ip6tables-restore' not found in PATH")
        return missing
