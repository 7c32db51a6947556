"""The nftables dataplane: upstream kube-proxy's nftables mode, object for object.

Everything lives in its own tables, ``ip kube-proxy`` and ``ip6 kube-proxy`` (never the shared
nat/filter tables); every sync of every family is one atomic transaction: ``nft -f -`` for full
syncs, the same batch straight over netlink for partial ones (kernel.py, netlink.py). Two
exceptions, where one transaction would cost the kernel O(services^2): a big first sync into a
namespace without the tables goes in stages, the services' chains first and the elements that
make them reachable last (FamilyPlan.stages); and a sync with many chains the kernel does not
hold yet (a burst of new Services, partial or full) sends those ahead in stages, and the rest,
elements and every change to what packets meet, as one last transaction (fresh_stages).
Differences from the iptables mode are upstream's: no NodePorts on localhost, connections to
unused ports of a ClusterIP are rejected, and no nfacct/route_localnet setup is needed.

The kernel is an ``NftSeam`` (kernel.py; ``NftKernel`` on a node). ``observe`` lists the
tables' object names on a full sync; ``render`` turns that listing into the plan's leftover
deletions and repairs, decides whether a first load goes in stages, and puts the chains
earlier syncs could not delete in a transaction of their own, first; ``apply`` sends
``kernel_inputs()``. One exception, for kernels before 6.2: when the kernel refuses a sync's
chain deletions with "Device or resource busy", apply sends the plan's own deferred form
(``kernel_input(defer_chain_deletes=True)``: the chains left flushed, deleted by a later sync).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kubeplex.backends.nftables import names
from kubeplex.backends.nftables.fingerprints import ChainRecords
from kubeplex.backends.nftables.generation import GenerationSeam
from kubeplex.backends.nftables.kernel import NftKernel, NftSeam
from kubeplex.backends.nftables.listing import (
    TableObjects,
    kube_proxy_tables,
    listing_commands,
    parse_listing,
    parse_table,
    rendered_chains,
)
from kubeplex.backends.nftables.render import FamilyPlan, FamilyRenderer, NftablesRendered
from kubeplex.backends.nftables.rules import FamilySettings, go_hex_mark
from kubeplex.core.config.localdetect import local_detector
from kubeplex.core.dataplane.backend import (
    Applied,
    BackendContext,
    CleanupReport,
    FamilyBackend,
    MetricEvent,
    MetricFamily,
    NoLocalEndpoints,
    ProgrammedService,
    Rendered,
    Sample,
    SyncResult,
)
from kubeplex.core.dataplane.nodeports import node_port_ips
from kubeplex.core.model.errors import BackendError
from kubeplex.core.model.graph import ChangeSet, ProxyState, ServiceGraph
from kubeplex.core.model.types import IPFamily, NodeInfo, ServicePortName, family_of

log = logging.getLogger(__name__)

#: What nft reports when a kernel before 6.2 still counts a reference from a map element
#: deleted earlier in the same transaction.
_BUSY = "Device or resource busy"
#: A first sync into a namespace without the tables, if longer than STAGE_MIN_LINES (about
#: 400 Services), goes in transactions of about STAGE_LINES lines (FamilyPlan.stages): one
#: transaction costs O(services^2) in the kernel, and over netlink the next stage is encoded
#: while the kernel commits one. Measured at 1,000 Services: 0.75 s as one transaction,
#: 0.38 s in stages of 10,000 lines.
#: Into tables that exist, the chains and sets the kernel does not hold yet go ahead the same
#: way when they make more than STAGE_MIN_LINES lines (FamilyPlan.fresh_stages), in pieces of
#: about FRESH_STAGE_LINES: each commit also validates the whole table's jump graph, so into a
#: big table fewer, bigger stages cost less (chosen with bench/burst_sync.py at 1,000 and
#: 10,000 Services).
STAGE_MIN_LINES = 20_000
STAGE_LINES = 10_000
FRESH_STAGE_LINES = 20_000
#: How often one sync re-renders without the services the kernel refused, before it gives up
#: (and fails as a whole, as without isolation).
ISOLATION_ATTEMPTS = 3

#: Upstream's nftables metrics (pkg/proxy/metrics), as the daemon registers them.
SYNC_FAILURES = "kubeproxy_sync_proxy_rules_nftables_sync_failures_total"
CLEANUP_FAILURES = "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total"
METRIC_FAMILIES = (
    MetricFamily(
        SYNC_FAILURES,
        "Cumulative proxy nftables sync failures",
        "counter",
        on=MetricEvent.SYNC_FAILED,
    ),
    MetricFamily(CLEANUP_FAILURES, "Cumulative proxy nftables cleanup failures", "counter"),
)


def _ip(family: IPFamily) -> str:
    """nft's family keyword of the table ("ip", "ip6")."""
    return "ip6" if family is IPFamily.IPv6 else "ip"


#: A full sync's listing: the object names, the rules of chains (by family, chain -> its
#: rules) and, by family, which chains those are where not every one (``NftObserved``).
_ListedRules = tuple[
    dict[str, TableObjects], dict[str, dict[str, list[str]]], dict[str, frozenset[str]]
]


@dataclass(frozen=True)
class NftObserved:
    """What a sync's render needs of the kernel (``NftablesBackend.observe``)."""

    #: The families ("ip", "ip6") whose tables were listed: those rendered in full.
    listed: tuple[str, ...] = ()
    #: The listing by family (a family missing: no table); None: the listing failed.
    tables: Mapping[str, TableObjects] | None = field(default_factory=dict)
    #: Chains awaiting deletion from earlier syncs, by table ("ip kube-proxy"), when
    #: observed: the listing may still show them, but they are not leftovers of this sync.
    pending: Mapping[str, frozenset[str]] = field(default_factory=dict)
    #: Services the kernel refused earlier in this sync, per family, with the reason (see
    #: ``sync``): kept as the kernel holds them.
    left_out: Mapping[IPFamily, Mapping[ServicePortName, str]] = field(default_factory=dict)
    #: The tables' chains with their rules, by family, where they were listed whole (the
    #: renderer holds a record of what it wrote there to compare them with).
    rules: Mapping[str, Mapping[str, Sequence[str]]] = field(default_factory=dict)
    #: Where only some chains of a table were listed with their rules (those that changed
    #: since kubeplex's last write, fingerprints.py), by family: those chains.
    compared: Mapping[str, frozenset[str]] = field(default_factory=dict)


class NftablesBackend(
    FamilyBackend[
        FamilyRenderer, NftablesRendered, NftSeam, NftObserved, FamilySettings, FamilyPlan
    ]
):
    """The kernel seam (``BackendContext.kernel``) is an ``NftSeam``."""

    mode = "nftables"
    capabilities = frozenset(
        {
            "session-affinity",
            "sctp",
            "ipv6",
            "load-balancer-source-ranges",
            "reject-unused-clusterip-ports",
        }
    )
    required_tools = ("nft",)
    kernel: NftSeam

    def __init__(self, ctx: BackendContext) -> None:
        super().__init__(ctx)
        #: Cleanup failures (stale chains not deleted, table listings that failed) per family,
        #: not yet reported: the next successful sync's samples carry them to the metric.
        self._cleanup_failures: dict[IPFamily, int] = {}
        #: The tables' rules as kubeplex's last writes left them: which chains to list.
        self._records = ChainRecords()

    def real_kernel(self) -> NftKernel:
        return NftKernel(self.ctx.netns)

    def sync_periods(self) -> tuple[float, float]:
        cfg = self.ctx.config.nftables
        return cfg.sync_period, cfg.min_sync_period

    def metric_families(self) -> Sequence[MetricFamily]:
        return METRIC_FAMILIES

    def _cleanup_failed(self, families: Iterable[IPFamily]) -> None:
        for family in families:
            self._cleanup_failures[family] = self._cleanup_failures.get(family, 0) + 1

    # --- observe ----------------------------------------------------------------------------

    def _renders_full(self, family: IPFamily, state: ProxyState) -> bool:
        """Whether the next render of ``family`` is a full one (as ``render`` decides)."""
        if state.changes[family].full or family not in self.renderers:
            return True
        renderer = self.renderers[family]
        return renderer.force_full or renderer.settings != self.family_settings(family, state, None)

    def observe(self, state: ProxyState) -> NftObserved:
        """On a full sync, the names of the tables' chains, sets and maps: leftovers of
        earlier runs to remove, and what went missing. A failed listing is observed too (no
        leftovers removed, a cleanup failure counted)."""
        pending = {
            r.settings.table: frozenset(r.pending_chain_deletes)
            for r in self.renderers
            if r.pending_chain_deletes
        }
        full = tuple(
            _ip(f) for f in self.ctx.families if f in state.graphs and self._renders_full(f, state)
        )
        if not full:
            return NftObserved(pending=pending)
        rules = self._list_rules(full)
        if rules is not None:
            objects, tables, compared = rules
            return NftObserved(
                listed=full,
                tables=objects,
                pending=pending,
                rules=tables,
                compared=compared,
            )
        try:
            text = self.kernel.list(listing_commands(full), terse=True)
        except BackendError as err:
            log.error("listing nftables objects failed, leftovers stay: %s", err)
            return NftObserved(listed=full, tables=None, pending=pending)
        return NftObserved(listed=full, tables=parse_listing(text), pending=pending)

    def _list_rules(self, full: tuple[str, ...]) -> _ListedRules | None:
        """If the renderer holds a record of what it wrote in every table of ``full``: their
        object names, and the rules to compare with the record (by family, chain -> rules):
        of the chains that changed since kubeplex's last write (the third item, by family),
        or else of every chain (the tables listed whole, without set elements). None: no
        record, or a table is gone."""
        recorded = {_ip(r.settings.family) for r in self.renderers if not r.force_full}
        if not set(full) <= recorded:  # a table rewritten whole: its base is read first
            self._records.rewriting(self.kernel)
            return None
        changed = self._records.changed(self.kernel, full)
        if changed is not None:
            return self._list_changed(full, changed)
        texts = {}
        for fam in full:  # one table per nft run: nft 1.0.6 fails a second "list table"
            try:
                texts[fam] = self.kernel.list(f"list table {fam} {names.TABLE}\n", terse=True)
            except BackendError as err:  # a table removed: the object listing tells the rest
                log.info("listing nftables table %s %s failed: %s", fam, names.TABLE, err)
                return None
        tables = {f: parse_table(t).chains for f, t in texts.items()}
        return parse_listing("".join(texts.values())), tables, {}

    def _list_changed(
        self, full: tuple[str, ...], changed: Mapping[str, set[str]]
    ) -> _ListedRules | None:
        """The object names of the tables of ``full``, and the ``changed`` chains with their
        rules, one nft run per chain (nft 1.0.6 fails a second "list chain" in a run);
        None if nft fails."""
        try:
            text = self.kernel.list(listing_commands(full), terse=True)
        except BackendError:  # told by the object listing again
            return None
        objects = parse_listing(text)
        held: dict[str, dict[str, list[str]]] = {}
        for fam, chains in changed.items():
            held[fam] = {}
            there = objects.get(fam, TableObjects()).chains
            for chain in sorted(chains & there):
                try:
                    listed = self.kernel.list(f"list chain {fam} {names.TABLE} {chain}\n", True)
                except BackendError as err:  # deleted since: as if without rules
                    log.info("listing nftables chain %s %s failed: %s", fam, chain, err)
                    continue
                held[fam].update(parse_table(listed).chains)
        return objects, held, {fam: frozenset(chains) for fam, chains in changed.items()}

    # --- render -----------------------------------------------------------------------------

    def settings(
        self, family: IPFamily, node: NodeInfo, service_cidrs: Sequence[str] = ()
    ) -> FamilySettings:
        """``service_cidrs``: the cluster's ServiceCIDRs (both families; upstream reads the
        ServiceCIDR objects): traffic to an address in them that no Service has is dropped."""
        cfg = self.ctx.config
        own = node.addresses_of(family)
        return FamilySettings(
            family=family,
            masquerade_mark=go_hex_mark(cfg.nftables.masquerade_bit),
            masquerade_all=cfg.nftables.masquerade_all,
            local=local_detector(cfg, node, family),
            # nftables reads no interface addresses: the Node's own stand in for them.
            node_port_ips=node_port_ips(cfg.node_port_addresses, node, family, own),
            node_ip=own[0] if own else "",
            service_cidrs=tuple(c for c in service_cidrs if family_of(c) is family),
        )

    def make_renderer(self, settings: FamilySettings) -> FamilyRenderer:
        return FamilyRenderer(settings)

    def family_settings(
        self, family: IPFamily, state: ProxyState, observed: NftObserved | None
    ) -> FamilySettings:
        return self.settings(family, state.node, state.service_cidrs)

    def render_family(
        self,
        renderer: FamilyRenderer,
        graph: ServiceGraph,
        changes: ChangeSet,
        observed: NftObserved | None,
    ) -> FamilyPlan:
        skip = observed.left_out.get(renderer.settings.family) if observed is not None else None
        return renderer.render(graph, changes, skip)

    def combine(self, plans: list[FamilyPlan]) -> NftablesRendered:
        return NftablesRendered(plans)

    def render(self, state: ProxyState, observed: NftObserved | None = None) -> NftablesRendered:
        """Without an observation: the families' transaction only (one per sync). With one
        (``observe``): also the leftovers to remove and the chains to repair, the pending
        chain deletions of earlier syncs (a first transaction), and the stages of a big first
        load into tables that did not exist."""
        rendered = super().render(state, observed)
        if isinstance(observed, NftObserved):
            self._with_kernel(rendered, observed)
        return rendered

    def _with_kernel(self, rendered: NftablesRendered, observed: NftObserved) -> None:
        plans = rendered.plans
        rendered.pending_deletes = "".join(
            f"delete chain {r.settings.table} {chain}\n"
            for r in self.renderers
            for chain in sorted(r.pending_chain_deletes)
        )
        listed = [p for p in plans if p.full and p.settings.ip in observed.listed]
        if not listed:
            stage_new_objects(rendered, observed)
            return
        if observed.tables is None:
            rendered.listing_failed = tuple(p.settings.family for p in listed)
            return
        for plan in listed:
            objs = observed.tables.get(plan.settings.ip, TableObjects())
            # Chains the pending transaction deletes first are not this sync's to touch.
            gone = (
                observed.pending.get(plan.table, frozenset())
                | self.renderers[plan.settings.family].pending_chain_deletes
            )
            plan.found_in_kernel(objs.chains - gone, objs.sets, objs.maps)
            held = observed.rules.get(plan.settings.ip)
            if held is not None and plan.trusted:
                renderer = self.renderers[plan.settings.family]
                plan.found_rules(
                    held, renderer.applied_chains, observed.compared.get(plan.settings.ip)
                )
        fresh = len(listed) == len(plans) and not any(
            p.settings.ip in observed.tables for p in listed
        )
        if fresh and all(not p.trusted for p in plans):
            lines = rendered.kernel_input().count("\n")
            if lines > max(STAGE_MIN_LINES, STAGE_LINES):
                rendered.stages = _stages(plans)
        else:
            stage_new_objects(rendered, observed)

    def sync(self, state: ProxyState) -> SyncResult:
        """Observe once, render and apply; if the kernel (or the encoder) refuses commands of
        some services, render again without them (kept as the kernel holds them) and apply
        that: one broken Service costs only itself. A refusal that names no service fails
        the sync as before."""
        observed = self.observe(state)
        left_out: dict[IPFamily, dict[ServicePortName, str]] = {}
        for attempt in range(ISOLATION_ATTEMPTS + 1):
            rendered = self.render(state, dataclasses.replace(observed, left_out=left_out))
            try:
                return self._apply(rendered, count_listing=attempt == 0)
            except BackendError as err:
                culprits = {
                    plan.settings.family: self.renderers[plan.settings.family].owners_of(
                        plan, str(err)
                    )
                    for plan in rendered.plans
                }
                for plan in rendered.plans:
                    self.renderers[plan.settings.family].rollback(plan)
                found = any(culprits.values())
                if not found or attempt == ISOLATION_ATTEMPTS:
                    self.invalidate()
                    raise
                why = f"the kernel refused its rules: {err}"
                for family, spns in culprits.items():
                    for spn in spns:
                        left_out.setdefault(family, {})[spn] = why
                log.warning(
                    "nftables sync refused; retrying without %s",
                    ", ".join(sorted(str(s) for spns in culprits.values() for s in spns)),
                )
        raise AssertionError("unreachable")  # pragma: no cover

    # --- apply ------------------------------------------------------------------------------

    def _delete_pending(self, text: str) -> None:
        """Chains a kernel before 6.2 refused to delete in their sync: delete them now (a
        failure is a cleanup failure, not a failed sync)."""
        try:
            self.kernel.run(text)
        except BackendError as err:
            log.warning("stale nftables chains not deleted yet, will retry: %s", err)
            self._cleanup_failed(
                r.settings.family for r in self.renderers if r.pending_chain_deletes
            )
            return
        for r in self.renderers:
            r.pending_chain_deletes.clear()

    def apply(self, rendered: Rendered) -> SyncResult:
        assert isinstance(rendered, NftablesRendered)
        try:
            return self._apply(rendered)
        except BackendError:
            self.invalidate()
            raise

    def _apply(self, rendered: NftablesRendered, count_listing: bool = True) -> SyncResult:
        """``apply`` without the invalidation on failure (``sync`` may retry the render);
        ``count_listing``: count a failed listing (once per observation)."""
        if count_listing:
            self._cleanup_failed(rendered.listing_failed)
        return super().apply(rendered)

    def apply_whole(self, rendered: NftablesRendered) -> Applied:
        """The sync's transactions, each for every family: the pending chain deletions, the
        stages, then the plan (or its deferred form, on a kernel before 6.2)."""
        plans = rendered.plans
        if rendered.pending_deletes:
            self._delete_pending(rendered.pending_deletes)
        transactions = 0
        if rendered.fresh_stages:
            self.kernel.run_stages(rendered.fresh_stages, empty_tables=False)
            transactions = len(rendered.fresh_stages)
        if rendered.stages:
            self.kernel.run_stages(rendered.stages)
            transactions = len(rendered.stages)
        elif text := rendered.kernel_input():
            try:
                self.kernel.run(text)
            except BackendError as err:
                if _BUSY not in str(err) or not any(p.chains_deleted for p in plans):
                    raise
                # Kernels before 6.2 notice only later that a chain lost its last reference
                # from a map element: leave the chains flushed, delete them in a later sync.
                log.info("kernel refused to delete unreferenced chains at once: deferring")
                self.kernel.run(rendered.kernel_input(defer_chain_deletes=True))
                for plan in plans:
                    plan.deferred_chains = plan.stale_chains | plan.leftover_chains
            transactions += 1
        samples = tuple(
            Sample(CLEANUP_FAILURES, (family.value,), failures, add=True)
            for family, failures in self._cleanup_failures.items()
        )
        self._cleanup_failures = {}
        return Applied(counts={"transactions": transactions}, samples=samples)

    def family_plans(self, rendered: NftablesRendered) -> list[tuple[IPFamily, FamilyPlan]]:
        return [(plan.settings.family, plan) for plan in rendered.plans]

    def apply_family(self, family: IPFamily, plan: FamilyPlan) -> Applied:
        """Nothing left to write (``apply_whole`` sent every family): the renderer's record."""
        self.renderers[family].commit(plan)
        self._record_write(plan)
        return Applied(
            counts={
                "chains_written": len(plan.chains_written),
                "chains_deleted": plan.chains_deleted,
                "elements_added": len(plan.elements_added),
                "elements_deleted": len(plan.elements_deleted),
            },
            failed={str(spn): why for spn, why in plan.errors.items()},
            no_local_endpoints=NoLocalEndpoints(
                plan.no_local_endpoints.get("internal", 0),
                plan.no_local_endpoints.get("external", 0),
            ),
            repaired=tuple(plan.repaired),
        )

    def _record_write(self, plan: FamilyPlan) -> None:
        """Fingerprint what ``plan``'s write left in the chains it flushed, filled or
        deleted, for the next trusted full sync to list only the chains changed since."""
        setup = rendered_chains("".join(plan.parts[: plan.setup_parts]), plan.table)
        touched = (
            set(plan.chains_written)
            | plan.stale_chains
            | plan.leftover_chains
            | plan.deferred_chains
            | set(setup)
        )
        drifted = {d.chain for d in plan.repaired}
        # Chains awaiting deletion were left out of the write: not all of the table was set.
        whole = not self.renderers[plan.settings.family].pending_chain_deletes
        self._records.written(
            self.kernel, plan.settings.ip, plan.full, touched, drifted, plan.trusted, whole
        )

    def invalidate(self) -> None:
        super().invalidate()
        self._records.forget()
        if isinstance(self.kernel, GenerationSeam):
            self.kernel.generations.forget()

    # --- beside the sync path ---------------------------------------------------------------

    def _tables(self) -> list[str]:
        """The families ("ip", "ip6") with a kube-proxy table on the node."""
        return kube_proxy_tables(self.kernel.list("list tables\n"))

    def _artifacts(self, present: Sequence[str]) -> list[str]:
        """The tables of ``present`` families and every chain, set and map in them."""
        if not present:
            return []
        try:
            listed = parse_listing(self.kernel.list(listing_commands(tuple(present)), terse=True))
        except BackendError as err:  # the tables alone, then
            log.warning("listing nftables objects failed: %s", err)
            listed = {}
        lines: list[str] = []
        for fam in present:
            lines.append(_table_line(fam))
            objs = listed.get(fam, TableObjects())
            for kind, found in (("chain", objs.chains), ("set", objs.sets), ("map", objs.maps)):
                lines += [f"nftables {fam} {names.TABLE} {kind} {name}" for name in sorted(found)]
        return lines

    def cleanup(self, keep: Collection[str] = (), drain: bool = False) -> CleanupReport:
        """Remove both kube-proxy tables (as upstream's CleanupLeftovers), whoever made them;
        reports those that existed, with what they held. A table ``keep`` names stays whole
        (no other mode shares the tables, so only a mode of the same tables would name it)."""
        present = [fam for fam in self._tables() if _table_line(fam) not in keep]
        removed = self._artifacts(present)
        if present:
            # "add" first: a table removed meanwhile would fail the whole transaction.
            self.kernel.run(
                "".join(
                    f"add table {fam} {names.TABLE}\ndelete table {fam} {names.TABLE}\n"
                    for fam in present
                )
            )
            log.info("removed nftables tables %s", ", ".join(f"{f} {names.TABLE}" for f in present))
        self.renderers.clear()
        self._records.forget()
        return CleanupReport(self.mode, tuple(removed))

    def leftovers(self) -> list[str]:
        """The kube-proxy tables on the node and every chain, set and map in them."""
        return self._artifacts(self._tables())

    def inspect(self, service_port: ServicePortName) -> list[ProgrammedService]:
        out = []
        # Imported here: ``explain`` reads the kernel, the daemon never does (4 ms at start).
        from kubeplex.backends.nftables import inspection

        present = set(self._tables())
        for family in self.ctx.families:
            fam = _ip(family)
            if fam not in present:
                continue
            try:
                text = self.kernel.list(f"list table {fam} {names.TABLE}\n")
            except BackendError as err:  # removed since
                log.debug("listing table %s %s failed: %s", fam, names.TABLE, err)
                continue
            # What the last render (the caller's) made of the service port's own chains.
            renderer = self.renderers.get(family)
            fragment = renderer.fragments.get(service_port) if renderer is not None else None
            rendered = fragment.chains if fragment is not None else None
            found = inspection.programmed(service_port, family, text, rendered)
            if found is not None:
                out.append(found)
        return out

    def describe(self) -> Sequence[str]:
        return [
            *super().describe(),
            f"tables: ip {names.TABLE}, ip6 {names.TABLE} (one transaction per sync:"
            " nft -f, or netlink for partial syncs)",
        ]


def _table_line(fam: str) -> str:
    return f"nftables table {fam} {names.TABLE}"


def stage_new_objects(rendered: NftablesRendered, observed: NftObserved) -> None:
    """Send the plans' new chains and sets ahead, in stages, when there are many of them (a
    burst of new Services): only into tables that exist (a partial plan's, or a full plan's
    the listing found), so nothing but the last transaction changes what packets meet. A
    burst stays a partial sync: a full one sends the same stages and then every element and
    fixed chain again, so it costs no less (bench/burst_sync.py measures both)."""
    plans = rendered.plans
    tables = observed.tables or {}
    if any(p.full and p.fresh_parts and p.settings.ip not in tables for p in plans):
        return
    if sum(p.fresh_lines for p in plans) > STAGE_MIN_LINES:
        rendered.fresh_stages = [s for p in plans for s in p.fresh_stages(FRESH_STAGE_LINES)]


def _stages(plans: list[FamilyPlan]) -> list[str]:
    """A first load into empty tables, in stages (FamilyPlan.stages). A failure leaves
    inert objects that the next (full) sync, which finds the tables, rewrites or removes in
    one transaction."""
    texts = [stage for plan in plans for stage in plan.stages(STAGE_LINES)]
    texts.append("".join(plan.last_stage() for plan in plans))
    return [t for t in texts if t]
