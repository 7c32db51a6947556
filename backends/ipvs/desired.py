"""From the graph to the desired IPVS state of one family, re-rendering only changed services.

``contribution`` is a pure function of one service port (its Service, categorized and raw
endpoints, and the family's settings): its virtual services with their real servers, the
addresses it binds to kube-ipvs0, its ipset entries and its KUBE-IPVS-OUT-FILTER rules. It
follows upstream's syncProxyRules (pkg/proxy/ipvs/proxier.go) service by service.

``DesiredRenderer`` keeps every service port's contribution and the aggregates built from
them: virtual services (a key two services claim goes to the first by name), refcounted
addresses and set entries (two services may bind the same IP or add the same hairpin
entry). A partial render removes the changed services' old contributions and adds their new
ones, so it costs what the change costs. The desired ``FamilyState`` it hands out is a
read-only *live view* of those aggregates (``MappingProxyType`` and ``SetView``): no copy is
made, so it is valid until the next render; ``snapshot()`` copies it for keeping.
"""

from __future__ import annotations

import ipaddress
from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from kubeplex.backends.ipvs import ipsets as S
from kubeplex.backends.ipvs.plan import FamilyState, RealKey, RealServer, VirtualKey, VirtualServer
from kubeplex.backends.ipvs.rules import out_filter_rule, restore_text
from kubeplex.backends.ipvs.settings import IpvsSettings
from kubeplex.core.dataplane.backend import NoLocalEndpoints
from kubeplex.core.model.errors import BackendError
from kubeplex.core.model.graph import ChangeSet, ServiceGraph
from kubeplex.core.model.topology import CategorizedEndpoints
from kubeplex.core.model.types import Endpoint, Protocol, ServicePort, ServicePortName

Reals = Mapping[RealKey, RealServer]


# --- one service port -----------------------------------------------------------------------


@dataclass(frozen=True)
class Contribution:
    """What one service port adds to the family's desired state."""

    virtual: tuple[VirtualServer, ...] = ()
    real: Mapping[VirtualKey, Reals] = field(default_factory=dict)
    #: Addresses bound to kube-ipvs0.
    addresses: frozenset[str] = frozenset()
    #: (set name, entry) pairs.
    entries: frozenset[tuple[str, str]] = frozenset()
    #: KUBE-IPVS-OUT-FILTER rules, in upstream's order.
    out_filter: tuple[str, ...] = ()
    #: A Local traffic policy found no local endpoint (the no-local-endpoints metric).
    no_local_internal: bool = False
    no_local_external: bool = False


#: Real servers by (ip, port): a full render makes one per endpoint, and most are the same
#: objects as the previous render's. Emptied when it grows past the limit.
_REALS: dict[tuple[str, int], RealServer] = {}
_REALS_LIMIT = 1 << 18


def _real_server(ip: str, port: int) -> RealServer:
    found = _REALS.get((ip, port))
    if found is None:
        if len(_REALS) >= _REALS_LIMIT:
            _REALS.clear()
        found = _REALS[(ip, port)] = RealServer(RealKey(ip, port))
    return found


def _halves(cidr: str) -> list[str]:
    """A source range as hash:ip,port,net entries: a /0 is refused by the kernel ("zero
    prefix size can NOT be stored"), so it is written as its two /1 halves (same match)."""
    net = ipaddress.ip_network(cidr)
    if net.prefixlen:
        return [str(net)]
    return [str(n) for n in net.subnets(prefixlen_diff=1)]


def contribution(
    svc: ServicePort, cat: CategorizedEndpoints, endpoints: Iterable[Endpoint], s: IpvsSettings
) -> Contribution:
    """One service port's part, as upstream's syncProxyRules builds it."""
    name = S.names(s.family)
    proto = svc.protocol.lower()
    port = svc.port
    entries: set[tuple[str, str]] = set()
    addresses: set[str] = set()
    virtual: dict[VirtualKey, VirtualServer] = {}
    real: dict[VirtualKey, Reals] = {}
    out_filter: list[str] = []
    no_local = {"internal": False, "external": False}
    persistence = svc.sticky_max_age_seconds if svc.session_affinity_client_ip else 0

    chosen: dict[bool, Reals] = {}

    def reals(only_local: bool) -> Reals:
        # syncEndpoint: a Local policy takes the local endpoints, and the cluster ones when
        # there are none (pod traffic still works; PR 97081).
        eps = cat.cluster
        if only_local:
            if cat.local:
                eps = cat.local
            elif cat.has_any:
                no_local["internal"] |= svc.internal_policy_local
                no_local["external"] |= svc.external_policy_local
        found = chosen.get(only_local)
        if found is None:  # every virtual service of one policy shares one mapping
            servers = (_real_server(ep.ip, ep.port) for ep in eps)
            found = chosen[only_local] = MappingProxyType({r.key: r for r in servers})
        return found

    def serve(ip: str, vport: int, only_local: bool, bind: bool) -> None:
        key = VirtualKey(svc.protocol, ip, vport)
        virtual[key] = VirtualServer(key, s.scheduler, persistence, s.flags)
        real[key] = reals(only_local)
        if bind:
            addresses.add(ip)
            entries.add((name[S.IPVS_IPS], ip))

    # Hairpin: a local endpoint reaching its own Service is masqueraded (KUBE-LOOP-BACK).
    for ep in endpoints:
        if ep.is_local:
            entries.add((name[S.LOOP_BACK], S.ip_port_ip(ep.ip, proto, ep.port, ep.ip)))

    # The cluster IP, always bound; the internal policy picks its real servers.
    entries.add((name[S.CLUSTER_IP], S.ip_port(svc.cluster_ip, proto, port)))
    serve(svc.cluster_ip, port, svc.internal_policy_local, True)

    # External IPs: bound unless the node has the address on another interface.
    for ip in svc.external_ips:
        base = S.EXTERNAL_IP_LOCAL if svc.external_policy_local else S.EXTERNAL_IP
        entries.add((name[base], S.ip_port(ip, proto, port)))
        serve(ip, port, svc.external_policy_local, ip not in s.local_addresses)

    # Load-balancer ingress IPs, with their source ranges.
    for ip in svc.load_balancer_vips:
        entry = S.ip_port(ip, proto, port)
        entries.add((name[S.LOAD_BALANCER], entry))
        if svc.external_policy_local:
            entries.add((name[S.LOAD_BALANCER_LOCAL], entry))
        if svc.load_balancer_source_ranges:
            entries.add((name[S.LOAD_BALANCER_FW], entry))
            allow_from_node = False
            for cidr in svc.load_balancer_source_ranges:
                for net in _halves(cidr):
                    entries.add(
                        (name[S.LOAD_BALANCER_SOURCE_CIDR], S.ip_port_net(ip, proto, port, net))
                    )
                if s.node_ip and ipaddress.ip_address(s.node_ip) in ipaddress.ip_network(cidr):
                    allow_from_node = True
            if allow_from_node:
                # The node's own request to its LB IP loops back with the LB IP as source.
                entries.add((name[S.LOAD_BALANCER_SOURCE_IP], S.ip_port_ip(ip, proto, port, ip)))
            else:
                out_filter.append(out_filter_rule(ip, proto, port))
        serve(ip, port, svc.external_policy_local, ip not in s.local_addresses)

    # NodePorts, one virtual service per node address; none at all (and no health check
    # entry, as upstream's `continue`) when the node has no NodePort address.
    if svc.node_port and not s.node_port_ips:
        return _done(virtual, real, addresses, entries, out_filter, no_local)
    if svc.node_port:
        if svc.protocol is Protocol.SCTP:
            np_entries = [S.ip_port(ip, proto, svc.node_port) for ip in s.node_port_ips]
            bases = (S.NODE_PORT_SCTP, S.NODE_PORT_LOCAL_SCTP)
        else:
            np_entries = [S.bitmap_port(svc.node_port)]
            if svc.protocol is Protocol.TCP:
                bases = (S.NODE_PORT_TCP, S.NODE_PORT_LOCAL_TCP)
            else:
                bases = (S.NODE_PORT_UDP, S.NODE_PORT_LOCAL_UDP)
        entries.update((name[bases[0]], e) for e in np_entries)
        if svc.external_policy_local:
            entries.update((name[bases[1]], e) for e in np_entries)
        for ip in s.node_port_ips:
            serve(ip, svc.node_port, svc.external_policy_local, False)

    if svc.health_check_node_port:
        entries.add((name[S.HEALTH_CHECK_NODE_PORT], S.bitmap_port(svc.health_check_node_port)))
    return _done(virtual, real, addresses, entries, out_filter, no_local)


def _done(
    virtual: dict[VirtualKey, VirtualServer],
    real: dict[VirtualKey, Reals],
    addresses: set[str],
    entries: set[tuple[str, str]],
    out_filter: list[str],
    no_local: dict[str, bool],
) -> Contribution:
    return Contribution(
        virtual=tuple(virtual.values()),
        real=MappingProxyType(real),
        addresses=frozenset(addresses),
        entries=frozenset(entries),
        out_filter=tuple(out_filter),
        no_local_internal=no_local["internal"],
        no_local_external=no_local["external"],
    )


# --- read-only views ------------------------------------------------------------------------


class SetView(AbstractSet[str]):
    """A read-only live view of a set (its operators return frozen copies)."""

    __slots__ = ("_s",)

    def __init__(self, backing: AbstractSet[str]) -> None:
        self._s = backing

    def __contains__(self, item: object) -> bool:
        return item in self._s

    def __iter__(self) -> Iterator[str]:
        return iter(self._s)

    def __len__(self) -> int:
        return len(self._s)

    def __repr__(self) -> str:
        return f"SetView({sorted(self._s)!r})"

    @classmethod
    def _from_iterable(cls, it: Iterable[Any]) -> frozenset[Any]:
        return frozenset(it)


# --- the renderer's output ------------------------------------------------------------------


@dataclass(frozen=True)
class DesiredUpdate:
    full: bool
    #: The whole desired state after this render (a live view: valid until the next render).
    state: FamilyState
    #: partial only: what the changed services touched (before or after), so the
    #: reconcile diffs just these: virtual keys, addresses, (set name, entry) pairs
    touched_virtual: frozenset[VirtualKey]
    touched_addresses: frozenset[str]
    touched_entries: frozenset[tuple[str, str]]
    #: The fixed rules text for the current state.
    iptables: str
    #: Whether ``iptables`` differs from the previous render's (False: nothing to restore,
    #: unless the kernel lost it).
    iptables_changed: bool = True
    #: Services that could not be rendered, with the reason (their previous part stays).
    errors: Mapping[str, str] = field(default_factory=dict)
    #: Services with a Local policy and no local endpoint (distinct Services), by kind.
    no_local_endpoints: NoLocalEndpoints = field(default_factory=NoLocalEndpoints)
    #: The service ports rendered (all of them on a full render).
    rendered: int = 0


# --- the renderer ---------------------------------------------------------------------------


class DesiredRenderer:
    """One family's desired state, kept across syncs (satisfies the contract's
    FamilyRenderer: ``settings``, ``force_full``, ``invalidate``)."""

    def __init__(self, settings: IpvsSettings) -> None:
        self.settings = settings
        #: Set when the cached contributions cannot be trusted: the next render is full.
        self.force_full = True
        self._contrib: dict[ServicePortName, Contribution] = {}
        # Aggregates (mutated in place: the views below read them).
        self._virtual: dict[VirtualKey, VirtualServer] = {}
        self._real: dict[VirtualKey, Reals] = {}
        self._owners: dict[VirtualKey, set[ServicePortName]] = {}
        self._addresses: set[str] = set()
        self._address_refs: dict[str, int] = {}
        self._entry_refs: dict[tuple[str, str], int] = {}
        self._out_order: list[ServicePortName] = []
        self._no_local: dict[str, dict[str, int]] = {"internal": {}, "external": {}}
        self._iptables = ""
        self._rules_key: tuple[frozenset[str], tuple[str, ...]] | None = None
        self._make_views()

    def _make_views(self) -> None:
        specs = S.specs(self.settings.family)
        self._entries: dict[str, set[str]] = {n: set() for n in specs}
        views = {n: SetView(v) for n, v in self._entries.items()}
        self._state = FamilyState(
            family=self.settings.family,
            virtual=MappingProxyType(self._virtual),
            real=MappingProxyType(self._real),
            addresses=SetView(self._addresses),
            link=True,
            ipsets=MappingProxyType(specs),
            entries=MappingProxyType(views),
        )
        self._bases = {S.set_name(b, self.settings.family): b for b in S.SETS}

    def invalidate(self) -> None:
        self.force_full = True

    def next_is_full(self, changes: ChangeSet) -> bool:
        return changes.full or self.force_full

    @property
    def state(self) -> FamilyState:
        """The desired state of the last render (a live view)."""
        return self._state

    def snapshot(self) -> FamilyState:
        """An independent copy of the desired state (costs the state's size)."""
        st = self._state
        return FamilyState(
            family=st.family,
            virtual=dict(self._virtual),
            real={k: dict(v) for k, v in self._real.items()},
            addresses=frozenset(self._addresses),
            link=True,
            ipsets=dict(st.ipsets),
            entries={n: frozenset(v) for n, v in self._entries.items()},
        )

    # --- rendering --------------------------------------------------------------------------

    def render(self, graph: ServiceGraph, changes: ChangeSet) -> DesiredUpdate:
        full = self.next_is_full(changes)
        self.force_full = False
        if graph.family is not self.settings.family:
            raise BackendError(
                f"{graph.family.value} graph given to the {self.settings.family.value} renderer"
            )
        errors: dict[str, str] = {}
        touched_v: set[VirtualKey] = set()
        touched_a: set[str] = set()
        touched_e: set[tuple[str, str]] = set()
        if full:
            if self._state.family is not self.settings.family:
                self._make_views()
            old_all = self._contrib
            self._contrib = {}
            self._clear()
            todo: Iterable[ServicePortName] = graph.services
        else:
            old_all = {}
            todo = changes.services
        count = 0
        for spn in todo:
            count += 1
            old = old_all.get(spn) if full else self._contrib.get(spn)
            svc = graph.services.get(spn)
            new: Contribution | None = None
            if svc is not None:
                try:
                    new = contribution(
                        svc, graph.categorized(spn), graph.endpoints_of(spn), self.settings
                    )
                except Exception as err:  # one Service's bug costs that Service only
                    why = (
                        str(err) if isinstance(err, BackendError) else f"rendering failed: {err!r}"
                    )
                    errors[str(spn)] = why
                    if full and old is not None:
                        self._add(spn, old)  # its last good part stays
                    continue
            if full:
                if new is not None:
                    self._add(spn, new)
                continue
            if old is not None:
                self._remove(spn, old)
                self._touch(old, touched_v, touched_a, touched_e)
            if new is not None:
                self._add(spn, new)
                self._touch(new, touched_v, touched_a, touched_e)
        text = self._rules_text()
        changed = text != self._iptables
        self._iptables = text
        return DesiredUpdate(
            full=full,
            state=self._state,
            touched_virtual=frozenset(touched_v),
            touched_addresses=frozenset(touched_a),
            touched_entries=frozenset(touched_e),
            iptables=text,
            iptables_changed=changed or full,
            errors=errors,
            no_local_endpoints=NoLocalEndpoints(
                len(self._no_local["internal"]), len(self._no_local["external"])
            ),
            rendered=count,
        )

    @staticmethod
    def _touch(
        c: Contribution,
        v: set[VirtualKey],
        a: set[str],
        e: set[tuple[str, str]],
    ) -> None:
        v.update(vs.key for vs in c.virtual)
        a.update(c.addresses)
        e.update(c.entries)

    def _clear(self) -> None:
        self._virtual.clear()
        self._real.clear()
        self._owners.clear()
        self._addresses.clear()
        self._address_refs.clear()
        self._entry_refs.clear()
        for entries in self._entries.values():
            entries.clear()
        self._out_order.clear()
        for counts in self._no_local.values():
            counts.clear()

    def _add(self, spn: ServicePortName, c: Contribution) -> None:
        self._contrib[spn] = c
        for vs in c.virtual:
            owners = self._owners.setdefault(vs.key, set())
            owners.add(spn)
            if min(owners) == spn:
                self._virtual[vs.key] = vs
                self._real[vs.key] = c.real[vs.key]
        for ip in c.addresses:
            n = self._address_refs.get(ip, 0)
            self._address_refs[ip] = n + 1
            if not n:
                self._addresses.add(ip)
        for pair in c.entries:
            n = self._entry_refs.get(pair, 0)
            self._entry_refs[pair] = n + 1
            if not n:
                self._entries[pair[0]].add(pair[1])
        if c.out_filter:
            insort(self._out_order, spn)
        self._count(spn, c, 1)

    def _remove(self, spn: ServicePortName, c: Contribution) -> None:
        del self._contrib[spn]
        for vs in c.virtual:
            owners = self._owners[vs.key]
            owners.discard(spn)
            if not owners:
                del self._owners[vs.key]
                del self._virtual[vs.key]
                del self._real[vs.key]
            else:
                first = min(owners)
                other = self._contrib[first]
                self._virtual[vs.key] = next(v for v in other.virtual if v.key == vs.key)
                self._real[vs.key] = other.real[vs.key]
        for ip in c.addresses:
            n = self._address_refs[ip] - 1
            if n:
                self._address_refs[ip] = n
            else:
                del self._address_refs[ip]
                self._addresses.discard(ip)
        for pair in c.entries:
            n = self._entry_refs[pair] - 1
            if n:
                self._entry_refs[pair] = n
            else:
                del self._entry_refs[pair]
                self._entries[pair[0]].discard(pair[1])
        if c.out_filter:
            del self._out_order[bisect_left(self._out_order, spn)]
        self._count(spn, c, -1)

    def _count(self, spn: ServicePortName, c: Contribution, delta: int) -> None:
        # Upstream counts Services (namespace/name), not ports.
        for kind, flag in (("internal", c.no_local_internal), ("external", c.no_local_external)):
            if not flag:
                continue
            counts = self._no_local[kind]
            n = counts.get(spn.namespaced_name, 0) + delta
            if n:
                counts[spn.namespaced_name] = n
            else:
                counts.pop(spn.namespaced_name, None)

    def _rules_text(self) -> str:
        nonempty = frozenset(self._bases[n] for n, v in self._entries.items() if v)
        out = [r for spn in self._out_order for r in self._contrib[spn].out_filter]
        key = (nonempty, tuple(out))
        if key == self._rules_key:
            return self._iptables
        self._rules_key = key
        return restore_text(self.settings, nonempty, out)
