"""Conntrack cleanup after a sync, over netlink (pyroute2), optionally in a network namespace.

A connectionless flow (UDP, SCTP) has no end the kernel can see, so its conntrack entry keeps
the NAT decision of its first packet for as long as packets keep coming: a client that sends
from a fixed port to a Service keeps reaching the endpoint it first got, even after that
endpoint left the Service, or keeps going nowhere if its first packet came before the
Service's rules. An entry is stale when it goes to a Service frontend (a Service IP and port,
or a NodePort on any address) and was not DNATed to a serving endpoint of that Service; the
others are established flows that must stay where they are (upstream #122740). After each
successful sync kubeplex deletes:

* on the **first sync** after a start, a takeover or a mode switch, and on a full sync whose
  UDP/SCTP Services or endpoints differ from the last sync the cleaner saw (a sync that failed
  took its change set along): every stale entry of every UDP/SCTP Service, as upstream 1.33's
  CleanStaleEntries does on each sync, plus the cluster IPs of service ports gone since. A
  Service without serving endpoints has all its entries stale (upstream #139628);
* on **any other sync**, only what the change set can have made stale:
  - for every **stale endpoint** (a serving UDP/SCTP endpoint that went away) of a Service
    that still exists: the entries to the Service's frontends DNATed to that endpoint;
  - for every **stale service IP** (the cluster IP of a deleted UDP/SCTP service port): the
    entries to that IP, except those to a port a live Service still serves on it;
  - for every **newly active** UDP/SCTP Service (no serving endpoint before, one now): its
    stale entries, i.e. those made while the traffic went nowhere. Entries already DNATed to
    a serving endpoint stay.

A sync without any of these (a periodic resync of an unchanged cluster, too) lists nothing.
``stale_flow_filters`` turns one sync's ``ProxyState`` into a ``CleanupPlan`` per family
(pure); a ``ConntrackCleaner`` is the ``SyncListener`` that lists the table once per family
and protocol and deletes the matching entries in batches (``ctnetlink``), as upstream 1.33's
reconciler dumps the table once per sync and deletes what its filters match. It never shells
out to ``conntrack``. In the daemon it runs off the sync loop, on a thread of its own: a
cleanup of tens of thousands of entries never holds a Service change behind it.

Refinements over upstream, all about not deleting live flows that are fine: an endpoint is
matched on its port as well as its IP (a pod that serves on a new port loses the flows to the
old one); a flow to a Service IP frontend is never judged by a NodePort filter (a ClusterIP
port may equal another Service's NodePort); and SCTP is cleaned like UDP, since an SCTP
association to an endpoint that left is as dead as a UDP flow to it.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from kubeplex.core.daemon.coalescing_worker import CoalescingWorker
from kubeplex.core.daemon.ctnetlink import Flow, NetlinkConntrack
from kubeplex.core.dataplane.backend import SyncResult
from kubeplex.core.model.graph import ChangeSet, ProxyState, ServiceGraph
from kubeplex.core.model.types import IPFamily, ServicePort, ServicePortName
from kubeplex.core.model.types import Protocol as L4

log = logging.getLogger(__name__)

IPPROTO: dict[L4, int] = {L4.TCP: socket.IPPROTO_TCP, L4.UDP: socket.IPPROTO_UDP, L4.SCTP: 132}
UDP = socket.IPPROTO_UDP
SCTP = 132
CONNECTIONLESS = (L4.UDP, L4.SCTP)


@dataclass(frozen=True, slots=True)
class FlowFilter:
    """Entries to delete: every field that is set must match (upstream's conntrackFilter).

    ``except_dports``: original destination ports that do not match (ports a live Service
    still serves on a stale IP).
    """

    proto: int
    orig_dst: str | None = None
    orig_dport: int | None = None
    reply_src: str | None = None
    reply_sport: int | None = None
    reason: str = ""
    except_dports: frozenset[int] = frozenset()

    def matches(self, flow: Flow) -> bool:
        return (
            flow.proto == self.proto
            and (self.orig_dst is None or flow.orig_dst == self.orig_dst)
            and (self.orig_dport is None or flow.orig_dport == self.orig_dport)
            and (self.reply_src is None or flow.reply_src == self.reply_src)
            and (self.reply_sport is None or flow.reply_sport == self.reply_sport)
            and flow.orig_dport not in self.except_dports
        )


@dataclass(frozen=True, slots=True)
class FrontendFilter:
    """Entries to one Service frontend that were not DNATed to one of its serving endpoints.

    ``orig_dst`` None is the NodePort ``orig_dport`` on any address. ``serving`` holds the
    (ip, port) of every serving endpoint: the reply of a DNATed flow comes from one of them,
    the reply of a flow that was never DNATed comes from the frontend itself.
    """

    proto: int
    orig_dst: str | None
    orig_dport: int
    serving: frozenset[tuple[str, int]]
    reason: str = ""

    def matches(self, flow: Flow) -> bool:
        return (
            flow.proto == self.proto
            and (self.orig_dst is None or flow.orig_dst == self.orig_dst)
            and flow.orig_dport == self.orig_dport
            and (flow.reply_src, flow.reply_sport) not in self.serving
        )


StaleFilter = FlowFilter | FrontendFilter
#: A Service IP frontend: (protocol number, IP, port).
Frontend = tuple[int, str, int]


@dataclass(frozen=True)
class CleanupPlan:
    """What to delete in one family: ``filters``, and the Service IP frontends that live now
    (a flow to one of them is never matched by a NodePort filter); ``graph`` is the one the
    plan was made from (None: plans of several syncs merged)."""

    filters: tuple[StaleFilter, ...]
    frontends: frozenset[Frontend] = frozenset()
    full: bool = False
    graph: ServiceGraph | None = None


def merge_plans(waiting: CleanupPlan, newer: CleanupPlan) -> CleanupPlan:
    """One plan for two syncs whose cleanups did not run yet: every filter of both. What the
    older one's filters name that is live again by then is kept by ``LiveFlows``."""
    return CleanupPlan(
        tuple(dict.fromkeys((*waiting.filters, *newer.filters))),
        waiting.frontends | newer.frontends,
        waiting.full or newer.full,
    )


def _service_ips(svc: ServicePort) -> tuple[str, ...]:
    return tuple(dict.fromkeys((svc.cluster_ip, *svc.external_ips, *svc.load_balancer_vips)))


def _frontends(graph: ServiceGraph) -> frozenset[Frontend]:
    return frozenset(
        (IPPROTO[svc.protocol], ip, svc.port)
        for svc in graph.services.values()
        if svc.protocol in CONNECTIONLESS
        for ip in _service_ips(svc)
    )


def _stale_endpoint_filters(graph: ServiceGraph, changes: ChangeSet) -> Iterator[FlowFilter]:
    for stale in changes.stale_endpoints:
        svc = graph.services.get(stale.service)
        if svc is None:
            continue  # the Service went too: its cluster IP is a stale service IP
        proto = IPPROTO[svc.protocol]
        ep = stale.endpoint
        why = f"{stale.service} lost endpoint {ep.address}"
        for ip in _service_ips(svc):
            yield FlowFilter(proto, ip, None, ep.ip, ep.port, why)
        if svc.node_port:
            yield FlowFilter(proto, None, svc.node_port, ep.ip, ep.port, why)


def connectionless_changed(old: ServiceGraph, new: ServiceGraph) -> bool:
    """True if a UDP/SCTP service port or its endpoints differ between two graphs."""
    for graph, other in ((old, new), (new, old)):
        for spn, svc in graph.services.items():
            if svc.protocol in CONNECTIONLESS and (
                other.services.get(spn) != svc or other.endpoints_of(spn) != graph.endpoints_of(spn)
            ):
                return True
    return False


def _gone_cluster_ips(old: ServiceGraph, new: ServiceGraph) -> set[str]:
    """Cluster IPs of UDP/SCTP service ports in ``old`` and not in ``new``."""
    return {
        svc.cluster_ip
        for spn, svc in old.services.items()
        if svc.protocol in CONNECTIONLESS and spn not in new.services
    }


def _stale_ip_filters(
    stale: Collection[str], frontends: frozenset[Frontend]
) -> Iterator[FlowFilter]:
    live: dict[tuple[int, str], set[int]] = {}
    for proto, ip, port in frontends:
        if ip in stale:  # the IP was reused, or other ports of the Service are still there
            live.setdefault((proto, ip), set()).add(port)
    for ip in sorted(stale):
        why = f"service IP {ip} deleted"
        for proto in (UDP, SCTP):
            kept = frozenset(live.get((proto, ip), ()))
            yield FlowFilter(proto, ip, reason=why, except_dports=kept)


def _serving(graph: ServiceGraph, spn: ServicePortName) -> frozenset[tuple[str, int]]:
    # Every serving endpoint, whatever the traffic policy or topology: a policy change must
    # not move established flows (upstream does not look at them either).
    return frozenset((ep.ip, ep.port) for ep in graph.endpoints_of(spn) if ep.serving)


def _frontend_filters(
    graph: ServiceGraph, spn: ServicePortName, why: str
) -> Iterator[FrontendFilter]:
    svc = graph.services.get(spn)
    if svc is None or svc.protocol not in CONNECTIONLESS:
        return
    proto = IPPROTO[svc.protocol]
    serving = _serving(graph, spn)
    for ip in _service_ips(svc):
        yield FrontendFilter(proto, ip, svc.port, serving, why)
    if svc.node_port:
        yield FrontendFilter(proto, None, svc.node_port, serving, why)


def stale_flow_filters(
    state: ProxyState,
    reconcile: Collection[IPFamily] | None = None,
    previous: Mapping[IPFamily, ServiceGraph] | None = None,
) -> dict[IPFamily, CleanupPlan]:
    """What one sync makes stale, per IP family (families with nothing to do are left out).

    The families in ``reconcile`` (default: those whose sync is full) get the full
    reconciliation; ``previous`` holds the graphs the last cleanup saw, whose service ports
    that are gone now make their cluster IPs stale too.
    """
    out: dict[IPFamily, CleanupPlan] = {}
    for family, changes in state.changes.items():
        graph = state.graphs.get(family)
        if graph is None:
            continue
        full = changes.full if reconcile is None else family in reconcile
        if not (
            full
            or changes.stale_endpoints
            or changes.stale_service_ips
            or changes.newly_active_services
        ):
            continue  # nothing can have become stale: do not even look at the services
        stale_ips = set(changes.stale_service_ips)
        before = (previous or {}).get(family)
        if full and before is not None:
            stale_ips |= _gone_cluster_ips(before, graph)
        frontends = _frontends(graph)
        filters: list[StaleFilter] = [*_stale_endpoint_filters(graph, changes)]
        filters.extend(_stale_ip_filters(stale_ips, frontends))
        if full:
            for spn in sorted(graph.services):
                filters.extend(_frontend_filters(graph, spn, f"{spn} reconciled"))
        else:
            for spn in sorted(changes.newly_active_services):
                filters.extend(_frontend_filters(graph, spn, f"{spn} has endpoints again"))
        if filters:
            # The same filter from two causes: once.
            out[family] = CleanupPlan(tuple(dict.fromkeys(filters)), frontends, full, graph)
    return out


# ---------------------------------------------------------------------------------- the table


class ConntrackTable(Protocol):
    """One IP family's conntrack table (ctnetlink, or a fake in tests)."""

    def flows(self, proto: int) -> Iterable[Flow]: ...

    def delete(self, flows: Sequence[Flow]) -> int:
        """Delete entries; how many were deleted (those gone already are not counted)."""
        ...

    def close(self) -> None: ...


#: Opens the conntrack table of one family.
TableFactory = Callable[[IPFamily], ConntrackTable]


class LiveFlows:
    """The flows a graph serves: to a Service IP frontend or a NodePort, DNATed to one of
    that service port's serving endpoints. A cleanup that runs behind the syncs keeps them
    whatever its (older) plan says: an endpoint may have come back since."""

    def __init__(self, graph: ServiceGraph) -> None:
        self.frontends: dict[Frontend, frozenset[tuple[str, int]]] = {}
        self.node_ports: dict[tuple[int, int], frozenset[tuple[str, int]]] = {}
        for spn, svc in graph.services.items():
            if svc.protocol not in CONNECTIONLESS:
                continue
            proto = IPPROTO[svc.protocol]
            serving = _serving(graph, spn)
            for ip in _service_ips(svc):
                self.frontends[(proto, ip, svc.port)] = serving
            if svc.node_port:
                self.node_ports[(proto, svc.node_port)] = serving

    def serves(self, flow: Flow) -> bool:
        if flow.orig_dport is None or flow.reply_sport is None:
            return False
        serving = self.frontends.get((flow.proto, flow.orig_dst, flow.orig_dport))
        if serving is None:  # not to a Service IP: to a NodePort on some address?
            serving = self.node_ports.get((flow.proto, flow.orig_dport))
        return serving is not None and (flow.reply_src, flow.reply_sport) in serving


class _FilterIndex:
    """The filters of one protocol, found by what a flow's original tuple holds, so a table
    of N entries against F filters costs about N look-ups rather than N * F matches."""

    def __init__(self, filters: Iterable[StaleFilter], frontends: Collection[Frontend]) -> None:
        self.by_frontend: dict[tuple[str, int], list[StaleFilter]] = {}
        self.by_dst: dict[str, list[StaleFilter]] = {}
        self.by_dport: dict[int, list[StaleFilter]] = {}
        self.other: list[StaleFilter] = []
        self.frontends = {(ip, port) for _, ip, port in frontends}
        for f in filters:
            if f.orig_dst is not None and f.orig_dport is not None:
                self.by_frontend.setdefault((f.orig_dst, f.orig_dport), []).append(f)
            elif f.orig_dst is not None:
                self.by_dst.setdefault(f.orig_dst, []).append(f)
            elif f.orig_dport is not None:
                self.by_dport.setdefault(f.orig_dport, []).append(f)
            else:
                self.other.append(f)

    def first_match(self, flow: Flow) -> StaleFilter | None:
        dst, dport = flow.orig_dst, flow.orig_dport
        groups: list[list[StaleFilter]] = []
        if dport is not None:
            groups.append(self.by_frontend.get((dst, dport), []))
        groups.append(self.by_dst.get(dst, []))
        if dport is not None and (dst, dport) not in self.frontends:
            # A NodePort filter never judges a flow to a live Service IP frontend.
            groups.append(self.by_dport.get(dport, []))
        groups.append(self.other)
        for group in groups:
            for f in group:
                if f.matches(flow):
                    return f
        return None


def clear_flows(
    table: ConntrackTable,
    filters: Iterable[StaleFilter],
    frontends: Collection[Frontend] = (),
    live: Callable[[], LiveFlows | None] = lambda: None,
) -> int:
    """Delete every entry that matches a filter; returns how many were deleted.

    The table is listed once per protocol the filters name, and what matches is deleted in
    one go; ``frontends`` are the live Service IP frontends (see ``CleanupPlan``). ``live``,
    asked after each listing, gives the flows to keep whatever the filters say.
    """
    by_proto: dict[int, list[StaleFilter]] = {}
    for f in filters:
        by_proto.setdefault(f.proto, []).append(f)
    deleted = 0
    debug = log.isEnabledFor(logging.DEBUG)
    for proto, group in sorted(by_proto.items()):
        index = _FilterIndex(group, [fe for fe in frontends if fe[0] == proto])
        listed = table.flows(proto)
        keep = live()
        stale = []
        for flow in listed:
            hit = index.first_match(flow)
            if hit is None or (keep is not None and keep.serves(flow)):
                continue
            stale.append(flow)
            if debug:
                log.debug("deleting conntrack entry %s (%s)", flow, hit.reason)
        if stale:
            deleted += table.delete(stale)
    return deleted


#: Told after each family's cleanup: (family, seconds it took, entries deleted).
CleanupHook = Callable[[IPFamily, float, int], None]


class ConntrackCleaner:
    """The SyncListener that clears stale UDP/SCTP conntrack entries after every sync.

    It keeps the graphs of the last sync it saw. Its first call reconciles every family fully,
    and so does the call after a family's cleanup failed, and a full sync whose UDP/SCTP
    Services or endpoints differ from those graphs (the syncs in between failed, and their
    change sets are gone). ``enabled`` can be switched off (tests show what happens without
    it). Errors are logged, never raised: a sync whose rules are in place has succeeded
    whatever conntrack says.

    With ``background`` the cleanups run on a thread of their own, one family after the
    other, so the next sync never waits for one; a family's plan made while its last one
    still waits is merged into it (``merge_plans``), and flows the newest graph serves are
    kept (``LiveFlows``). ``wait_idle`` waits for them, ``close`` ends the thread.
    """

    def __init__(
        self,
        netns: str | None = None,
        *,
        table_factory: TableFactory | None = None,
        on_cleaned: CleanupHook | None = None,
        enabled: bool = True,
        background: bool = False,
    ) -> None:
        self.netns = netns
        self.enabled = enabled
        self._factory: TableFactory = table_factory or (lambda fam: NetlinkConntrack(fam, netns))
        self._on_cleaned = on_cleaned
        #: The graphs of the last sync planned for (a family whose cleanup failed is left
        #: out: it is reconciled next time), and of the last sync seen; shared with the worker.
        self._seen: dict[IPFamily, ServiceGraph] = {}
        self._latest: dict[IPFamily, ServiceGraph] = {}
        self._lock = threading.Lock()
        self._worker: CoalescingWorker[IPFamily, CleanupPlan] | None = None
        if background:
            self._worker = CoalescingWorker(self._run, merge_plans, name="kubeplex-conntrack")
        #: Entries deleted so far, per family (for logs and tests).
        self.deleted: dict[IPFamily, int] = {}
        self.errors = 0

    def __call__(self, state: ProxyState, result: SyncResult, elapsed: float) -> None:
        if not self.enabled:
            return
        with self._lock:
            reconcile = set()
            for family, graph in state.graphs.items():
                seen = self._seen.get(family)
                changes = state.changes.get(family)
                full = changes is not None and changes.full
                if seen is None or (full and connectionless_changed(seen, graph)):
                    reconcile.add(family)
            plans = stale_flow_filters(state, reconcile, self._seen)
            self._seen.update(state.graphs)
            self._latest.update(state.graphs)
        for family, plan in plans.items():
            if self._worker is None:
                self._run(family, plan)
            else:
                self._worker.submit(family, plan)

    @property
    def background(self) -> bool:
        """True if the cleanups run on the cleaner's own thread."""
        return self._worker is not None

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait for the cleanups queued so far; False if ``timeout`` passed first."""
        return self._worker is None or self._worker.wait_idle(timeout)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()

    def _run(self, family: IPFamily, plan: CleanupPlan) -> None:
        if self.clean(family, plan) is None:
            with self._lock:
                self._seen.pop(family, None)

    def _live(self, family: IPFamily, plan: CleanupPlan) -> LiveFlows | None:
        """What to keep: the flows the newest graph serves, if the plan was made from another."""
        with self._lock:
            latest = self._latest.get(family)
        return None if latest is None or latest is plan.graph else LiveFlows(latest)

    def clean(self, family: IPFamily, plan: CleanupPlan) -> int | None:
        """Apply one family's plan; the entries deleted, None if the cleanup failed."""
        start = time.monotonic()
        deleted: int | None = 0
        try:
            table = self._factory(family)
            try:
                deleted = clear_flows(
                    table, plan.filters, plan.frontends, lambda: self._live(family, plan)
                )
            finally:
                table.close()
        except Exception as err:
            self.errors += 1
            deleted = None
            log.error("conntrack cleanup (%s) failed: %s", family.value, err)
        took = time.monotonic() - start
        self.deleted[family] = self.deleted.get(family, 0) + (deleted or 0)
        log.info(
            "conntrack cleanup (%s, %s): %d filters, %d entries deleted in %.1f ms",
            family.value,
            "full" if plan.full else "partial",
            len(plan.filters),
            deleted or 0,
            took * 1000,
        )
        if self._on_cleaned is not None:
            try:
                self._on_cleaned(family, took, deleted or 0)
            except Exception:
                log.exception("conntrack cleanup hook failed")
        return deleted
