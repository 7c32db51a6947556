"""The ebpf mode's entry points for traffic from other hosts: the kernel's NAT, in nftables
tables of the mode's own (``ip kubeplex-ebpf``, ``ip6 kubeplex-ebpf``).

The socket programs translate what processes of the node's cgroup connect to; a packet that
arrives from the lan for a NodePort on a node address, an externalIP or a LoadBalancer IP was
translated by no socket. These tables DNAT it at prerouting: one lookup of the destination in
a verdict map (an externalIP or LoadBalancer IP with its port and protocol), or of the port
and protocol in another one where the destination is a NodePort address, so the cost does not
grow with the number of Services; the verdict is the Service port's chain, which picks an
endpoint with ``numgen`` (``dnat_rules``) and DNATs to it. Packets that start on the node
never reach prerouting, and those of the node's pods were translated at their socket:
conntrack holds NAT entries for the external flows only.

Per Service port and family, as upstream's external destinations:

* externalTrafficPolicy Cluster: every endpoint the graph chooses for the cluster, and the
  source masqueraded (the masquerade mark, taken off and acted on at postrouting);
* Local: the node's local endpoints, the client's address kept; none here: dropped;
* no endpoint anywhere: rejected, as the socket programs refuse the connection (at the input
  and forward hooks, through maps of their own, as upstream's nftables mode rejects in its
  filter chains: the nat hook sees only a flow's first packet, and only while conntrack runs);
* loadBalancerSourceRanges: a source outside them is dropped at the LoadBalancer IPs (only
  here: the socket programs let the node's own connections in, so the mode does not declare
  the capability).

The first sync after a start or a failure replaces the tables in one transaction (created,
deleted, written again), which reconciles whatever they held; later syncs, full ones too, send
only the changed chains, sets and elements, in one transaction too, so the affinity sets keep
their clients (a full sync writes a table whole again only if it is gone). A family without
any such entry point has no table.

ClientIP session affinity, as upstream's nftables mode: one set per endpoint
(``affinity-HASH-ns/name/proto/port__ip/port``, ``flags dynamic,timeout`` with the Service's
timeout) holds the clients it served; the chain first sends a client found in a set to that
endpoint (refreshing its entry), else picks one and adds the client to its set. A full sync
writes the sets empty again (conntrack keeps the flows already open).
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kubeplex.backends.ebpf.plan import EbpfPlan, MapSeam
from kubeplex.backends.ebpf.render import RenderSettings
from kubeplex.backends.netfilter.hashing import cached_base
from kubeplex.backends.netfilter.marks import masquerade_mark
from kubeplex.core.model.errors import BackendError
from kubeplex.core.model.graph import ProxyState, ServiceGraph
from kubeplex.core.model.types import Endpoint, IPFamily, ServicePort, family_of
from kubeplex.core.model.types import Protocol as L4

TABLE = "kubeplex-ebpf"
#: The nftables family of each IP family's table.
FAMILIES = {IPFamily.IPv4: "ip", IPFamily.IPv6: "ip6"}
#: Upstream's default masquerade bit.
MASQUERADE = masquerade_mark(14)
_PROTOCOLS = {L4.TCP: "tcp", L4.UDP: "udp"}
_ADDR_TYPES = {IPFamily.IPv4: "ipv4_addr", IPFamily.IPv6: "ipv6_addr"}
#: The verdict maps: the entry points DNATed at prerouting, and those of Service ports without
#: any endpoint, rejected at the input and forward hooks.
REFUSED_MAPS = ("refused-entry-points", "refused-nodeports")
MAPS = ("entry-points", "nodeports", *REFUSED_MAPS)
#: The refused entry points' verdict.
REFUSE = "goto no-endpoints"


#: A chain: its name and its rules.
Chain = tuple[str, tuple[str, ...]]


@dataclass(frozen=True)
class Entry:
    """What one Service port of one family adds to its family's table."""

    #: Its externalIP and LoadBalancer IP keys ("ADDR . PROTO . PORT") with their verdicts.
    addresses: tuple[tuple[str, str], ...]
    #: Its NodePort key ("PROTO . PORT") with its verdict, if it has one.
    nodeport: tuple[str, str] | None
    #: Its chains.
    chains: tuple[Chain, ...]
    #: Its affinity sets' names with their timeouts (seconds), used by its ``external-`` chain.
    sets: tuple[tuple[str, int], ...] = ()
    #: No endpoint anywhere: its keys go to the filter hooks' maps, which reject (as
    #: upstream's nftables mode does, not in the nat chain).
    refused: bool = False


def source_ranges(ranges: Iterable[str], family: IPFamily) -> list[str]:
    """``family``'s ranges, merged: an nft set refuses intervals that overlap."""
    if family is IPFamily.IPv4:
        v4 = [n for n in map(_network, ranges) if isinstance(n, ipaddress.IPv4Network)]
        return [str(n) for n in ipaddress.collapse_addresses(v4)]
    v6 = [n for n in map(_network, ranges) if isinstance(n, ipaddress.IPv6Network)]
    return [str(n) for n in ipaddress.collapse_addresses(v6)]


def _network(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    return ipaddress.ip_network(text, strict=False)


def dnat_rules(
    proto: str, endpoints: Iterable[Endpoint], addr: str = "", sets: Sequence[str] = ()
) -> list[str]:
    """One rule per endpoint, each taking 1/k of what the ones before left (k: the endpoints
    left), as iptables' statistic rules: an even spread without an anonymous map per Service,
    whose naming costs the kernel a scan of the table's sets (O(N^2) to load N Services).

    With ``sets`` (the endpoints' affinity sets, in their order; ``addr``: ``ip`` or ``ip6``):
    a source found in an endpoint's set goes there, before any pick; a pick adds the source
    to the chosen endpoint's set (``update`` also refreshes its timeout)."""
    targets = [ep.address for ep in endpoints]
    left = len(targets)
    rules = []
    updates = [""] * left
    if sets:
        updates = [f"update @{name} {{ {addr} saddr }} " for name in sets]
        rules += [
            f"{addr} saddr @{name} meta l4proto {proto} {update}dnat to {target}"
            for name, update, target in zip(sets, updates, targets, strict=True)
        ]
    for i, target in enumerate(targets):
        pick = f"numgen random mod {left - i} 0 " if i < left - 1 else ""
        rules.append(f"meta l4proto {proto} {pick}{updates[i]}dnat to {target}")
    return rules


def affinity_set(port_text: str, ep: Endpoint) -> str:
    """Upstream's affinity set name: ``affinity-`` and the endpoint chain's hashed base (an
    IPv6 address with dots for colons), at most 249 characters (nft allows 255)."""
    ip = ep.ip.replace(":", ".")
    return "affinity-" + cached_base(f"{port_text}__{ip}/{ep.port}")


def entry(graph: ServiceGraph, svc: ServicePort) -> Entry | None:
    """``svc``'s part of the table, or None if it has no external entry point here."""
    proto = _PROTOCOLS.get(svc.protocol)
    if proto is None or not (svc.node_port or svc.external_ips or svc.load_balancer_vips):
        return None
    family, addr = graph.family, "ip" if graph.family is IPFamily.IPv4 else "ip6"
    # Named as the nftables mode names a Service port's chains: ns/name/proto/port.
    spn = svc.name
    port_text = f"{spn.namespace}/{spn.name}/{proto}/{spn.port}"
    base = cached_base(port_text)
    external = f"external-{base}"
    chosen = graph.categorized(svc.name)
    endpoints = chosen.local if svc.external_policy_local else chosen.cluster
    rules: list[str]
    sets: tuple[tuple[str, int], ...] = ()
    if not chosen.has_any:
        keys = [
            f"{ip} . {proto} . {svc.port}" for ip in (*svc.external_ips, *svc.load_balancer_vips)
        ]
        port = (f"{proto} . {svc.node_port}", REFUSE) if svc.node_port else None
        return Entry(tuple((key, REFUSE) for key in keys), port, (), refused=True)
    if not endpoints:
        rules = ["drop"]
    else:
        rules = [] if svc.external_policy_local else [f"meta mark set meta mark | {MASQUERADE}"]
        names: tuple[str, ...] = ()
        if svc.session_affinity_client_ip:
            names = tuple(affinity_set(port_text, ep) for ep in endpoints)
            sets = tuple((name, svc.sticky_max_age_seconds) for name in dict.fromkeys(names))
        rules += dnat_rules(proto, endpoints, addr, names)
    chains: list[Chain] = [(external, tuple(rules))]
    verdict = f"goto {external}"
    lb_verdict = verdict
    ranges = source_ranges(svc.load_balancer_source_ranges, family)
    if svc.load_balancer_vips and ranges:
        firewall = f"firewall-{base}"
        allowed = ", ".join(ranges)
        chains.append((firewall, (f"{addr} saddr != {{ {allowed} }} drop", verdict)))
        lb_verdict = f"goto {firewall}"
    addresses = [(f"{ip} . {proto} . {svc.port}", verdict) for ip in svc.external_ips]
    lb = [(f"{ip} . {proto} . {svc.port}", lb_verdict) for ip in svc.load_balancer_vips]
    nodeport = (f"{proto} . {svc.node_port}", verdict) if svc.node_port else None
    return Entry(tuple(addresses + lb), nodeport, tuple(chains), sets=sets)


@dataclass(frozen=True)
class Tables:
    """What one family's table holds of the Service ports (besides its fixed chains)."""

    nodeport_ips: tuple[str, ...]
    #: Each verdict map's elements: key to verdict.
    maps: dict[str, dict[str, str]]
    #: The Service ports' chains: name to rules.
    chains: dict[str, tuple[str, ...]]
    #: The affinity sets: name to timeout (seconds) and the chain whose rules use the set.
    sets: dict[str, tuple[int, str]] = dataclasses.field(default_factory=dict)

    @property
    def empty(self) -> bool:
        """No entry point at all (a Service port without endpoints has no chain)."""
        return not self.chains and not any(self.maps.values())

    @classmethod
    def of(cls, entries: Iterable[Entry], nodeport_ips: tuple[str, ...]) -> Tables:
        """On a key two Service ports want, the one given first keeps it."""
        maps: dict[str, dict[str, str]] = {name: {} for name in MAPS}
        chains: dict[str, tuple[str, ...]] = {}
        sets: dict[str, tuple[int, str]] = {}
        for e in entries:
            points, nodeports = (
                ("refused-entry-points", "refused-nodeports")
                if e.refused
                else ("entry-points", "nodeports")
            )
            for key, verdict in e.addresses:
                maps[points].setdefault(key, verdict)
            if e.nodeport:
                maps[nodeports].setdefault(*e.nodeport)
            chains.update(e.chains)
            if e.sets:
                users = e.chains[0][0]  # the external- chain
                sets.update((name, (timeout, users)) for name, timeout in e.sets)
        return cls(nodeport_ips, maps, chains, sets)


def _chain(name: str, rules: Iterable[str]) -> str:
    return f"  chain {name} {{\n" + "".join(f"    {rule}\n" for rule in rules) + "  }\n"


def set_spec(addr_type: str, timeout: int) -> str:
    """An affinity set's declaration (upstream's: ``dynamic``, so that nft does not add it
    itself and then see a change of flags)."""
    return f"type {addr_type}; flags dynamic,timeout; timeout {timeout}s;"


def _elements(taken: dict[str, str]) -> str:
    if not taken:
        return ""
    listed = "".join(f"      {k} : {v},\n" for k, v in taken.items())
    return "    elements = {\n" + listed + "    }\n"


def absent(family: IPFamily) -> str:
    """The transaction that leaves no table of the mode (whether there was one or not)."""
    kind = FAMILIES[family]
    return f"add table {kind} {TABLE}\ndelete table {kind} {TABLE}\n"


def table(family: IPFamily, tables: Tables) -> str:
    """One family's table, as ``nft -f`` reads it, replacing whatever it held."""
    kind, addr_type = FAMILIES[family], _ADDR_TYPES[family]
    addr = "ip" if family is IPFamily.IPv4 else "ip6"
    ips = tables.nodeport_ips
    out = [absent(family), f"table {kind} {TABLE} {{\n"]
    out.append(f"  set nodeport-ips {{\n    type {addr_type}\n")
    out.append(f"    elements = {{ {', '.join(ips)} }}\n  }}\n" if ips else "  }\n")
    for points, nodeports in (("entry-points", "nodeports"), REFUSED_MAPS):
        out.append(
            f"  map {points} {{\n    type {addr_type} . inet_proto . inet_service : verdict\n"
        )
        out.append(_elements(tables.maps[points]) + "  }\n")
        out.append(f"  map {nodeports} {{\n    type inet_proto . inet_service : verdict\n")
        out.append(_elements(tables.maps[nodeports]) + "  }\n")

    def lookups(points: str, nodeports: str) -> list[str]:
        return [
            f"{addr} daddr . meta l4proto . th dport vmap @{points}",
            f"{addr} daddr @nodeport-ips meta l4proto . th dport vmap @{nodeports}",
        ]

    prerouting = ["type nat hook prerouting priority dstnat; policy accept;"]
    out.append(_chain("prerouting", prerouting + lookups("entry-points", "nodeports")))
    # Not DNATed (no endpoint anywhere), the packet reaches the node or is forwarded.
    for hook in ("input", "forward"):
        base = f"type filter hook {hook} priority filter - 1; policy accept;"
        out.append(_chain(f"filter-{hook}", [base, *lookups(*REFUSED_MAPS)]))
    out.append(_chain(REFUSE.split()[1], ["reject"]))
    postrouting = [
        "type nat hook postrouting priority srcnat; policy accept;",
        f"meta mark & {MASQUERADE} == 0 return",
        f"meta mark set meta mark ^ {MASQUERADE}",
        "masquerade fully-random",
    ]
    out.append(_chain("postrouting", postrouting))
    for name, (timeout, _) in tables.sets.items():
        out.append(f"  set {name} {{ {set_spec(addr_type, timeout)} }}\n")
    out += [_chain(name, rules) for name, rules in tables.chains.items()]
    out.append("}\n")
    return "".join(out)


def changes(family: IPFamily, held: Tables, wanted: Tables) -> str:
    """The commands that turn ``held`` into ``wanted`` (the same node port addresses): new
    sets, new and changed chains, then the elements, then the chains no element points to any
    more (a Service port's firewall chain before the chain it jumps to), then the sets no rule
    uses any more. A set whose timeout changed is made again, between the flush of the chain
    that uses it and its rules (a set in use cannot be deleted)."""
    where = f"{FAMILIES[family]} {TABLE}"
    addr_type = _ADDR_TYPES[family]
    out = []
    retimed: dict[str, list[str]] = {}
    for name, (timeout, users) in wanted.sets.items():
        spec = f"add set {where} {name} {{ {set_spec(addr_type, timeout)} }}\n"
        held_set = held.sets.get(name)
        if held_set is None:
            out.append(spec)
        elif held_set[0] != timeout:
            retimed.setdefault(users, []).append(f"delete set {where} {name}\n{spec}")
    for name, rules in wanted.chains.items():
        if held.chains.get(name) == rules and name not in retimed:
            continue
        out.append(f"add chain {where} {name}\n" if name not in held.chains else "")
        out.append(f"flush chain {where} {name}\n" if name in held.chains else "")
        out += retimed.get(name, [])
        out += [f"add rule {where} {name} {rule}\n" for rule in rules]
    for kind, want in wanted.maps.items():
        have = held.maps[kind]
        gone = [k for k, v in have.items() if want.get(k) != v]
        new = [f"{k} : {v}" for k, v in want.items() if have.get(k) != v]
        if gone:
            out.append(f"delete element {where} {kind} {{ {', '.join(gone)} }}\n")
        if new:
            out.append(f"add element {where} {kind} {{ {', '.join(new)} }}\n")
    dropped = [name for name in held.chains if name not in wanted.chains]
    for name in sorted(dropped, key=lambda n: not n.startswith("firewall-")):
        out.append(f"delete chain {where} {name}\n")
    out += [f"delete set {where} {name}\n" for name in held.sets if name not in wanted.sets]
    return "".join(out)


class EntryNatRenderer:
    """The transaction for a ``ProxyState``: at a full render, the whole tables (which
    reconciles them, whatever they held); at a partial one, the changes against what the last
    committed transaction left. Each Service port's part is kept, and a partial render
    recomputes only the changed ones."""

    def __init__(self) -> None:
        self._entries: dict[IPFamily, dict[str, Entry]] = {}
        #: What the tables hold after the last committed transaction (None: not known).
        self.held: dict[IPFamily, Tables] | None = None
        #: What they hold once the last rendered transaction is committed.
        self.pending: dict[IPFamily, Tables] = {}
        #: The node holds NATed flows (a netfilter mode's before a switch to this one, or of
        #: an entry point gone): the kernel applies their NAT only while a nat chain with a
        #: NAT rule is there, so a table stays, even without entry points, until a full
        #: sync finds none left.
        self.nat_flows = False
        #: The families whose table the last committed transaction left, and those of them
        #: a full sync's observation found gone (deleted by someone else): rewritten.
        self.present: set[IPFamily] = set()
        self.pending_present: set[IPFamily] = set()
        self.gone: set[IPFamily] = set()

    def invalidate(self) -> None:
        self.held = None

    def committed(self) -> None:
        self.held = self.pending
        self.present = self.pending_present
        self.gone = set()

    def observed(self, tables: Iterable[tuple[str, str]]) -> None:
        """A full sync's look at the node's tables (family, name): those the renderer left
        that are not there any more are written whole again."""
        there = set(tables)
        self.gone = {f for f in self.present if (FAMILIES[f], TABLE) not in there}

    def render(self, state: ProxyState, nodeport_addresses: Iterable[str], full: bool) -> str:
        """The transaction (empty: nothing to change)."""
        full = full or self.held is None
        for family, graph in state.graphs.items():
            if full:
                self._entries[family] = {}
            kept = self._entries.setdefault(family, {})
            for spn in graph.services if full else state.changes[family].services:
                svc = graph.services.get(spn)
                found = entry(graph, svc) if svc is not None else None
                if found is None:
                    kept.pop(str(spn), None)
                else:
                    kept[str(spn)] = found
        addresses = tuple(nodeport_addresses)
        out = []
        self.pending = {}
        self.pending_present = set()
        for family in sorted(state.graphs, key=lambda f: FAMILIES[f]):
            kept = self._entries.get(family, {})
            ips = tuple(ip for ip in addresses if family_of(ip) is family)
            wanted = Tables.of((kept[name] for name in sorted(kept)), ips)
            self.pending[family] = wanted
            # A full sync does not rewrite a table it knows (only one that went, and after a
            # start or a failure): deleting it would empty the affinity sets, which live
            # only in the kernel. It sends what differs from what it holds instead.
            known = self.held is not None and family not in self.gone
            held = self.held.get(family) if self.held is not None and known else None
            there = known and family in self.present
            if wanted.empty and not self.nat_flows:
                # Nothing to hold: no table, so no NAT hook (and no conntrack) on the node.
                if not known or there:
                    out.append(absent(family))
                continue
            self.pending_present.add(family)
            if not there or held is None or held.nodeport_ips != ips:
                out.append(table(family, wanted))
            elif held.empty and not wanted.empty:
                out.append(table(family, wanted))  # (none was there, or one kept empty)
            elif not (held.empty and wanted.empty):
                out.append(changes(family, held, wanted))
        return "".join(out)


# --- what the backend calls ---------------------------------------------------------------


def joined(
    plan: EbpfPlan, renderer: EntryNatRenderer, state: ProxyState, settings: RenderSettings
) -> EbpfPlan:
    """``plan`` with the tables' transaction, if there is one to send: the whole tables at a
    full sync (which reconciles them) and after a failure, else the changes."""
    full = plan.full or state.is_full()
    text = renderer.render(state, settings.nodeport_addresses, full)
    return dataclasses.replace(plan, entry_nat=text) if text else plan


def send(plan: EbpfPlan, renderer: EntryNatRenderer, seam: MapSeam) -> None:
    """Commit the plan's transaction (BackendError if refused: the next render is whole)."""
    if not plan.entry_nat:
        return
    renderer.invalidate()
    seam.transact(plan.entry_nat)
    renderer.committed()


def _present(seam: MapSeam) -> list[tuple[str, str]]:
    """The mode's tables the seam holds (none where nft cannot be run)."""
    try:
        return [(kind, name) for kind, name in seam.tables() if name == TABLE]
    except BackendError:
        return []


def leftovers(seam: MapSeam) -> list[str]:
    return [f"nftables table {kind} {name}" for kind, name in _present(seam)]


def remove(seam: MapSeam) -> list[str]:
    """Deletes the mode's tables; says which."""
    found = _present(seam)
    if found:
        seam.transact("".join(f"delete table {kind} {name}\n" for kind, name in found))
    return [f"nftables table {kind} {name}" for kind, name in found]
