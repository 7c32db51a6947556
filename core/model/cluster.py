"""The one place cluster objects enter: sources feed it, each sync checks out a ProxyState.

A source (Kubernetes API, folder of manifests) hands over raw API dicts. A malformed object is
reported and skipped; the last good version of that object stays in effect, so one broken
Service neither blocks the others nor removes rules that were working.

A ClusterIP or node port belongs to one Service (core/model/allocations.py). A Service asking for
one another Service holds is refused the same way, naming both, while the older of the two
keeps it: older by creationTimestamp if both have one, else the one seen first (a manifest
without one counts as created when first seen). A refused Service is checked again whenever
an address it asked for is given up, and programmed once nothing older holds it.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kubeplex.core.model.allocations import Claims, claims_of
from kubeplex.core.model.errors import FieldError, InvalidObject, bare
from kubeplex.core.model.graph import ChangeSet, ProxyState, ServiceGraph
from kubeplex.core.model.objects import (
    parse_endpoint_slice,
    parse_node,
    parse_service,
    parse_service_cidr,
)
from kubeplex.core.model.tracker import EndpointsChangeTracker, ServiceChangeTracker
from kubeplex.core.model.types import IPFamily, NodeInfo
from kubeplex.core.model.validated_objects import (
    EndpointSliceObject,
    ServiceCIDRObject,
    ServiceObject,
)

log = logging.getLogger(__name__)

#: Called with every object kubeplex cannot program (the API source turns these into Events).
ErrorSink = Callable[[InvalidObject, Mapping[str, Any]], None]


@dataclass
class _FamilyTrackers:
    services: ServiceChangeTracker
    endpoints: EndpointsChangeTracker


@dataclass(frozen=True, slots=True)
class _Version:
    """One valid version of a Service, with what it holds and where it came from; ``ref``
    names its object for a later report (a conflict), the raw object is not kept."""

    svc: ServiceObject
    claims: Claims
    ref: Mapping[str, Any]
    origin: str


#: What a report about an object needs of it: an Event's involvedObject, a log line's name.
_REFERENCE_FIELDS = ("name", "namespace", "uid", "resourceVersion")


def _reference(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """The part of a raw object a report about it reads (kind, apiVersion and the metadata
    naming it): kept for every Service, where keeping whole objects would cost memory in
    proportion to the cluster."""
    meta = obj.get("metadata")
    named = (
        {k: meta[k] for k in _REFERENCE_FIELDS if k in meta} if isinstance(meta, Mapping) else {}
    )
    ref: dict[str, Any] = {"metadata": named}
    for field_name in ("kind", "apiVersion"):
        if field_name in obj:
            ref[field_name] = obj[field_name]
    return ref


@dataclass(slots=True)
class _ServiceEntry:
    """A Service's place in the first-come order, the version in effect (holding its claims),
    and a newer version refused because something older holds what it asks for."""

    seq: int
    first_seen: float
    created: float | None = None
    origin: str = ""
    accepted: _Version | None = None
    waiting: _Version | None = None

    @property
    def age(self) -> tuple[float, int]:
        """Smaller is older."""
        return (self.first_seen if self.created is None else self.created, self.seq)


class ClusterState:
    """Trackers for every IP family served, the own Node, the ServiceCIDRs, and the rejected
    objects."""

    def __init__(
        self,
        node_name: str,
        families: Iterable[IPFamily] = (IPFamily.IPv4, IPFamily.IPv6),
        on_invalid: ErrorSink | None = None,
    ) -> None:
        self.node_name = node_name
        self.families = tuple(families)
        self._trackers = {
            f: _FamilyTrackers(ServiceChangeTracker(f), EndpointsChangeTracker(f, node_name))
            for f in self.families
        }
        self._node = NodeInfo(name=node_name)
        self._node_changed = False
        self._slices: dict[str, EndpointSliceObject] = {}
        self._service_cidr_objects: dict[str, ServiceCIDRObject] = {}
        self._service_cidrs: tuple[str, ...] = ()
        self._service_cidrs_changed = False
        self._invalid: dict[str, InvalidObject] = {}
        # Service key (ns/name) -> its entry; what each ClusterIP/node port is held by; who
        # waits for it. Only set_service/delete_service touch them (under _claims_lock).
        self._entries: dict[str, _ServiceEntry] = {}
        self._holders: dict[str, str] = {}
        self._waiting_for: dict[str, set[str]] = {}
        self._seq = 0
        self._last_seen = 0.0
        self._claims_lock = threading.RLock()
        #: Events received, as upstream's *_changes_total metrics count them.
        self.service_events = 0
        self.endpoint_events = 0
        self._on_invalid = on_invalid
        self._lock = threading.Lock()
        #: Set whenever something arrives that needs a sync; the runner waits on it.
        self.changed = threading.Event()

    # --- events -----------------------------------------------------------------------------

    def _reject(
        self,
        key: str,
        err: InvalidObject,
        obj: Mapping[str, Any],
        consequence: str = "the last valid version stays in effect",
    ) -> None:
        if self._invalid.get(key) is None or str(self._invalid[key]) != str(err):
            log.error("skipping %s (%s)", err, consequence)
            if self._on_invalid is not None:
                self._on_invalid(err, obj)
        self._invalid[key] = err

    def set_service(self, obj: Mapping[str, Any], origin: str = "") -> None:
        name = _key_of(obj)
        with self._lock:
            self.service_events += 1
        try:
            svc = parse_service(obj)
            spec = obj.get("spec")
            version = _Version(
                svc,
                claims_of(svc, spec if isinstance(spec, Mapping) else {}),
                _reference(obj),
                origin,
            )
        except InvalidObject as err:
            with self._claims_lock:
                entry = self._entries.get(name)
                if entry is not None:  # a refused older version must not come back later
                    self._unwait(name, entry)
            self._reject("Service " + name, _located(err, origin), obj)
            return
        with self._claims_lock:
            entry = self._entries.get(name)
            if entry is None:
                entry = self._entries[name] = self._new_entry()
            entry.created, entry.origin = _creation_time(obj), origin
            self._recheck(self._offer(name, entry, version))

    def delete_service(self, namespace: str, name: str) -> None:
        key = f"{namespace}/{name}"
        with self._lock:
            self.service_events += 1
        with self._claims_lock:
            self._invalid.pop(f"Service {key}", None)
            entry = self._entries.pop(key, None)
            freed: set[str] = set()
            if entry is not None:
                self._unwait(key, entry)
                freed = self._release(key, entry)
            self._program(key, None)
            self._recheck(freed)

    # --- who holds a ClusterIP or node port ----------------------------------------------------

    def _new_entry(self) -> _ServiceEntry:
        # Monotonic even if the wall clock steps back: first seen stays first.
        self._last_seen = max(time.time(), self._last_seen)
        self._seq += 1
        return _ServiceEntry(self._seq, self._last_seen)

    def _program(self, key: str, svc: ServiceObject | None) -> None:
        with self._lock:
            needed = False
            for t in self._trackers.values():  # (every family's tracker is told)
                needed = t.services.update(key, svc) or needed
            self._notify(needed)

    def _offer(self, key: str, entry: _ServiceEntry, version: _Version) -> set[str]:
        """Program ``version`` unless an older Service holds something it asks for; take it
        from newer holders. Returns what was given up (to re-check those waiting for it)."""
        self._unwait(key, entry)
        holders = {
            what: holder
            for what in version.claims
            if (holder := self._holders.get(what)) is not None and holder != key
        }
        older = (
            {w: h for w, h in holders.items() if self._entries[h].age < entry.age}
            if holders
            else holders
        )
        if older:
            entry.waiting = version
            for what in version.claims:
                self._waiting_for.setdefault(what, set()).add(key)
            kept = entry.accepted is not None
            self._reject(
                f"Service {key}",
                self._conflict(key, version, older, "already belongs to"),
                version.ref,
                "the last valid version stays in effect" if kept else "not programmed",
            )
            return set()
        freed = self._release(key, entry)
        if holders:
            for holder in sorted(set(holders.values())):
                freed |= self._displace(holder, key, version.claims)
        for what in version.claims:
            self._holders[what] = key
        entry.accepted = version
        self._invalid.pop(f"Service {key}", None)
        self._program(key, version.svc)
        return freed - version.claims.keys() if freed else freed

    def _displace(self, key: str, by: str, wanted: Claims) -> set[str]:
        """``by``, older, takes what Service ``key`` holds: ``key`` is no longer programmed and
        waits (its newest version) until it can be."""
        entry = self._entries[key]
        version = entry.accepted
        freed = self._release(key, entry)
        if version is None:
            return freed
        entry.accepted = None
        self._program(key, None)
        if entry.waiting is None:
            entry.waiting = version
        waiting = entry.waiting
        for what in waiting.claims:
            self._waiting_for.setdefault(what, set()).add(key)
        taken = {what: by for what in version.claims if what in wanted}
        self._reject(
            f"Service {key}",
            self._conflict(key, version, taken, "now belongs to"),
            version.ref,
            "its rules are removed",
        )
        return freed

    def _release(self, key: str, entry: _ServiceEntry) -> set[str]:
        """Give up what the version in effect holds; returns it."""
        if entry.accepted is None:
            return set()
        freed = {w for w in entry.accepted.claims if self._holders.get(w) == key}
        for what in freed:
            del self._holders[what]
        return freed

    def _unwait(self, key: str, entry: _ServiceEntry) -> None:
        if entry.waiting is not None:
            for what in entry.waiting.claims:
                waiters = self._waiting_for.get(what)
                if waiters is not None:
                    waiters.discard(key)
                    if not waiters:
                        del self._waiting_for[what]
            entry.waiting = None

    def _recheck(self, freed: set[str]) -> None:
        """Offer again, oldest first, the refused versions that asked for what was freed."""
        rounds = 0
        while freed:
            rounds += 1
            if rounds > 2 * len(self._entries) + 2:  # cannot happen with a strict order
                log.error("re-checking refused Services did not settle; giving up for now")
                return
            waiting = {k for what in freed for k in self._waiting_for.get(what, ())}
            freed = set()
            for key in sorted(waiting, key=lambda k: self._entries[k].age):
                entry = self._entries[key]
                if entry.waiting is not None:
                    freed |= self._offer(key, entry, entry.waiting)

    def _conflict(
        self, key: str, version: _Version, holders: Mapping[str, str], verb: str
    ) -> InvalidObject:
        errors = []
        for what, holder in sorted(holders.items(), key=lambda i: version.claims[i[0]]):
            owner = self._entries[holder]
            seen = "created earlier" if owner.created is not None else "seen first"
            source = f", {owner.origin}" if owner.origin not in ("", version.origin) else ""
            errors.append(
                FieldError(
                    version.claims[what],
                    f"{what} {verb} Service {holder} ({seen}{source}); the API server "
                    "allocates a ClusterIP or node port to one Service only",
                )
            )
        return _located(InvalidObject(f"Service {key}", errors), version.origin)

    def set_endpoint_slice(self, obj: Mapping[str, Any], origin: str = "") -> None:
        try:
            es = parse_endpoint_slice(obj)
        except InvalidObject as err:
            self._reject("EndpointSlice " + _key_of(obj), _located(err, origin), obj)
            return
        if self._invalid:  # (the key is made only when there is something to look it up in)
            self._invalid.pop("EndpointSlice " + _key_of(obj), None)
        with self._lock:
            old = self._slices.get(es.key)
            if old is not None and old.service_key != es.service_key:
                # The slice was relabelled to another Service: take it from the old one.
                for t in self._all():
                    t.endpoints.update(old, removed=True)
            self._slices[es.key] = es
            self.endpoint_events += 1
            needed = False
            for t in self._trackers.values():  # (every family's tracker is told)
                needed = t.endpoints.update(es) or needed
            self._notify(needed)

    def delete_endpoint_slice(self, namespace: str, name: str) -> None:
        self._invalid.pop(f"EndpointSlice {namespace}/{name}", None)
        with self._lock:
            old = self._slices.pop(f"{namespace}/{name}", None)
            if old is not None:
                self.endpoint_events += 1
                self._notify(any([t.endpoints.update(old, removed=True) for t in self._all()]))

    def set_node(self, obj: Mapping[str, Any], origin: str = "") -> None:
        try:
            node = parse_node(obj)
        except InvalidObject as err:
            self._reject("Node " + _key_of(obj), _located(err, origin), obj)
            return
        if node.name != self.node_name:
            return
        with self._lock:
            if node != self._node:
                # Zone and pod CIDRs feed every Service's rules: resync all of them.
                relevant = (node.labels, node.pod_cidrs, node.addresses) != (
                    self._node.labels,
                    self._node.pod_cidrs,
                    self._node.addresses,
                )
                self._node = node
                self._node_changed = self._node_changed or relevant
                self._notify(relevant)

    def set_service_cidr(self, obj: Mapping[str, Any], origin: str = "") -> None:
        """A networking.k8s.io/v1 ServiceCIDR (cluster-scoped, keyed by name)."""
        meta = obj.get("metadata")
        key = "ServiceCIDR " + str(meta.get("name") if isinstance(meta, Mapping) else None)
        try:
            cidr = parse_service_cidr(obj)
        except InvalidObject as err:
            self._reject(key, _located(err, origin), obj)
            return
        self._invalid.pop(key, None)
        with self._lock:
            self._service_cidr_objects[cidr.name] = cidr
            self._update_service_cidrs()

    def delete_service_cidr(self, name: str) -> None:
        self._invalid.pop(f"ServiceCIDR {name}", None)
        with self._lock:
            if self._service_cidr_objects.pop(name, None) is not None:
                self._update_service_cidrs()

    def _update_service_cidrs(self) -> None:
        """Recompute the union of all ServiceCIDRs (lock held); a change in it feeds every
        family's base rules, so the next sync is a full one."""
        union = {c for obj in self._service_cidr_objects.values() for c in obj.cidrs}
        cidrs = tuple(sorted(union, key=_cidr_order))
        if cidrs != self._service_cidrs:
            self._service_cidrs = cidrs
            self._service_cidrs_changed = True
            self._notify(True)

    def _notify(self, needed: bool) -> None:
        # (lock held, as by checkout's clear: set() takes the event's own lock, once per
        # object of a list otherwise)
        if needed and not self.changed.is_set():
            self.changed.set()

    def _all(self) -> Iterable[_FamilyTrackers]:
        return self._trackers.values()

    # --- queries -----------------------------------------------------------------------------

    @property
    def node(self) -> NodeInfo:
        return self._node

    @property
    def service_cidrs(self) -> tuple[str, ...]:
        """The CIDRs of all ServiceCIDR objects, as the next checkout carries them."""
        return self._service_cidrs

    @property
    def invalid(self) -> Mapping[str, InvalidObject]:
        return dict(self._invalid)

    def pending(self) -> tuple[int, int]:
        """(service changes, endpoint changes) not yet synced, summed over families."""
        with self._lock:
            return (
                sum(t.services.pending for t in self._all()),
                sum(t.endpoints.pending for t in self._all()),
            )

    def service_keys(self) -> set[str]:
        return {spn.namespaced_name for t in self._all() for spn in t.services.ports}

    def slice_keys(self) -> set[str]:
        with self._lock:
            return set(self._slices)

    # --- sync ----------------------------------------------------------------------------------

    def checkout(self, full: bool = False) -> ProxyState:
        """Consume pending changes: the graphs after them, and exactly what changed."""
        with self._lock:
            self.changed.clear()
            full = full or self._node_changed or self._service_cidrs_changed
            self._node_changed = self._service_cidrs_changed = False
            graphs: dict[IPFamily, ServiceGraph] = {}
            changes: dict[IPFamily, ChangeSet] = {}
            for family, t in self._trackers.items():
                svc = t.services.checkout()
                eps = t.endpoints.checkout()
                graphs[family] = ServiceGraph.build(
                    family, self._node, t.services.ports, t.endpoints.endpoints
                )
                changes[family] = ChangeSet(
                    full=full,
                    services=svc.changed | eps.changed,
                    stale_endpoints=eps.stale_endpoints,
                    stale_service_ips=svc.stale_service_ips,
                    newly_active_services=eps.newly_active,
                    trigger_times=eps.trigger_times,
                )
            return ProxyState(self._node, graphs, changes, self._service_cidrs)


def _key_of(obj: Mapping[str, Any]) -> str:
    """``ns/name`` (a Node: ``name``); a value that is no string, bounded (an alias bomb)."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        return "<no metadata>"
    name = _part(meta.get("name"))
    if obj.get("kind") == "Node":
        return name
    return f"{_part(meta.get('namespace', 'default'))}/{name}"


def _part(value: Any) -> str:
    return value if isinstance(value, str) else bare(value)


def _creation_time(obj: Mapping[str, Any]) -> float | None:
    """metadata.creationTimestamp (RFC 3339) in seconds; None if unset or unreadable (then
    the time the object was first seen counts)."""
    meta = obj.get("metadata")
    stamp = meta.get("creationTimestamp") if isinstance(meta, Mapping) else None
    if not isinstance(stamp, str) or len(stamp) > 64:
        return None
    try:
        when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when.timestamp() if when.tzinfo is not None else None


def _located(err: InvalidObject, origin: str) -> InvalidObject:
    """Prefix the file (or other origin) an object came from, so a user can find it."""
    return InvalidObject(f"{origin}: {err.where}", err.errors) if origin else err


def _cidr_order(cidr: str) -> tuple[int, int, int]:
    """Sort key: IPv4 before IPv6, then by network address and prefix length."""
    net = ipaddress.ip_network(cidr)
    return (net.version, int(net.network_address), net.prefixlen)
