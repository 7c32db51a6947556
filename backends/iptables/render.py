"""From the graph to iptables-restore input, re-rendering only changed services.

The renderer keeps each service's rules (``ServiceRules``) from the previous render. A partial
sync re-renders the changed services, rebuilds the shared chains from the cached fragments,
and writes only the chains whose rules differ from what was applied: a chain that is not
declared in the restore input keeps its rules and its counters.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Collection, Iterable, Mapping, Sequence
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
from kubeplex.backends.netfilter import iptables
from kubeplex.backends.netfilter.rollback import Before
from kubeplex.core.dataplane.backend import Rendered, RuleDrift
from kubeplex.core.model.errors import BackendError
from kubeplex.core.model.graph import ChangeSet, ServiceGraph
from kubeplex.core.model.types import IPFamily, ServicePortName

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

#: Rules per iptables-restore input before a large plan is split (see FamilyPlan.batches).
BATCH_RULES = iptables.BATCH_RULES


@dataclass
class FamilyPlan:
    """What one family's sync writes: the chains, and (rendered with an observation of the
    kernel) the lines and settings that make them live on this node."""

    family: IPFamily
    full: bool
    filter: Chains = field(default_factory=dict)
    nat: Chains = field(default_factory=dict)
    #: Full plans only: every chain the ruleset needs after this sync, fixed and per-service.
    nat_wanted: Chains = field(default_factory=dict)
    filter_wanted: Chains = field(default_factory=dict)
    #: nat service chains to delete: those the renderer dropped, and (observed) the ones an
    #: earlier run left that nothing needs.
    delete: set[str] = field(default_factory=set)
    #: Services that could not be rendered, with the reason (their old rules stay).
    errors: dict[str, str] = field(default_factory=dict)
    large_cluster: bool = False
    no_local_endpoints: dict[str, int] = field(default_factory=dict)
    #: The service chains of ``nat``, grouped by service: a group is written in one restore.
    groups: list[tuple[str, ...]] = field(default_factory=list)
    #: Observed full plans: lines per table creating missing canary chains and jumps.
    prelude: dict[str, list[str]] = field(default_factory=dict)
    #: nat chains the kernel holds already (whether a batched write must create fixed chains).
    existing: Collection[str] = frozenset()
    #: Sysctls to set before writing, (key, value).
    sysctls: tuple[tuple[str, str], ...] = ()
    #: What the kernel held before, for the rollback of a half-applied write.
    before: Before = field(default_factory=Before)
    #: Observed full plans: rules of the mode's chains that differ from what it last wrote
    #: (this plan writes them again).
    repaired: list[RuleDrift] = field(default_factory=list)

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

    @property
    def rule_count(self) -> int:
        return sum(map(len, self.filter.values())) + sum(map(len, self.nat.values()))

    def inputs(self) -> list[str]:
        """Every restore input the apply step sends for this plan, in order (none if empty)."""
        if self.empty and not any(self.prelude.values()):
            return []
        return self.batches(self.prelude, self.existing)

    def batches(
        self,
        prelude: Mapping[str, list[str]] | None = None,
        existing_nat: Collection[str] = frozenset(),
        limit: int | None = None,
    ) -> list[str]:
        """The restore inputs that apply this plan, in order.

        One input (atomic) when the plan is small. iptables-nft-restore slows down with the
        square of one input's size (docs/benchmarks.md), so a large plan is written as whole
        services' chains in batches first — unreferenced until the last input, or replacing a
        service's chains all at once — and then the fixed chains, jumps and deletions that make
        them live.
        """
        limit = BATCH_RULES if limit is None else limit
        if self.rule_count <= limit:
            return [self.restore_input(prelude)]
        out: list[str] = []
        fixed = {c: r for c, r in self.nat.items() if not names.is_service_chain(c)}
        # Service chains jump to KUBE-MARK-MASQ: create the fixed chains that do not exist
        # yet, empty (declaring an existing chain would flush it before its time).
        missing = [c for c in fixed if c not in existing_nat]
        if missing:
            out.append("*nat\n" + "".join(f":{c} - [0:0]\n" for c in missing) + "COMMIT\n")
        grouped = {c for g in self.groups for c in g}
        loose = tuple(c for c in self.nat if names.is_service_chain(c) and c not in grouped)
        batch: Chains = {}
        size = 0
        for group in [*self.groups, loose]:
            chains = {c: self.nat[c] for c in group if c in self.nat}
            n = sum(map(len, chains.values()))
            if batch and size + n > limit:
                out.append(FamilyPlan(self.family, self.full, nat=batch).restore_input())
                batch, size = {}, 0
            batch.update(chains)
            size += n
        if batch:
            out.append(FamilyPlan(self.family, self.full, nat=batch).restore_input())
        last = FamilyPlan(self.family, self.full, filter=self.filter, nat=fixed, delete=self.delete)
        out.append(last.restore_input(prelude))
        return out


@dataclass
class IptablesRendered(Rendered):
    plans: list[FamilyPlan]

    @property
    def full(self) -> bool:
        return any(p.full for p in self.plans)

    def kernel_inputs(self) -> Sequence[str]:
        return [text for plan in self.plans for text in plan.inputs()]

    def __str__(self) -> str:
        out = []
        for plan in self.plans:
            tool = "ip6tables-restore" if plan.family is IPFamily.IPv6 else "iptables-restore"
            kind = "full" if plan.full else "partial"
            inputs = plan.inputs() or [""]
            for i, text in enumerate(inputs, 1):
                n = f" {i} of {len(inputs)}" if len(inputs) > 1 else ""
                out.append(f"# {tool} --noflush input{n} ({plan.family.value}, {kind} sync)\n")
                if i == 1:
                    out += [f"# sysctl {key}={value}\n" for key, value in plan.sysctls]
                out.append(text)
        return "".join(out)


def _is_large(graph: ServiceGraph) -> bool:
    """Whether upstream's large-cluster mode applies (more than LARGE_CLUSTER_ENDPOINTS)."""
    return graph.total_endpoints() > LARGE_CLUSTER_ENDPOINTS


#: ServiceRules fields that feed the fixed chains, by (table, chain).
SHARED = {
    ("filter", names.SERVICES): "filter_services",
    ("filter", names.EXTERNAL_SERVICES): "filter_external",
    ("filter", names.NODEPORTS): "filter_nodeports",
    ("filter", names.PROXY_FIREWALL): "filter_firewall",
    ("nat", names.SERVICES): "nat_services",
    ("nat", names.NODEPORTS): "nat_nodeports",
}


class FamilyRenderer:
    """Render state for one IP family: cached per-service rules and what was last applied.

    A partial render costs what the change costs: the shared chains are re-joined only when a
    changed service's contribution to them changed, and the service order is kept sorted
    incrementally.
    """

    def __init__(self, settings: FamilySettings) -> None:
        self.settings = settings
        self.fragments: dict[ServicePortName, ServiceRules] = {}
        self.large_cluster = False
        #: Set when cached fragments cannot be trusted (settings changed): next render is full.
        self.force_full = True
        #: Chains (and their rules) known to be in the kernel after the last successful apply.
        self.applied_filter: Chains = {}
        self.applied_nat: Chains = {}
        self._order: list[ServicePortName] = []
        self._shared: dict[tuple[str, str], tuple[str, ...]] = {}
        self._no_local = {"internal": 0, "external": 0}
        #: Rules kubeplex owns in each table after the last apply (a metric).
        self.rules_owned = {"filter": 0, "nat": 0}

    def invalidate(self) -> None:
        self.force_full = True
        self.fragments.clear()
        self.applied_filter = {}
        self.applied_nat = {}

    def next_is_full(self, graph: ServiceGraph, changes: ChangeSet) -> bool:
        """Whether rendering ``graph`` now rewrites everything."""
        return self._is_full(changes, _is_large(graph))

    def _is_full(self, changes: ChangeSet, large: bool) -> bool:
        # Comments change with the mode, so a switch rewrites every chain.
        return changes.full or large != self.large_cluster or self.force_full

    def render(self, graph: ServiceGraph, changes: ChangeSet) -> FamilyPlan:
        large = _is_large(graph)
        full = self._is_full(changes, large)
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
            except Exception as err:  # one Service's bug costs that Service only
                why = str(err) if isinstance(err, BackendError) else f"rendering failed: {err!r}"
                plan.errors[str(spn)] = why
                if spn in old_fragments:  # keep the service's last good rules
                    self.fragments[spn] = old_fragments[spn]
        self.large_cluster = large
        if full:
            self._assemble_full(plan)
        else:
            self._assemble_partial(plan, changes.services, old_fragments)
        return plan

    def _join(self, attr: str) -> tuple[str, ...]:
        fragments = self.fragments
        return tuple(r for spn in self._order for r in getattr(fragments[spn], attr))

    def _fixed_chains(self) -> tuple[Chains, Chains]:
        """The fixed chains' rules, from the cached joins and the static rules."""
        static = static_rules(self.settings)
        shared = self._shared
        filter_chains: Chains = {
            names.SERVICES: shared[("filter", names.SERVICES)],
            names.EXTERNAL_SERVICES: shared[("filter", names.EXTERNAL_SERVICES)],
            names.FORWARD: tuple(static[("filter", names.FORWARD)]),
            names.NODEPORTS: shared[("filter", names.NODEPORTS)],
            names.PROXY_FIREWALL: shared[("filter", names.PROXY_FIREWALL)],
        }
        # Declared after the fixed chains, as upstream does; never deleted (kubelet shares it).
        kubelet_firewall = static.get(("filter", KUBELET_FIREWALL))
        if kubelet_firewall is not None:
            filter_chains[KUBELET_FIREWALL] = tuple(kubelet_firewall)
        nat_chains: Chains = {
            names.SERVICES: shared[("nat", names.SERVICES)] + tuple(nodeports_jump(self.settings)),
            names.NODEPORTS: shared[("nat", names.NODEPORTS)],
            names.POSTROUTING: tuple(static[("nat", names.POSTROUTING)]),
            names.MARK_MASQ: tuple(static[("nat", names.MARK_MASQ)]),
        }
        return filter_chains, nat_chains

    def _assemble_full(self, plan: FamilyPlan) -> None:
        self._order = sorted(self.fragments)
        self._shared = {key: self._join(attr) for key, attr in SHARED.items()}
        ordered = self.fragments.values()
        self._no_local = {
            "internal": sum(f.no_local_endpoints_internal for f in ordered),
            "external": sum(f.no_local_endpoints_external for f in ordered),
        }
        plan.no_local_endpoints = dict(self._no_local)
        filter_chains, nat_chains = self._fixed_chains()
        for spn in self._order:
            chains = self.fragments[spn].chains
            for chain, rules in chains.items():
                nat_chains[chain] = tuple(rules)
            plan.groups.append(tuple(chains))
        plan.filter = filter_chains
        plan.nat = nat_chains
        plan.filter_wanted = filter_chains
        plan.nat_wanted = nat_chains
        plan.delete = {c for c in self.applied_nat if names.is_service_chain(c)} - set(nat_chains)

    def _assemble_partial(
        self,
        plan: FamilyPlan,
        changed: Iterable[ServicePortName],
        old_fragments: Mapping[ServicePortName, ServiceRules],
    ) -> None:
        dirty: set[tuple[str, str]] = set()
        for spn in changed:
            old = old_fragments.get(spn)
            new = self.fragments.get(spn)
            if (old is None) != (new is None):
                if new is None:
                    del self._order[bisect_left(self._order, spn)]
                else:
                    insort(self._order, spn)
            for key, attr in SHARED.items():
                if (getattr(old, attr) if old else []) != (getattr(new, attr) if new else []):
                    dirty.add(key)
            for which in ("internal", "external"):
                attr = f"no_local_endpoints_{which}"
                self._no_local[which] += int(bool(new and getattr(new, attr))) - int(
                    bool(old and getattr(old, attr))
                )
            new_chains = new.chains if new is not None else {}
            group = []
            for chain, rules in new_chains.items():
                t = tuple(rules)
                if self.applied_nat.get(chain) != t:
                    plan.nat[chain] = t
                    group.append(chain)
            if group:
                plan.groups.append(tuple(group))
            for chain in old.chains if old is not None else {}:
                if chain not in new_chains:
                    plan.delete.add(chain)
        for key in dirty:
            self._shared[key] = self._join(SHARED[key])
        plan.no_local_endpoints = dict(self._no_local)
        filter_chains, nat_chains = self._fixed_chains()
        plan.filter = {c: r for c, r in filter_chains.items() if self.applied_filter.get(c) != r}
        plan.nat.update({c: r for c, r in nat_chains.items() if self.applied_nat.get(c) != r})

    def commit(self, plan: FamilyPlan) -> None:
        """Record a successfully applied plan as the kernel's state."""
        if plan.full:
            self.applied_filter = dict(plan.filter_wanted)
            self.applied_nat = dict(plan.nat_wanted)
            self.rules_owned = {
                "filter": sum(map(len, self.applied_filter.values())),
                "nat": sum(map(len, self.applied_nat.values())),
            }
            return
        owned = self.rules_owned
        for table, applied, written in (
            ("filter", self.applied_filter, plan.filter),
            ("nat", self.applied_nat, plan.nat),
        ):
            for chain, rules in written.items():
                owned[table] += len(rules) - len(applied.get(chain, ()))
            applied.update(written)
        for chain in plan.delete:
            owned["nat"] -= len(self.applied_nat.pop(chain, ()))
