"""The iptables dataplane: upstream kube-proxy's iptables mode, rule for rule."""

from __future__ import annotations

import ipaddress
import logging
import shutil

from kubeplex.backends.iptables import names
from kubeplex.backends.iptables.prelude import prelude
from kubeplex.backends.iptables.render import FamilyPlan, FamilyRenderer, IptablesRendered
from kubeplex.backends.iptables.rules import (
    NFACCT_INVALID_DROPPED,
    NFACCT_LOCALHOST_NODEPORTS,
    FamilySettings,
)
from kubeplex.backends.netfilter.iptables import IptablesKernel
from kubeplex.backends.netfilter.rollback import Before, restore_all
from kubeplex.core.config.localdetect import local_detector
from kubeplex.core.dataplane.backend import Backend, BackendContext, PerFamily, Rendered, SyncResult
from kubeplex.core.model.errors import BackendError
from kubeplex.core.model.graph import ProxyState
from kubeplex.core.model.types import IPFamily, NodeInfo, family_of

log = logging.getLogger(__name__)

NFACCT_COUNTERS = (NFACCT_LOCALHOST_NODEPORTS, NFACCT_INVALID_DROPPED)
FIXED_CHAINS = frozenset(
    {
        names.SERVICES,
        names.EXTERNAL_SERVICES,
        names.NODEPORTS,
        names.POSTROUTING,
        names.MARK_MASQ,
        names.FORWARD,
        names.PROXY_FIREWALL,
        names.CANARY,
    }
)


def node_port_ips(
    addresses: tuple[str, ...], node: NodeInfo, family: IPFamily, local: tuple[str, ...]
) -> tuple[str, ...] | None:
    """Upstream's nodePortAddresses for one family: None means every local address."""
    mine = [a for a in addresses if a == "primary" or family_of(a) is family]
    if not mine:
        return None
    ips: list[str] = []
    for entry in mine:
        if entry == "primary":
            ips += node.addresses_of(family)[:1]
            continue
        net = ipaddress.ip_network(entry, strict=False)
        if net.prefixlen == 0:
            return None
        ips += [ip for ip in local if family_of(ip) is family and ipaddress.ip_address(ip) in net]
    return tuple(dict.fromkeys(ips))


def admits_loopback(addresses: tuple[str, ...]) -> bool:
    """Upstream's ContainsIPv4Loopback: a nodePortAddresses CIDR holding 127.0.0.1."""
    loopback = ipaddress.ip_address("127.0.0.1")
    return any(
        a != "primary"
        and family_of(a) is IPFamily.IPv4
        and loopback in ipaddress.ip_network(a, strict=False)
        for a in addresses
    )


class IptablesBackend(Backend):
    mode = "iptables"
    capabilities = frozenset(
        {"localhost-nodeports", "session-affinity", "sctp", "ipv6", "load-balancer-source-ranges"}
    )
    required_tools = ("iptables", "iptables-restore", "iptables-save")

    def __init__(self, ctx: BackendContext) -> None:
        super().__init__(ctx)
        self._renderers = PerFamily(FamilyRenderer)
        self._kernels = {f: IptablesKernel(f, ctx.netns) for f in ctx.families}
        #: nfacct counters: assumed present (any current kernel has nfacct) until prepare()
        #: finds out, so a render does not depend on the machine it runs on.
        self._nfacct = frozenset(NFACCT_COUNTERS)
        #: The node's interface addresses (prepare() reads them); until then the Node's own.
        self._host_addresses: tuple[str, ...] | None = None
        self._prepared = False

    # --- render -----------------------------------------------------------------------------

    def settings(self, family: IPFamily, node: NodeInfo) -> FamilySettings:
        cfg = self.ctx.config
        addresses = self._host_addresses if self._host_addresses is not None else node.addresses
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

    def render(self, state: ProxyState) -> IptablesRendered:
        plans = []
        for family in self.ctx.families:
            graph = state.graphs.get(family)
            if graph is not None:
                renderer = self._renderers.with_settings(family, self.settings(family, state.node))
                plans.append(renderer.render(graph, state.changes[family]))
        return IptablesRendered(plans)

    # --- apply ------------------------------------------------------------------------------

    def prepare(self) -> None:
        """One-time node setup before the first apply: nfacct counters, route_localnet."""
        if self._prepared:
            return
        kernel = next(iter(self._kernels.values()))
        self._nfacct = (
            kernel.ensure_nfacct(NFACCT_COUNTERS) if shutil.which("nfacct") else frozenset()
        )
        self._host_addresses = kernel.interface_addresses()
        self._prepared = True

    def apply(self, rendered: Rendered) -> SyncResult:
        """Each family all or nothing, and independent: one family's failure leaves its
        previous rules and does not keep the other family from being written."""
        assert isinstance(rendered, IptablesRendered)
        counts = {"rules": 0, "chains_deleted": 0, "restores": 0}
        errors: dict[str, str] = {}
        failed: dict[IPFamily, str] = {}
        for plan in rendered.plans:
            try:
                self._apply_plan(plan, counts, errors)
            except BackendError as err:
                self._renderers[plan.family].invalidate()
                failed[plan.family] = f"{plan.family.value}: {err}"
        if failed:
            for svc, why in errors.items():
                log.error("service %s not programmed: %s", svc, why)
            raise BackendError("; ".join(failed.values()), families=tuple(failed))
        # The Proxier logs these; their last good rules stay until they render again.
        return SyncResult(full=rendered.full, counts=counts, failed=errors)

    def _apply_plan(self, plan: FamilyPlan, counts: dict[str, int], errors: dict[str, str]) -> None:
        kernel = self._kernels[plan.family]
        renderer = self._renderers[plan.family]
        extra: dict[str, list[str]] = {}
        existing = set(renderer.applied_nat)
        before = Before(applied={"filter": renderer.applied_filter, "nat": renderer.applied_nat})
        if plan.full:
            saved = kernel.save()
            before = Before(saved=saved)
            existing = saved.chains.get("nat", set())
            # Chains left by an earlier run (or process) that nothing needs any more.
            for chain in saved.chains.get("nat", set()):
                if names.is_service_chain(chain) and chain not in plan.nat_wanted:
                    plan.delete.add(chain)
            extra = prelude(saved, {"filter": set(plan.filter), "nat": set(plan.nat)})
            if plan.family is IPFamily.IPv4 and renderer.settings.localhost_node_ports:
                # Localhost NodePorts need martian 127/8 destinations to be routable.
                kernel.sysctl("net.ipv4.conf.all.route_localnet", "1")
        if plan.empty and not extra:
            renderer.commit(plan)
            return
        restore_all(kernel, plan.batches(extra, existing), before)
        renderer.commit(plan)
        if plan.full:
            # NodePort addresses follow the interfaces; a change re-renders everything.
            self._host_addresses = kernel.interface_addresses()
        counts["restores"] += 1
        fam = plan.family.value
        for table, written in (("filter", plan.filter), ("nat", plan.nat)):
            counts[f"iptables_total_{table}_{fam}"] = renderer.rules_owned[table]
            counts[f"iptables_last_{table}_{fam}"] = sum(map(len, written.values()))
        counts["rules"] += plan.rule_count
        counts["chains_deleted"] += len(plan.delete)
        errors.update(plan.errors)
        counts[f"no_local_endpoints_internal_{fam}"] = plan.no_local_endpoints.get("internal", 0)
        counts[f"no_local_endpoints_external_{fam}"] = plan.no_local_endpoints.get("external", 0)

    def invalidate(self) -> None:
        for r in self._renderers:
            r.invalidate()

    def cleanup(self) -> None:
        """Remove every chain and jump kubeplex (or upstream kube-proxy) made, in every family."""
        for family, kernel in self._kernels.items():
            saved = kernel.save()
            lines: list[str] = []
            for table in ("filter", "nat", "mangle"):
                chains = saved.chains.get(table, set())
                ours = sorted(c for c in chains if c in FIXED_CHAINS or names.is_service_chain(c))
                jumps = [
                    r.replace("-A ", "-D ", 1)
                    for r in saved.rules.get(table, [])
                    if r.split()[1] not in ours and any(r.endswith(f"-j {c}") for c in ours)
                ]
                if not ours and not jumps:
                    continue
                lines.append(f"*{table}")
                lines += [f":{c} - [0:0]" for c in ours]
                lines += jumps
                lines += [f"-X {c}" for c in ours]
                lines.append("COMMIT")
            if lines:
                kernel.restore("\n".join(lines) + "\n")
                log.info("removed iptables rules (%s)", family.value)
        self.invalidate()

    def missing_requirements(self) -> list[str]:
        missing = super().missing_requirements()
        if IPFamily.IPv6 in self.ctx.families and not shutil.which("ip6tables-restore"):
            missing.append("executable 'ip6tables-restore' not found in PATH")
        return missing
