"""The nftables dataplane: upstream kube-proxy's nftables mode, object for object.

Everything lives in its own tables, ``ip kube-proxy`` and ``ip6 kube-proxy`` (never the shared
nat/filter tables); every sync of every family is one atomic transaction: ``nft -f -`` for full
syncs, the same batch straight over netlink for partial ones (kernel.py, netlink.py). The one
exception is a big first sync into a namespace without the tables: it goes in stages, the
services' chains first and the elements that make them reachable last (FamilyPlan.stages).
Differences from the iptables mode are upstream's: no NodePorts on localhost, connections to
unused ports of a ClusterIP are rejected, and no nfacct/route_localnet setup is needed.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable, Mapping, Sequence

from kubeplex.backends.nftables import names
from kubeplex.backends.nftables.kernel import NftKernel, TableObjects
from kubeplex.backends.nftables.render import FamilyPlan, FamilyRenderer, NftablesRendered
from kubeplex.backends.nftables.rules import FamilySettings, go_hex_mark
from kubeplex.core.config.localdetect import local_detector
from kubeplex.core.dataplane.backend import Backend, BackendContext, PerFamily, Rendered, SyncResult
from kubeplex.core.model.errors import BackendError
from kubeplex.core.model.graph import ProxyState
from kubeplex.core.model.types import IPFamily, NodeInfo, ServicePortName, family_of

log = logging.getLogger(__name__)

NODE_PORT_PRIMARY = "primary"
#: What nft reports when a kernel before 6.2 still counts a reference from a map element
#: deleted earlier in the same transaction.
_BUSY = "Device or resource busy"
#: A first sync into a namespace without the tables, if longer than STAGE_MIN_LINES (about
#: 400 Services), goes in transactions of about STAGE_LINES lines (FamilyPlan.stages): one
#: transaction costs O(services^2) in the kernel, and over netlink the next stage is encoded
#: while the kernel commits one. Measured at 1,000 Services: 0.75 s as one transaction,
#: 0.38 s in stages of 10,000 lines.
STAGE_MIN_LINES = 20_000
STAGE_LINES = 10_000
#: How often one sync re-renders without the services the kernel refused, before it gives up
#: (and fails as a whole, as without isolation).
ISOLATION_ATTEMPTS = 3


def node_port_ips(
    addresses: Sequence[str], node: NodeInfo, family: IPFamily
) -> tuple[str, ...] | None:
    """Upstream's NodePortAddresses for one family: None means every local address.

    "primary" becomes the node's primary address of each family as a /32 or /128 (as
    cmd/kube-proxy does), so a family without a node address serves NodePorts everywhere.
    The node's addresses (from its Node object) stand in for the local interface addresses.
    """
    entries = list(addresses)
    if entries == [NODE_PORT_PRIMARY]:
        entries = []
        for fam, bits in ((IPFamily.IPv4, 32), (IPFamily.IPv6, 128)):
            primary = node.addresses_of(fam)[:1]
            if primary and not ipaddress.ip_address(primary[0]).is_loopback:
                entries.append(f"{primary[0]}/{bits}")
    nets = [
        ipaddress.ip_network(e, strict=False)
        for e in entries
        if e != NODE_PORT_PRIMARY and family_of(e) is family
    ]
    if not nets or any(n.prefixlen == 0 for n in nets):
        return None
    return tuple(
        ip
        for ip in dict.fromkeys(node.addresses_of(family))
        if any(ipaddress.ip_address(ip) in n for n in nets)
    )


class NftablesBackend(Backend):
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

    def __init__(self, ctx: BackendContext) -> None:
        super().__init__(ctx)
        self._renderers = PerFamily(FamilyRenderer)
        self._kernel = NftKernel(ctx.netns)
        #: Cleanup failures (stale chains not deleted, table listings that failed) per family,
        #: not yet reported: the next successful sync's counts carry them to the metric.
        self._cleanup_failures: dict[IPFamily, int] = {}

    def _cleanup_failed(self, families: Iterable[IPFamily]) -> None:
        for family in families:
            self._cleanup_failures[family] = self._cleanup_failures.get(family, 0) + 1

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
            node_port_ips=node_port_ips(tuple(cfg.node_port_addresses), node, family),
            node_ip=own[0] if own else "",
            service_cidrs=tuple(c for c in service_cidrs if family_of(c) is family),
        )

    def render(
        self,
        state: ProxyState,
        left_out: Mapping[IPFamily, Mapping[ServicePortName, str]] | None = None,
    ) -> NftablesRendered:
        """``left_out``: per family, services to keep as the kernel holds them (see sync)."""
        plans = []
        for family in self.ctx.families:
            graph = state.graphs.get(family)
            if graph is not None:
                settings = self.settings(family, state.node, state.service_cidrs)
                renderer = self._renderers.with_settings(family, settings)
                skip = (left_out or {}).get(family)
                plans.append(renderer.render(graph, state.changes[family], skip))
        return NftablesRendered(plans)

    def sync(self, state: ProxyState) -> SyncResult:
        """Render and apply; if the kernel (or the encoder) refuses commands of some services,
        render again without them (kept as the kernel holds them) and apply that: one broken
        Service costs only itself. A refusal that names no service fails the sync as before."""
        left_out: dict[IPFamily, dict[ServicePortName, str]] = {}
        for attempt in range(ISOLATION_ATTEMPTS + 1):
            rendered = self.render(state, left_out)
            try:
                return self._apply(rendered)
            except BackendError as err:
                culprits = {
                    plan.settings.family: self._renderers[plan.settings.family].owners_of(
                        plan, str(err)
                    )
                    for plan in rendered.plans
                }
                for plan in rendered.plans:
                    self._renderers[plan.settings.family].rollback(plan)
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

    def _find_leftovers(self, plans: list[FamilyPlan]) -> bool:
        """On a full sync: what the table holds that nothing wants (earlier runs, versions),
        and what it lacks. True if no plan's table exists yet (a first sync from scratch)."""
        full = [p for p in plans if p.full]
        if not full:
            return False
        found = self._kernel.list_objects(p.settings.ip for p in full)
        if found is None:
            # Listing failed (logged): no leftovers removed, nothing repaired.
            self._cleanup_failed(p.settings.family for p in full)
            return False
        for plan in full:
            objs = found.get(plan.settings.ip, TableObjects())
            plan.found_in_kernel(objs.chains, objs.sets, objs.maps)
        return len(full) == len(plans) and not any(p.settings.ip in found for p in full)

    def _apply_staged(self, plans: list[FamilyPlan]) -> int:
        """A first sync into empty tables, in stages (FamilyPlan.stages); returns how many
        transactions it took. A failure leaves inert objects that the next (full) sync, which
        finds the tables, rewrites or removes in one transaction."""
        texts = [stage for plan in plans for stage in plan.stages(STAGE_LINES)]
        texts.append("".join(plan.last_stage() for plan in plans))
        texts = [t for t in texts if t]
        self._kernel.run_stages(texts)
        return len(texts)

    def _delete_pending(self) -> None:
        """Chains a kernel before 6.2 refused to delete in their sync: delete them now."""
        lines = [
            f"delete chain {r.settings.table} {chain}\n"
            for r in self._renderers
            for chain in sorted(r.pending_chain_deletes)
        ]
        if not lines:
            return
        try:
            self._kernel.run("".join(lines))
        except BackendError as err:
            log.warning("stale nftables chains not deleted yet, will retry: %s", err)
            self._cleanup_failed(
                r.settings.family for r in self._renderers if r.pending_chain_deletes
            )
            return
        for r in self._renderers:
            r.pending_chain_deletes.clear()

    def apply(self, rendered: Rendered) -> SyncResult:
        assert isinstance(rendered, NftablesRendered)
        try:
            return self._apply(rendered)
        except BackendError:
            self.invalidate()
            raise

    def _apply(self, rendered: NftablesRendered) -> SyncResult:
        """``apply`` without the invalidation on failure (``sync`` may retry the render)."""
        plans = rendered.plans
        self._delete_pending()
        fresh = self._find_leftovers(plans)
        text = rendered.kernel_input()
        transactions = 0
        staged = fresh and all(not p.trusted for p in plans)
        if staged and text.count("\n") > max(STAGE_MIN_LINES, STAGE_LINES):
            transactions = self._apply_staged(plans)
        elif text:
            try:
                self._kernel.run(text)
            except BackendError as err:
                if _BUSY not in str(err) or not any(p.chains_deleted for p in plans):
                    raise
                # Kernels before 6.2 notice only later that a chain lost its last reference
                # from a map element: leave the chains flushed, delete them in a later sync.
                log.info("kernel refused to delete unreferenced chains at once: deferring")
                self._kernel.run(rendered.kernel_input(defer_chain_deletes=True))
                for plan in plans:
                    plan.deferred_chains = plan.stale_chains | plan.leftover_chains
            transactions = 1
        counts = {
            "transactions": transactions,
            "chains_written": 0,
            "chains_deleted": 0,
            "elements_added": 0,
            "elements_deleted": 0,
        }
        errors: dict[str, str] = {}
        for plan in plans:
            errors.update((str(spn), why) for spn, why in plan.errors.items())
            self._renderers[plan.settings.family].commit(plan)
            counts["chains_written"] += len(plan.chains_written)
            counts["chains_deleted"] += plan.chains_deleted
            counts["elements_added"] += len(plan.elements_added)
            counts["elements_deleted"] += len(plan.elements_deleted)
            fam = plan.settings.family.value
            for kind in ("internal", "external"):
                counts[f"no_local_endpoints_{kind}_{fam}"] = plan.no_local_endpoints.get(kind, 0)
        counts["services_failed"] = len(errors)
        for family, failures in self._cleanup_failures.items():
            counts[f"nftables_cleanup_failures_{family.value}"] = failures
        self._cleanup_failures = {}
        return SyncResult(full=rendered.full, counts=counts, failed=errors)

    def invalidate(self) -> None:
        for r in self._renderers:
            r.invalidate()

    def cleanup(self) -> None:
        """Remove both kube-proxy tables (as upstream's CleanupLeftovers), whoever made them."""
        self._kernel.delete_tables(("ip", "ip6"))
        log.info("removed nftables tables ip/ip6 %s", names.TABLE)
        self._renderers.clear()

    def describe(self) -> Sequence[str]:
        return [
            *super().describe(),
            f"tables: ip {names.TABLE}, ip6 {names.TABLE} (one transaction per sync:"
            " nft -f, or netlink for partial syncs)",
        ]
