"""The IPVS dataplane: upstream kube-proxy's IPVS mode (deprecated upstream since 1.35).

Virtual services and masquerading real servers in the kernel's IPVS, every Service address
bound to the ``kube-ipvs0`` dummy link (kept down), upstream's ipsets, and a few fixed
iptables chains that match those sets (masquerade, hairpin, NodePorts, source ranges). The
render (desired.py, rules.py) turns the graph into the desired state; reconcile.py diffs it
against what the kernel holds and the plan carries only the difference, so a one-endpoint
change is a constant handful of netlink requests whatever the cluster's size.

The kernel is an ``IpvsSeam`` (plan.py; ``IpvsKernel`` on a node, pyroute2 netlink for IPVS,
links, addresses and ipsets; iptables-restore for the rules). ``observe`` dumps the kernel on
a full sync (with the iptables rules, for the jumps from the built-in chains, and the node's
addresses); on a partial sync it reads only the connection counts of the real servers waiting
for their connections to close (termination.py). ``apply`` sends the plan: creations, the
rules, removals. A refused operation fails the sync; the next one is full and reconciles from
a fresh dump.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import platform
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from kubeplex.backends.ipvs import ipsets, plan, rules
from kubeplex.backends.ipvs.desired import DesiredRenderer, DesiredUpdate
from kubeplex.backends.ipvs.plan import (
    DUMMY_LINK,
    NODE_PORTS,
    Connections,
    FamilyPlan,
    FamilyState,
    IpvsRendered,
    IpvsSeam,
    Op,
    VirtualKey,
    VirtualServer,
)
from kubeplex.backends.ipvs.reconcile import Held, Ownership, empty, reconcile
from kubeplex.backends.ipvs.settings import IpvsSettings, ipvs_settings
from kubeplex.backends.ipvs.termination import Real, Terminating
from kubeplex.backends.netfilter.artifacts import describe as describe_chains
from kubeplex.backends.netfilter.artifacts import find as find_chains
from kubeplex.backends.netfilter.artifacts import jump_line, removal, rule_target
from kubeplex.backends.netfilter.iptables import SavedRuleset
from kubeplex.core.dataplane.backend import (
    Applied,
    BackendContext,
    CleanupReport,
    EndpointView,
    FamilyBackend,
    MetricEvent,
    MetricFamily,
    ProgrammedService,
)
from kubeplex.core.model.errors import BackendError
from kubeplex.core.model.expectations import LOCAL_POLICY_FALLBACK
from kubeplex.core.model.graph import ChangeSet, ProxyState, ServiceGraph
from kubeplex.core.model.types import IPFamily, ServicePortName
from kubeplex.core.model.types import Protocol as L4

log = logging.getLogger(__name__)

#: What upstream logs (as an error) when it starts in ipvs mode (cmd/kube-proxy, 1.35).
DEPRECATION = (
    "The ipvs proxier is now deprecated and may be removed in a future release. "
    "Please use 'nftables' instead."
)
#: Upstream's metrics for the ipvs mode (RegisterMetrics registers this one only for it,
#: beside the ones of every mode).
METRIC_FAMILIES = (
    MetricFamily(
        "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
        "Cumulative proxy iptables restore failures",
        "counter",
        on=MetricEvent.SYNC_FAILED,
    ),
)
#: The sysctls upstream's NewProxier sets, as (key, value).
SYSCTLS = (
    ("net.ipv4.vs.conntrack", "1"),
    ("net.ipv4.vs.expire_nodest_conn", "1"),
    ("net.ipv4.vs.expire_quiescent_template", "1"),
    ("net.ipv4.ip_forward", "1"),
)
STRICT_ARP = (("net.ipv4.conf.all.arp_ignore", "1"), ("net.ipv4.conf.all.arp_announce", "2"))
CONN_REUSE_MODE = "net.ipv4.vs.conn_reuse_mode"
#: Kernels from 5.9 on fixed the connection-reuse stall; before that upstream sets the mode 0.
CONN_REUSE_FIXED = (5, 9)
#: Upstream's probe virtual service, in TEST-NET-2 (RFC 5737), which no Service may use.
PROBE = VirtualKey(L4.TCP, "198.51.100.0", 20000)
#: What ``inspect`` adds to a virtual service no real server can take a new connection of.
NO_REAL_SERVER = "# no real server with a weight: new connections are refused (REJECT)"


@dataclass(frozen=True)
class IpvsObserved:
    """What a sync's render needs of the kernel (``IpvsBackend.observe``)."""

    #: Families rendered in full: the kernel's whole state (with every connection count).
    dumps: Mapping[IPFamily, FamilyState] = field(default_factory=dict)
    #: ... and their iptables rules (the jumps from the built-in chains).
    saved: Mapping[IPFamily, SavedRuleset] = field(default_factory=dict)
    #: The node's addresses (full syncs; None: not read).
    addresses: tuple[str, ...] | None = None
    #: Partial syncs: the connection counts of the terminating real servers.
    connections: Mapping[IPFamily, Mapping[Real, Connections]] = field(default_factory=dict)
    #: When it was observed (monotonic seconds): graceful termination's clock.
    now: float = 0.0


@dataclass(frozen=True)
class Commit:
    """What the backend keeps of one family's plan once it is applied."""

    family: IPFamily
    terminating: Terminating
    #: Full plans: the kernel's state afterwards; partial: None (``Held.apply`` of the ops).
    held: Held | None
    #: The rules text as rendered (before the jumps were added).
    rules_text: str
    update: DesiredUpdate


@dataclass(frozen=True)
class IpvsBackendRendered(IpvsRendered):
    """``IpvsRendered`` with what apply commits per family."""

    commits: tuple[Commit, ...] = field(default=(), compare=False, repr=False)


def _kernel_release() -> tuple[int, ...]:
    parts = []
    for p in platform.release().split("-")[0].split("."):
        if not p.isdigit():
            break
        parts.append(int(p))
    return tuple(parts)


class IpvsBackend(
    FamilyBackend[
        DesiredRenderer,
        IpvsBackendRendered,
        IpvsSeam,
        IpvsObserved,
        IpvsSettings,
        tuple[FamilyPlan, Commit],
    ]
):
    """The kernel seam (``BackendContext.kernel``) is an ``IpvsSeam``."""

    mode = "ipvs"
    capabilities = frozenset(
        {
            "binds-service-ips",
            "ipv6",
            "load-balancer-source-ranges",
            "local-policy-fallback",
            "reject-unused-clusterip-ports",
            "sctp",
            "session-affinity",
            # Upstream's syncEndpoint (PR 97081): no local endpoint, the cluster's.
            LOCAL_POLICY_FALLBACK,
        }
    )
    required_tools = ("iptables", "iptables-restore", "iptables-save")
    #: The mode's data types, for fakes that may not import the backend (the test kit).
    plan: ClassVar[Any] = plan
    kernel: IpvsSeam

    def __init__(self, ctx: BackendContext) -> None:
        super().__init__(ctx)
        #: Per family, what the last applied plan left in the kernel.
        self._held: dict[IPFamily, Held] = {}
        self._terminating: dict[IPFamily, Terminating] = {}
        self._rules: dict[IPFamily, str] = {}
        #: The node's addresses of the last observation (None: the Node's own).
        self._addresses: tuple[str, ...] | None = None
        self._prepared = False

    def real_kernel(self) -> IpvsSeam:
        from kubeplex.backends.ipvs.kernel import IpvsKernel

        return IpvsKernel(self.ctx.netns)

    def sync_periods(self) -> tuple[float, float]:
        cfg = self.ctx.config.ipvs
        return cfg.sync_period, cfg.min_sync_period

    def metric_families(self) -> Sequence[MetricFamily]:
        return METRIC_FAMILIES

    @property
    def scheduler(self) -> str:
        return self.ctx.config.ipvs.scheduler or "rr"

    def missing_requirements(self) -> list[str]:
        return [*super().missing_requirements(), *self.kernel.missing(self.scheduler)]

    def prepare(self) -> None:
        """Upstream's start: the deprecation, the probe that loads IPVS and the scheduler,
        then the sysctls (under net.ipv4.vs only once ip_vs is loaded), IPVS's timeouts."""
        if self._prepared:
            return
        log.error(DEPRECATION)
        self._probe()
        cfg = self.ctx.config.ipvs
        for key, value in SYSCTLS:
            self.kernel.sysctl(key, value)
        if _kernel_release() < CONN_REUSE_FIXED:
            self.kernel.sysctl(CONN_REUSE_MODE, "0")
        if cfg.strict_arp:
            for key, value in STRICT_ARP:
                self.kernel.sysctl(key, value)
        timeouts = (cfg.tcp_timeout, cfg.tcp_fin_timeout, cfg.udp_timeout)
        if any(t > 0 for t in timeouts):
            self.kernel.set_timeouts(*(int(t) for t in timeouts))
        self._prepared = True

    def _probe(self) -> None:
        """Add and delete upstream's probe virtual service with the scheduler: the kernel
        loads ip_vs (for the IPVS netlink family) and the scheduler's module, or says why it
        cannot, before anything else is written (upstream's CanUseIPVSProxier)."""
        v4 = IPFamily.IPv4
        add = Op("add-service", v4, service=VirtualServer(PROBE, self.scheduler))
        remove = Op("del-service", v4, key=PROBE)
        try:
            # One request at a time: the kernel runs every request of a window, so a remove
            # sent with a refused add would run all the same.
            try:
                self.kernel.send(v4, [add])
            except BackendError as first:
                # A probe left by a start stopped between the two: remove it, add it again.
                try:
                    self.kernel.send(v4, [remove])
                    self.kernel.send(v4, [add])
                except BackendError:
                    raise first from None
            self.kernel.send(v4, [remove])
        except BackendError as err:
            said = str(err)
            lacks = [m for m in self.kernel.missing(self.scheduler) if m not in said]
            raise BackendError(
                f"ipvs mode cannot start: the probe virtual service with scheduler "
                f"{self.scheduler!r} was refused: {'; '.join([said, *lacks])}"
            ) from err

    # --- observe ----------------------------------------------------------------------------

    def _renders_full(self, family: IPFamily, state: ProxyState) -> bool:
        if family not in self.renderers or family not in self._held:
            return True
        r = self.renderers[family]
        if r.settings != self.family_settings(family, state, None):
            return True
        return r.next_is_full(state.changes[family])

    def observe(self, state: ProxyState) -> IpvsObserved:
        """Full syncs: the kernel's state of the family, its iptables rules, the node's
        addresses. Partial ones: the terminating real servers' connection counts only."""
        fams = [f for f in self.ctx.families if f in state.graphs]
        full = [f for f in fams if self._renders_full(f, state)]
        now = time.monotonic()
        if not full:
            conns = {
                f: self.kernel.connections(f, self._terminating[f].keys())
                for f in fams
                if len(self._terminating.get(f, Terminating()))
            }
            return IpvsObserved(connections=conns, now=now)
        return IpvsObserved(
            dumps={f: self.kernel.dump(f, connections=True) for f in full},
            saved={f: SavedRuleset.parse(self.kernel.save(f)) for f in full},
            addresses=self.kernel.interface_addresses(),
            connections={
                f: self.kernel.connections(f, self._terminating[f].keys())
                for f in fams
                if f not in full and len(self._terminating.get(f, Terminating()))
            },
            now=now,
        )

    # --- render -----------------------------------------------------------------------------

    def make_renderer(self, settings: IpvsSettings) -> DesiredRenderer:
        return DesiredRenderer(settings)

    def family_settings(
        self, family: IPFamily, state: ProxyState, observed: IpvsObserved | None
    ) -> IpvsSettings:
        if isinstance(observed, IpvsObserved) and observed.addresses is not None:
            self._addresses = observed.addresses
        return ipvs_settings(self.ctx.config, state.node, family, self._addresses)

    def render_family(
        self,
        renderer: DesiredRenderer,
        graph: ServiceGraph,
        changes: ChangeSet,
        observed: IpvsObserved | None,
    ) -> tuple[FamilyPlan, Commit]:
        seen = observed if isinstance(observed, IpvsObserved) else None
        settings = renderer.settings
        fam = settings.family
        if seen is not None and fam in seen.dumps:
            renderer.force_full = True  # observed in full: reconcile everything
        update = renderer.render(graph, changes)
        ownership = Ownership(
            exclude=tuple(ipaddress.ip_network(c) for c in settings.exclude_cidrs),
            node_addresses=frozenset(settings.node_port_ips) | settings.local_addresses,
        )
        terminating = self._terminating.get(fam, Terminating())
        saved = SavedRuleset()
        held: Any
        conns: Mapping[Real, Connections]
        if update.full:
            dump = seen.dumps.get(fam) if seen is not None else None
            if dump is None:  # a render without the kernel: as onto an empty node
                held, conns, terminating = empty(fam), {}, Terminating()
            else:
                held, conns = dump, dump.connections
                saved = seen.saved.get(fam, saved) if seen is not None else saved
        else:
            held = self._held.get(fam) or empty(fam)
            conns = seen.connections.get(fam, {}) if seen is not None else {}
        done = reconcile(
            update,
            held,
            ownership=ownership,
            terminating=terminating,
            connections=conns,
            now=seen.now if seen is not None else 0.0,
            last_iptables=self._rules.get(fam),
        )
        fplan = done.plan
        if update.full and fplan.iptables is not None:
            jumps = rules.jump_prelude(saved)
            fplan = dataclasses.replace(fplan, iptables=rules.with_jumps(fplan.iptables, jumps))
        return fplan, Commit(fam, done.terminating, done.held, update.iptables, update)

    def combine(self, plans: list[tuple[FamilyPlan, Commit]]) -> IpvsBackendRendered:
        return IpvsBackendRendered(
            plans=tuple(p for p, _ in plans), commits=tuple(c for _, c in plans)
        )

    # --- apply ------------------------------------------------------------------------------

    def family_plans(
        self, rendered: IpvsBackendRendered
    ) -> list[tuple[IPFamily, tuple[FamilyPlan, Commit]]]:
        return [
            (fplan.family, (fplan, commit))
            for fplan, commit in zip(rendered.plans, rendered.commits, strict=True)
        ]

    def apply_family(self, family: IPFamily, plan: tuple[FamilyPlan, Commit]) -> Applied:
        """Creations, the rules, removals. A refusal fails the family's sync (what was sent
        before it stays)."""
        fplan, commit = plan
        requests = self._send(family, fplan.before)
        if fplan.iptables is not None:
            self.kernel.restore(family, fplan.iptables)
        requests += self._send(family, fplan.after)
        self._commit(fplan, commit)
        return Applied(
            counts={
                "requests": requests,
                "operations": len(fplan.before) + len(fplan.after),
                "restores": int(fplan.iptables is not None),
            },
            failed=commit.update.errors,
            no_local_endpoints=commit.update.no_local_endpoints,
        )

    def _send(self, family: IPFamily, ops: Sequence[Op]) -> int:
        return self.kernel.send(family, ops) if ops else 0

    def _commit(self, fplan: FamilyPlan, commit: Commit) -> None:
        fam = fplan.family
        if commit.held is not None:
            self._held[fam] = commit.held
        else:
            self._held.setdefault(fam, Held(fam)).apply(fplan.ops())
        self._terminating[fam] = commit.terminating
        self._rules[fam] = commit.rules_text

    def forget_family(self, family: IPFamily) -> None:
        """After a refusal: nothing of what we kept is to be trusted; the next sync is full."""
        self._held.pop(family, None)
        self._rules.pop(family, None)
        super().forget_family(family)

    def invalidate(self) -> None:
        super().invalidate()
        self._held.clear()
        self._rules.clear()

    # --- beside the sync path ---------------------------------------------------------------

    def _found(
        self, keep: Collection[str] = (), connections: bool = False
    ) -> list[tuple[IPFamily, _Artifacts, FamilyState]]:
        out = []
        node = frozenset(self.kernel.interface_addresses())
        for fam in self.ctx.families:
            state = self.kernel.dump(fam, connections=connections)
            saved = SavedRuleset.parse(self.kernel.save(fam))
            out.append((fam, _artifacts(fam, state, saved, node, keep), state))
        return out

    def cleanup(self, keep: Collection[str] = (), drain: bool = False) -> CleanupReport:
        """Remove the virtual services on kube-ipvs0's addresses (and stale NodePorts on the
        node's), kube-ipvs0, the mode's iptables chains and jumps and its ipsets, but what
        ``keep`` names; foreign virtual services and sets stay.

        With ``drain`` (a switch to another mode), a virtual service whose real servers still
        have active connections stays, with its address on kube-ipvs0: IPVS keeps those connections'
        NAT in its own table, and a packet reaches it only while the address is local. New
        connections already meet the active mode's rules (its NAT comes first, in prerouting
        and output); a later cleanup removes the rest once the connections are gone."""
        removed: list[str] = []
        draining: list[str] = []
        link_kept = f"link {DUMMY_LINK}" in keep
        for fam, a, state in self._found(keep, connections=drain):
            busy = _busy(a.services, state) if drain else {}
            held = {k.address for k in busy}
            gone = [k for k in a.services if k not in busy]
            if gone:
                self.kernel.send(fam, [Op("del-service", fam, key=k) for k in gone])
            if a.restore:
                self.kernel.restore(fam, a.restore)
            drop = [x for x in a.addresses if x not in held]
            if (link_kept or held) and drop:
                self.kernel.send(fam, [Op("del-address", fam, address=x) for x in drop])
            if a.sets:
                self.kernel.send(fam, [Op("destroy-set", fam, ipset=s) for s in a.sets])
            stays = {f"ipvs virtual service {k}" for k in busy}
            stays |= {f"address {x} on {DUMMY_LINK}" for x in held}
            removed += [line for line in a.lines if line not in stays]
            draining += [
                f"ipvs virtual service {k} ({n} active connections)" for k, n in busy.items()
            ]
            draining += [f"address {x} on {DUMMY_LINK}" for x in sorted(held)]
        if draining:
            draining.append(f"link {DUMMY_LINK}")
            log.info("left %d virtual services of the ipvs mode draining", len(draining) - 1)
        elif not link_kept and self.kernel.delete_link():
            removed.append(f"link {DUMMY_LINK}")
            log.info("removed the %s link", DUMMY_LINK)
        self.renderers.clear()
        self._held.clear()
        self._terminating.clear()
        self._rules.clear()
        return CleanupReport(self.mode, tuple(removed), tuple(draining))

    def leftovers(self) -> list[str]:
        lines = [line for _, a, _ in self._found() for line in a.lines]
        fams = [self.kernel.dump(f) for f in self.ctx.families]
        if any(s.link for s in fams):
            lines.append(f"link {DUMMY_LINK}")
        return lines

    def inspect(self, service_port: ServicePortName) -> list[ProgrammedService] | None:
        out = []
        for fam in self.ctx.families:
            if fam not in self.renderers:
                continue
            contrib = _contribution(self.renderers[fam], service_port)
            if contrib is None:
                continue
            state = self.kernel.dump(fam)
            found = _programmed(service_port, fam, contrib, state)
            if found is not None:
                out.append(found)
        return out

    def describe(self) -> Sequence[str]:
        return [
            *super().describe(),
            f"IPVS over netlink (pyroute2), addresses on {DUMMY_LINK}, upstream's ipsets;"
            " deprecated upstream since Kubernetes 1.35 (nftables is the successor)",
        ]


# --- what the mode has on a node ------------------------------------------------------------


@dataclass(frozen=True)
class _Artifacts:
    services: tuple[VirtualKey, ...]
    addresses: tuple[str, ...]
    sets: tuple[plan.IpsetSpec, ...]
    #: The iptables-restore input removing the mode's chains and jumps ("" if none).
    restore: str
    lines: tuple[str, ...]


def _busy(services: Sequence[VirtualKey], state: FamilyState) -> dict[VirtualKey, int]:
    """The virtual services among ``services`` whose real servers have established
    connections, with their count (closed ones linger as inactive for minutes: not waited
    for)."""
    out = {}
    for key in services:
        n = sum(
            c.active
            for rk in state.real.get(key, {})
            if (c := state.connections.get((key, rk))) is not None
        )
        if n:
            out[key] = n
    return out


def _artifacts(
    fam: IPFamily,
    state: FamilyState,
    saved: SavedRuleset,
    node: frozenset[str],
    keep: Collection[str],
) -> _Artifacts:
    lines: list[str] = []
    services = []
    for key in sorted(state.virtual):
        ours = key.address in state.addresses or (key.address in node and key.port in NODE_PORTS)
        line = f"ipvs virtual service {key}"
        if ours and line not in keep:
            services.append(key)
            lines.append(line)
    addresses = tuple(sorted(state.addresses))
    lines += [f"address {a} on {DUMMY_LINK}" for a in addresses]
    chains = {"nat": frozenset(rules.NAT_CHAINS), "filter": frozenset(rules.FILTER_CHAINS)}
    found = find_chains(saved, fam, lambda table, c: c in chains[table], keep, chains)
    lines += describe_chains(fam, found)
    # Jumps between the mode's own chains (KUBE-NODE-PORT -> KUBE-MARK-MASQ) go with the
    # chains they are in; named too, in the words of a mode that shares the target chain.
    for a in found:
        lines += dict.fromkeys(
            jump_line(fam, a.table, r)
            for r in saved.rules.get(a.table, [])
            if r.split()[1] in a.chains and rule_target(r) in chains[a.table]
        )
    sets = tuple(
        state.ipsets[n]
        for n in sorted(state.ipsets)
        if ipsets.is_ours(n) and f"ipset {n}" not in keep
    )
    lines += [f"ipset {s.name}" for s in sets]
    return _Artifacts(tuple(services), addresses, sets, removal(found), tuple(lines))


def _contribution(renderer: DesiredRenderer, spn: ServicePortName) -> Any:
    getter = getattr(renderer, "contribution_of", None)
    if callable(getter):
        return getter(spn)
    return getattr(renderer, "_contrib", {}).get(spn)


def _programmed(
    spn: ServicePortName, fam: IPFamily, contrib: Any, state: FamilyState
) -> ProgrammedService | None:
    entries: list[str] = []
    endpoints: dict[str, EndpointView] = {}
    persistence: int | None = None
    forwards = False
    for vs in contrib.virtual:
        have = state.virtual.get(vs.key)
        if have is None:
            continue
        reals = state.real.get(vs.key, {})
        total = sum(max(r.weight, 0) for r in reals.values())
        # ipvsadm prints nothing for it, but IPVS answers a new connection it cannot schedule
        # with ICMP port unreachable (ip_vs_leave): say so in the words every reading knows.
        refused = "" if total else f"  {NO_REAL_SERVER}"
        entries.append(f"{have}{refused}")
        if have.persistence:
            persistence = have.persistence
        forwards = forwards or total > 0
        for rk in sorted(reals):
            w = reals[rk].weight
            share = max(w, 0) / total if total else 0.0
            endpoints.setdefault(str(rk), EndpointView(str(rk), share=share, weight=w))
    if not entries:
        return None
    objects = sorted(
        {f"ipset {name}" for name, _ in contrib.entries}
        | {f"address {a} on {DUMMY_LINK}" for a in contrib.addresses}
    )
    return ProgrammedService(
        service=str(spn),
        family=fam,
        entries=tuple(entries),
        endpoints=tuple(endpoints.values()),
        # KUBE-MARK-MASQ marks what IPVS forwards; nothing is forwarded without a real server.
        masquerade=forwards,
        affinity_seconds=persistence,
        objects=tuple(objects),
    )
