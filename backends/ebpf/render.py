"""The ebpf mode's render: from the endpoint graph to what its maps must hold, and the plan
(``EbpfPlan``) that makes them hold it. Pure: no system call, golden-testable anywhere.

What the maps hold, per Service port of each IP family:

* an entry in ``kpx_svc4`` / ``kpx_svc6`` for every address and port a connection started on
  the node may use to reach it: its ClusterIP, its externalIPs and LoadBalancer ingress IPs,
  and its NodePort on each address NodePorts are served on (``RenderSettings``); TCP and UDP.
  SCTP is not supported: such a Service port is left out, and the plan says so;
* its endpoints in ``kpx_backends``, slots 0 to count-1 of its svc_id, an endpoint keeping
  its slot across syncs where it can (slots.py: removing one endpoint of 100 writes one slot,
  not 99); with session affinity, each endpoint's slot in ``kpx_slots`` too, so that the
  program's affinity entries, which name an endpoint, find it in whatever slot it moved to.

Only the node's IP families (``RenderSettings.families``) are written: an IPv4-only node has
no IPv6 entry, and a full sync deletes those of a family the node stopped running.

Which endpoints: those the graph chooses (readiness, the terminating fallback, topology
hints). A connection to the ClusterIP takes the internal traffic policy's (the local ones for
Local); a connection to an external entry point (externalIP, LoadBalancer IP, NodePort)
started on the node takes the cluster's, whatever the external policy, as upstream's
short-circuit of pod and host traffic does. So a Service port with internal policy Local
and an external entry point has two endpoint lists: the second is under its own svc_id
(the same text with "/external"). A list without endpoints has count 0: the program refuses
the connection. With ClientIP session affinity the entry carries the affinity flag and the
timeout.

svc_id: the first 4 bytes, big-endian, of the SHA-256 of "<service port>/<protocol>/<family>"
("default/web:http/tcp/ipv4", "/external" appended for the second list), the hash the
netfilter modes name their chains with. 0 is never used. On a collision the text that asked
first keeps the id, and the other takes the next free one up (h+1, h+2, ..., wrapping past
0): the render asks in a fixed order (IPv4 before IPv6, Service ports by name, the internal
list before the external one), so a render from nothing is deterministic, and an id stays with
its Service port while it exists, so a partial sync never renumbers another one.

Two Service ports with the same entry point (an externalIP:port both list): the one whose
name sorts first is written; the other is named in the plan's ``left_out`` for that address.

A full render diffs the whole desired contents against the observed dump of the maps (stray
entries are deleted), keeping the endpoints in the slots the dump has them in; without a dump
(render without root), against empty maps. A partial render recomputes only the changed
Service ports' entries and diffs them against what the renderer wrote before.

The affinity entries the programs write are keyed by svc_id: a full render deletes those of
svc_ids that no longer have affinity (a Service deleted, or its affinity turned off), from the
dump of ``kpx_affinity`` the full sync reads anyway. A partial render leaves them to the next
full sync: the programs never read another svc_id's entries, an entry is only followed to an
endpoint ``kpx_slots`` still lists and only within the timeout, and the LRU map evicts entries
nobody touches first; so until then they take room, never a decision.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from socket import AF_INET, AF_INET6, inet_pton

from kubeplex.backends.ebpf import layout, slots
from kubeplex.backends.ebpf.plan import (
    RENDERED_MAPS,
    SERVICE_MAPS,
    EbpfPlan,
    MapDump,
    MapOp,
    describe_key,
    diff,
)
from kubeplex.core.model.graph import ProxyState, ServiceGraph
from kubeplex.core.model.types import (
    Endpoint,
    IPFamily,
    Protocol,
    ServicePort,
    ServicePortName,
    family_of,
)

_PROTO_NUMBERS = {Protocol.TCP: layout.PROTO_TCP, Protocol.UDP: layout.PROTO_UDP}
_ID_SPACE = 1 << 32
#: Slots are u16.
MAX_ENDPOINTS = 0xFFFF

#: A Service port of one family.
Owner = tuple[IPFamily, ServicePortName]
#: A map entry's place: the map's name and the key's bytes.
Place = tuple[str, bytes]


@dataclass(frozen=True)
class RenderSettings:
    """What the entries depend on besides the graph (a change makes the next render full)."""

    #: The node's addresses NodePorts are served on, of both families (upstream's
    #: nodePortAddresses, resolved against the node's own addresses).
    nodeport_addresses: tuple[str, ...] = ()
    #: The IP families the node runs: the others' Service ports are not written.
    families: tuple[IPFamily, ...] = (IPFamily.IPv4, IPFamily.IPv6)


def id_text(family: IPFamily, spn: ServicePortName, external: bool = False) -> str:
    """What a svc_id hashes (see the module's documentation)."""
    text = f"{spn}/{spn.protocol.lower()}/{family.lower()}"
    return text + "/external" if external else text


def hashed_id(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big")


class SvcIds:
    """svc_ids by text, each kept while its text is in use (the collision rule above)."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self._texts: dict[int, str] = {}

    def take(self, text: str) -> int:
        found = self.ids.get(text)
        if found is not None:
            return found
        svc_id = hashed_id(text)
        while svc_id == 0 or svc_id in self._texts:
            svc_id = (svc_id + 1) % _ID_SPACE
        self.ids[text] = svc_id
        self._texts[svc_id] = text
        return svc_id

    def release(self, text: str) -> None:
        svc_id = self.ids.pop(text, None)
        if svc_id is not None:
            del self._texts[svc_id]


@dataclass
class Contribution:
    """What one Service port of one family asks the maps to hold."""

    #: Its entry points' entries (kpx_svc4 / kpx_svc6).
    entries: dict[Place, bytes] = field(default_factory=dict)
    #: Its slots (kpx_backends).
    slots: dict[bytes, bytes] = field(default_factory=dict)
    #: With affinity: each endpoint's slot (kpx_slots).
    indexes: dict[bytes, bytes] = field(default_factory=dict)
    #: The texts of its svc_ids.
    ids: tuple[str, ...] = ()
    #: Why it is not programmed ("" if it is).
    unsupported: str = ""


# layout's svc_key and backend_value, from address text: inet_pton is much faster than
# ipaddress, which counts at 10,000 Services.
def _svc_key(family: IPFamily, ip: str, port: int, proto: int) -> bytes:
    if family is IPFamily.IPv4:
        return layout.SVC4_KEY.pack(inet_pton(AF_INET, ip), port.to_bytes(2, "big"), proto)
    return layout.SVC6_KEY.pack(inet_pton(AF_INET6, ip), port.to_bytes(2, "big"), proto)


def _backend_value(family: IPFamily, ip: str, port: int) -> bytes:
    if family is IPFamily.IPv4:
        addr, number = inet_pton(AF_INET, ip), layout.FAMILY_V4
    else:
        addr, number = inet_pton(AF_INET6, ip), layout.FAMILY_V6
    return layout.BACKEND_VALUE.pack(addr, port.to_bytes(2, "big"), number)


class EbpfRenderer:
    """Renders ``ProxyState`` into an ``EbpfPlan``, keeping what it rendered for the next
    partial render (which trusts that the previous plan was applied; ``invalidate`` after a
    failed apply makes the next render full)."""

    def __init__(self, settings: RenderSettings | None = None) -> None:
        self.settings = settings or RenderSettings()
        self.force_full = True
        self.svc_ids = SvcIds()
        self._parts: dict[Owner, Contribution] = {}
        #: Every Service port asking for an entry point, by place.
        self._claims: dict[Place, set[Owner]] = {}
        #: The places more than one Service port claims.
        self._contested: set[Place] = set()
        #: The Service ports the mode cannot program.
        self._unsupported: set[Owner] = set()
        #: What the maps hold after the last plan, as far as the renderer wrote them.
        self.desired: dict[str, dict[bytes, bytes]] = {name: {} for name in RENDERED_MAPS}

    def invalidate(self) -> None:
        self.force_full = True

    def contribution(self, family: IPFamily, spn: ServicePortName) -> Contribution | None:
        """What the last render asked the maps to hold for one Service port of one family."""
        return self._parts.get((family, spn))

    # --- one Service port ---------------------------------------------------------------

    def _contribution(
        self, graph: ServiceGraph, svc: ServicePort, held: Mapping[int, Mapping[int, bytes]]
    ) -> Contribution:
        """The Service port's entries; its endpoints keep the slots ``held`` (svc_id -> slot
        -> kpx_backends value) has them in where they can."""
        family, spn = graph.family, svc.name
        proto = _PROTO_NUMBERS.get(svc.protocol)
        if proto is None:
            return Contribution(unsupported=f"{svc.protocol} is not supported by the ebpf mode")
        chosen = graph.categorized(spn)
        internal = chosen.local if svc.internal_policy_local else chosen.cluster
        inside = [(svc.cluster_ip, svc.port)] if svc.cluster_ip else []
        outside = [(ip, svc.port) for ip in (*svc.external_ips, *svc.load_balancer_vips)]
        if svc.node_port:
            outside += [
                (ip, svc.node_port)
                for ip in self.settings.nodeport_addresses
                if family_of(ip) is family
            ]
        lists: list[tuple[str, tuple[Endpoint, ...], list[tuple[str, int]]]]
        if svc.internal_policy_local and outside:
            lists = [
                (id_text(family, spn), internal, inside),
                (id_text(family, spn, external=True), chosen.cluster, outside),
            ]
        else:
            lists = [(id_text(family, spn), internal, inside + outside)]
        if any(len(eps) > MAX_ENDPOINTS for _, eps, _ in lists):
            return Contribution(unsupported=f"more than {MAX_ENDPOINTS} endpoints")
        part = Contribution(ids=tuple(text for text, _, _ in lists))
        svc_map = layout.SVC4.name if family is IPFamily.IPv4 else layout.SVC6.name
        flags = layout.FLAG_AFFINITY if svc.session_affinity_client_ip else 0
        timeout = svc.sticky_max_age_seconds if flags else 0
        for text, endpoints, points in lists:
            svc_id = self.svc_ids.take(text)
            value = layout.svc_value(svc_id, len(endpoints), flags, timeout)
            for ip, port in points:
                part.entries[svc_map, _svc_key(family, ip, port, proto)] = value
            wanted = [_backend_value(family, ep.ip, ep.port) for ep in endpoints]
            for slot, value in enumerate(slots.assign(held.get(svc_id, {}), wanted)):
                part.slots[layout.backend_key(svc_id, slot)] = value
                if flags:
                    part.indexes[layout.slot_key(svc_id, value)] = layout.slot_value(slot)
        return part

    def _forget(self, owner: Owner) -> Contribution | None:
        part = self._parts.pop(owner, None)
        self._unsupported.discard(owner)
        if part is not None:
            for place in part.entries:
                claims = self._claims[place]
                claims.discard(owner)
                if not claims:
                    del self._claims[place]
                elif len(claims) == 1:
                    self._contested.discard(place)
        return part

    def _add(self, owner: Owner, part: Contribution) -> None:
        self._parts[owner] = part
        if part.unsupported:
            self._unsupported.add(owner)
        for place in part.entries:
            claims = self._claims.setdefault(place, set())
            claims.add(owner)
            if len(claims) > 1:
                self._contested.add(place)

    def _write_places(self, places: Iterable[Place]) -> None:
        """Set ``desired`` at ``places`` to the value of the Service port that sorts first
        among those claiming it (none: the entry goes)."""
        for name, key in places:
            claims = self._claims.get((name, key))
            if claims:
                self.desired[name][key] = self._parts[min(claims)].entries[name, key]
            else:
                self.desired[name].pop(key, None)

    def _left_out(self) -> dict[str, str]:
        out = {
            f"{spn} ({family})": self._parts[family, spn].unsupported
            for family, spn in sorted(self._unsupported)
        }
        for name, key in sorted(self._contested):
            claims = self._claims[name, key]
            first = min(claims)
            for family, spn in sorted(claims - {first}):
                out[f"{spn} ({family})"] = (
                    f"{describe_key(name, key)} is {first[1]}'s, whose name sorts first"
                )
        return out

    # --- the render ---------------------------------------------------------------------

    def render(self, state: ProxyState, observed: MapDump | None = None) -> EbpfPlan:
        """The plan for ``state``: full if any change set asks for it (or after
        ``invalidate``), against ``observed`` (the maps' dump; None: empty maps); else the
        changed Service ports' entries."""
        if self.force_full or state.is_full():
            return self._render_full(state, observed or {})
        return self._render_partial(state)

    def _render_full(self, state: ProxyState, observed: MapDump) -> EbpfPlan:
        owners = [
            (family, svc)
            for family in sorted(state.graphs, key=_family_order)
            if family in self.settings.families
            for svc in state.graphs[family]
        ]
        # Ids of Service ports that are gone are free before anyone takes a new one.
        present = {
            id_text(family, svc.name, external)
            for family, svc in owners
            for external in (False, True)
        }
        for text in [t for t in self.svc_ids.ids if t not in present]:
            self.svc_ids.release(text)
        self._parts.clear()
        self._claims.clear()
        self._contested.clear()
        self._unsupported.clear()
        held = slots.held_by_id(observed.get(layout.BACKENDS.name, {}))
        for family, svc in owners:
            self._add((family, svc.name), self._contribution(state.graphs[family], svc, held))
        used = {text for part in self._parts.values() for text in part.ids}
        for text in [t for t in self.svc_ids.ids if t not in used]:
            self.svc_ids.release(text)
        self.desired = {name: {} for name in RENDERED_MAPS}
        self._write_places(self._claims)
        backends, indexes = self.desired[layout.BACKENDS.name], self.desired[layout.SLOTS.name]
        for part in self._parts.values():
            backends.update(part.slots)
            indexes.update(part.indexes)
        self.force_full = False
        ops = [*diff(self.desired, observed), *self._stale_affinity(observed)]
        return EbpfPlan(tuple(ops), left_out=self._left_out())

    def _stale_affinity(self, observed: MapDump) -> list[MapOp]:
        """Deletes of the observed affinity entries whose svc_id has no affinity now."""
        sticky = {
            svc_id
            for name in SERVICE_MAPS
            for svc_id, _count, flags, _timeout in map(
                layout.SVC_VALUE.unpack, self.desired[name].values()
            )
            if flags & layout.FLAG_AFFINITY
        }
        name = layout.AFFINITY.name
        return [
            MapOp(name, key)
            for key in observed.get(name, {})
            if layout.AFFINITY_KEY.unpack(key)[1] not in sticky
        ]

    def _render_partial(self, state: ProxyState) -> EbpfPlan:
        # Ordered: the new entries in render order, then those that went.
        places: dict[Place, None] = {}
        old_slots: dict[str, set[bytes]] = {layout.BACKENDS.name: set(), layout.SLOTS.name: set()}
        new_slots: dict[str, dict[bytes, bytes]] = {name: {} for name in old_slots}
        touched_slots: dict[str, dict[bytes, None]] = {name: {} for name in old_slots}
        old_ids: set[str] = set()
        new_ids: set[str] = set()
        for family in sorted(state.graphs, key=_family_order):
            if family not in self.settings.families:
                continue
            graph = state.graphs[family]
            for spn in sorted(state.changes[family].services):
                old = self._forget((family, spn)) or Contribution()
                svc = graph.services.get(spn)
                held = slots.held_by_id(old.slots)
                new = Contribution() if svc is None else self._contribution(graph, svc, held)
                if svc is not None:
                    self._add((family, spn), new)
                places.update(dict.fromkeys([*new.entries, *old.entries]))
                for name, was, now in (
                    (layout.BACKENDS.name, old.slots, new.slots),
                    (layout.SLOTS.name, old.indexes, new.indexes),
                ):
                    touched_slots[name].update(dict.fromkeys([*now, *was]))
                    old_slots[name].update(was)
                    new_slots[name].update(now)
                old_ids.update(old.ids)
                new_ids.update(new.ids)
        for text in old_ids - new_ids:
            self.svc_ids.release(text)
        touched = {name: [key for n, key in places if n == name] for name in SERVICE_MAPS}
        touched.update((name, list(keys)) for name, keys in touched_slots.items())
        before = self._held(touched)
        self._write_places(places)
        for name, keys in old_slots.items():
            for key in keys:
                self.desired[name].pop(key, None)
            self.desired[name].update(new_slots[name])
        after = self._held(touched)
        return EbpfPlan(tuple(diff(after, before)), is_full=False, left_out=self._left_out())

    def _held(self, keys: Mapping[str, list[bytes]]) -> dict[str, dict[bytes, bytes]]:
        """``desired`` at ``keys``, per map."""
        return {
            name: {k: self.desired[name][k] for k in wanted if k in self.desired[name]}
            for name, wanted in keys.items()
        }


def _family_order(family: IPFamily) -> int:
    return 0 if family is IPFamily.IPv4 else 1
