"""From the graph to iptables-restore input, re-rendering only changed services.

The renderer keeps each service's rules (``ServiceRules``) from the previous render. A partial
sync re-renders the changed services, rebuilds the shared chains from the cached fragments,
and writes only the chains whose rules differ from what was applied: a chain that is not
declared in the restore input keeps its rules and its counters.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from kubeplex.backends.iptables import names
from kubeplex.backends.iptables.rules import (
    KUBELET_FIREWALL,
    LARGE_CLUSTER_ENDPOINTS,
    FamilySettings,
    ServiceRules,
    nodeports_jump,
    service_rules,
    static_rules,
)
from kubeplex.core.backend import Rendered
from kubeplex.core.errors import BackendError
from kubeplex.core.graph import ChangeSet, ServiceGraph
from kubeplex.core.model import IPFamily, ServicePortName

#: Fixed chains, in upstream's order of declaration.
FILTER_CHAINS = (
    names.SERVICES,
    names.EXTERNAL_SERVICES,
    names.FORWARD,
    names.NODEPORTS,
    names.PROXY_FIREWALL,
)
NAT_CHAINS = (names.SERVICES, names.NODEPORTS, names.POSTROUTING, names.MARK_MASQ)

Chains = dict[str, tuple[str, ...]]


@dataclass
class FamilyPlan:
    """What one iptables-restore call for one family will write."""

    family: IPFamily
    full: bool
    filter: Chains = field(default_factory=dict)
    nat: Chains = field(default_factory=dict)
    #: Every nat chain the ruleset needs after this sync, fixed and per-service.
    nat_wanted: Chains = field(default_factory=dict)
    filter_wanted: Chains = field(default_factory=dict)
    #: nat service chains to delete (found by the renderer; the apply step may add more).
    delete: set[str] = field(default_factory=set)
    #: Services that could not be rendered, with the reason (their old rules stay).
    errors: dict[str, str] = field(default_factory=dict)
    large_cluster: bool = False
    no_local_endpoints: dict[str, int] = field(default_factory=dict)

    def restore_input(self, prelude: Mapping[str, list[str]] | None = None) -> str:
        """The exact iptables-restore (--noflush) input; ``prelude`` adds lines per table."""
        lines: list[str] = []
        for table, chains, extra_delete in (
            ("filter", self.filter, set[str]()),
            ("nat", self.nat, self.delete),
        ):
            pre = (prelude or {}).get(table, [])
            if not chains and not extra_delete and not pre:
                continue
            lines.append(f"*{table}")
            lines.extend(f":{chain} - [0:0]" for chain in chains)
            lines.extend(f":{chain} - [0:0]" for chain in sorted(extra_delete))
            # Declarations first, then the jumps into chains declared above.
            lines.extend(line for line in pre if line.startswith(":"))
            lines.extend(line for line in pre if not line.startswith(":"))
            for rules in chains.values():
                lines.extend(rules)
            lines.extend(f"-X {chain}" for chain in sorted(extra_delete))
            lines.append("COMMIT")
        for table, pre in (prelude or {}).items():
            if table not in ("filter", "nat") and pre:
                lines += [f"*{table}", *pre, "COMMIT"]
        return "\n".join(lines) + "\n" if lines else ""

    @property
    def empty(self) -> bool:
        return not (self.filter or self.nat or self.delete)


@dataclass
class IptablesRendered(Rendered):
    plans: list[FamilyPlan]

    @property
    def full(self) -> bool:
        return any(p.full for p in self.plans)

    def __str__(self) -> str:
        out = []
        for plan in self.plans:
            tool = "ip6tables-restore" if plan.family is IPFamily.IPv6 else "iptables-restore"
            kind = "full" if plan.full else "partial"
            out.append(f"# {tool} --noflush input ({plan.family.value}, {kind} sync)\n")
            out.append(plan.restore_input())
        return "".join(out)


class FamilyRenderer:
    """Render state for one IP family: cached per-service rules and what was last applied."""

    def __init__(self, settings: FamilySettings) -> None:
        self.settings = settings
        self.fragments: dict[ServicePortName, ServiceRules] = {}
        self.large_cluster = False
        #: Set when cached fragments cannot be trusted (settings changed): next render is full.
        self.force_full = True
        #: Chains (and their rules) known to be in the kernel after the last successful apply.
        self.applied_filter: Chains = {}
        self.applied_nat: Chains = {}

    def invalidate(self) -> None:
        self.force_full = True
        self.fragments.clear()
        self.applied_filter = {}
        self.applied_nat = {}

    def render(self, graph: ServiceGraph, changes: ChangeSet) -> FamilyPlan:
        large = graph.total_endpoints() > LARGE_CLUSTER_ENDPOINTS
        # Comments change with the mode, so a switch rewrites every chain.
        full = changes.full or large != self.large_cluster or self.force_full
        self.force_full = False
        plan = FamilyPlan(graph.family, full, large_cluster=large)
        if full:
            todo: Iterable[ServicePortName] = graph.services
            old_fragments: dict[ServicePortName, ServiceRules] = self.fragments
            self.fragments = {}
        else:
            todo = changes.services
            old_fragments = {spn: self.fragments[spn] for spn in todo if spn in self.fragments}
        for spn in todo:
            svc = graph.services.get(spn)
            if svc is None:
                self.fragments.pop(spn, None)
                continue
            try:
                self.fragments[spn] = service_rules(
                    svc, graph.categorized(spn), self.settings, large
                )
            except BackendError as err:
                plan.errors[str(spn)] = str(err)
                if spn in old_fragments:  # keep the service's last good rules
                    self.fragments[spn] = old_fragments[spn]
        self.large_cluster = large
        self._assemble(plan, todo if not full else None, old_fragments)
        return plan

    def _assemble(
        self,
        plan: FamilyPlan,
        changed: Iterable[ServicePortName] | None,
        old_fragments: Mapping[ServicePortName, ServiceRules],
    ) -> None:
        ordered = [self.fragments[spn] for spn in sorted(self.fragments)]
        static = static_rules(self.settings)
        filter_wanted: Chains = {
            names.SERVICES: tuple(r for f in ordered for r in f.filter_services),
            names.EXTERNAL_SERVICES: tuple(r for f in ordered for r in f.filter_external),
            names.FORWARD: tuple(static[("filter", names.FORWARD)]),
            names.NODEPORTS: tuple(r for f in ordered for r in f.filter_nodeports),
            names.PROXY_FIREWALL: tuple(r for f in ordered for r in f.filter_firewall),
        }
        # Declared after the fixed chains, as upstream does; never deleted (kubelet shares it).
        kubelet_firewall = static.get(("filter", KUBELET_FIREWALL))
        if kubelet_firewall is not None:
            filter_wanted[KUBELET_FIREWALL] = tuple(kubelet_firewall)
        nat_wanted: Chains = {
            names.SERVICES: tuple(
                [r for f in ordered for r in f.nat_services] + nodeports_jump(self.settings)
            ),
            names.NODEPORTS: tuple(r for f in ordered for r in f.nat_nodeports),
            names.POSTROUTING: tuple(static[("nat", names.POSTROUTING)]),
            names.MARK_MASQ: tuple(static[("nat", names.MARK_MASQ)]),
        }
        plan.no_local_endpoints = {
            "internal": sum(f.no_local_endpoints_internal for f in ordered),
            "external": sum(f.no_local_endpoints_external for f in ordered),
        }
        if changed is None:
            for frag in ordered:
                for chain, rules in frag.chains.items():
                    nat_wanted[chain] = tuple(rules)
            plan.filter = dict(filter_wanted)
            plan.nat = dict(nat_wanted)
            plan.delete = {c for c in self.applied_nat if names.is_service_chain(c)} - set(
                nat_wanted
            )
        else:
            plan.filter = {
                c: r for c, r in filter_wanted.items() if self.applied_filter.get(c) != r
            }
            plan.nat = {c: r for c, r in nat_wanted.items() if self.applied_nat.get(c) != r}
            nat_wanted = {**self.applied_nat, **nat_wanted}
            for spn in changed:
                old = old_fragments.get(spn)
                new = self.fragments.get(spn)
                new_chains = new.chains if new is not None else {}
                for chain, rules in new_chains.items():
                    t = tuple(rules)
                    nat_wanted[chain] = t
                    if self.applied_nat.get(chain) != t:
                        plan.nat[chain] = t
                for chain in old.chains if old is not None else {}:
                    if chain not in new_chains:
                        plan.delete.add(chain)
                        nat_wanted.pop(chain, None)
        plan.filter_wanted = filter_wanted
        plan.nat_wanted = nat_wanted

    def commit(self, plan: FamilyPlan) -> None:
        """Record a successfully applied plan as the kernel's state."""
        self.applied_filter = plan.filter_wanted
        self.applied_nat = plan.nat_wanted
