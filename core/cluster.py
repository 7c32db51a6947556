"""The one place cluster objects enter: sources feed it, each sync checks out a ProxyState.

A source (Kubernetes API, folder of manifests) hands over raw API dicts. A malformed object is
reported and skipped; the last good version of that object stays in effect, so one broken
Service neither blocks the others nor removes rules that were working.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubeplex.core.errors import InvalidObject
from kubeplex.core.graph import ChangeSet, ProxyState, ServiceGraph
from kubeplex.core.model import IPFamily, NodeInfo
from kubeplex.core.objects import (
    EndpointSliceObject,
    ServiceCIDRObject,
    parse_endpoint_slice,
    parse_node,
    parse_service,
    parse_service_cidr,
)
from kubeplex.core.tracker import EndpointsChangeTracker, ServiceChangeTracker

log = logging.getLogger(__name__)

#: Called with every object kubeplex cannot program (the API source turns these into Events).
ErrorSink = Callable[[InvalidObject, Mapping[str, Any]], None]


@dataclass
class _FamilyTrackers:
    services: ServiceChangeTracker
    endpoints: EndpointsChangeTracker


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
        #: Events received, as upstream's *_changes_total metrics count them.
        self.service_events = 0
        self.endpoint_events = 0
        self._on_invalid = on_invalid
        self._lock = threading.Lock()
        #: Set whenever something arrives that needs a sync; the runner waits on it.
        self.changed = threading.Event()

    # --- events -----------------------------------------------------------------------------

    def _reject(self, key: str, err: InvalidObject, obj: Mapping[str, Any]) -> None:
        if self._invalid.get(key) is None or str(self._invalid[key]) != str(err):
            log.error("skipping %s (the last valid version stays in effect)", err)
            if self._on_invalid is not None:
                self._on_invalid(err, obj)
        self._invalid[key] = err

    def set_service(self, obj: Mapping[str, Any], origin: str = "") -> None:
        key = "Service " + _key_of(obj)
        try:
            svc = parse_service(obj)
        except InvalidObject as err:
            self._reject(key, _located(err, origin), obj)
            return
        self._invalid.pop(key, None)
        with self._lock:
            self.service_events += 1
            self._notify(any([t.services.update(svc.key, svc) for t in self._all()]))

    def delete_service(self, namespace: str, name: str) -> None:
        self._invalid.pop(f"Service {namespace}/{name}", None)
        with self._lock:
            self.service_events += 1
            self._notify(any([t.services.update(f"{namespace}/{name}", None) for t in self._all()]))

    def set_endpoint_slice(self, obj: Mapping[str, Any], origin: str = "") -> None:
        key = "EndpointSlice " + _key_of(obj)
        try:
            es = parse_endpoint_slice(obj)
        except InvalidObject as err:
            self._reject(key, _located(err, origin), obj)
            return
        self._invalid.pop(key, None)
        with self._lock:
            old = self._slices.get(es.key)
            if old is not None and old.service_key != es.service_key:
                # The slice was relabelled to another Service: take it from the old one.
                for t in self._all():
                    t.endpoints.update(old, removed=True)
            self._slices[es.key] = es
            self.endpoint_events += 1
            self._notify(any([t.endpoints.update(es) for t in self._all()]))

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
        if needed:
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
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        return "<no metadata>"
    name = meta.get("name")
    ns = meta.get("namespace", "default")
    if obj.get("kind") == "Node":
        return str(name)
    return f"{ns}/{name}"


def _located(err: InvalidObject, origin: str) -> InvalidObject:
    """Prefix the file (or other origin) an object came from, so a user can find it."""
    return InvalidObject(f"{origin}: {err.where}", err.errors) if origin else err


def _cidr_order(cidr: str) -> tuple[int, int, int]:
    """Sort key: IPv4 before IPv6, then by network address and prefix length."""
    net = ipaddress.ip_network(cidr)
    return (net.version, int(net.network_address), net.prefixlen)
