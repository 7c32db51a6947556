"""ServiceChangeTracker and EndpointsChangeTracker: events in, graph and exact change set out.

Each tracker serves one IP family, as upstream's do (a dual-stack node runs one per family).
Events may arrive in any number between syncs; a checkout compares what is pending with what
the previous checkout handed out, so a Service changed and changed back yields no change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from kubeplex.core.model.graph import StaleEndpoint
from kubeplex.core.model.types import (
    Endpoint,
    IPFamily,
    Protocol,
    ServicePort,
    ServicePortName,
    family_of,
    new_endpoint,
    new_service_port,
    new_service_port_name,
)
from kubeplex.core.model.validated_objects import EndpointSliceObject, ServiceObject

PortMap = dict[ServicePortName, ServicePort]
EndpointsMap = dict[ServicePortName, tuple[Endpoint, ...]]

#: Protocols whose conntrack entries outlive a backend (no connection teardown to end them).
CONNECTIONLESS = (Protocol.UDP, Protocol.SCTP)


def service_ports(svc: ServiceObject, family: IPFamily) -> PortMap:
    """The ServicePorts of one Service in one family.

    Empty for a headless or ExternalName Service, or one without a cluster IP of this family.
    """
    cluster_ip = "" if svc.headless else svc.cluster_ip_of(family)
    if not cluster_ip:
        return {}
    externally_accessible_type = svc.type in ("NodePort", "LoadBalancer") or (
        svc.type == "ClusterIP" and bool(svc.external_ips)
    )
    external_local = externally_accessible_type and svc.external_traffic_policy == "Local"
    health_check = (
        svc.health_check_node_port if svc.type == "LoadBalancer" and external_local else 0
    )
    # What every port of the Service shares, computed once.
    external_ips = _of_family(svc.external_ips, family)
    vips = _of_family(svc.load_balancer_ingress_ips, family)
    ranges = _of_family(svc.load_balancer_source_ranges, family)
    node_ports = svc.type in ("NodePort", "LoadBalancer")
    internal_local = svc.internal_traffic_policy == "Local"
    ports: PortMap = {}
    for p in svc.ports:
        spn = new_service_port_name(svc.namespace, svc.name, p.name, p.protocol)
        # (ServicePort's fields, in order)
        ports[spn] = new_service_port(
            spn,
            family,
            cluster_ip,
            p.port,
            p.protocol,
            p.node_port if node_ports else 0,
            external_ips,
            vips,
            ranges,
            svc.session_affinity_client_ip,
            svc.affinity_timeout,
            internal_local,
            external_local,
            health_check,
            svc.traffic_distribution,
        )
    return ports


def _of_family(addresses: tuple[str, ...], family: IPFamily) -> tuple[str, ...]:
    """The addresses (or CIDRs) of one family, de-duplicated, in order."""
    if not addresses:
        return ()
    return tuple(dict.fromkeys(a for a in addresses if family_of(a) is family))


def _changed_keys(
    old: Mapping[ServicePortName, object], new: Mapping[ServicePortName, object]
) -> set[ServicePortName]:
    if not old:  # a new Service (every one at the first checkout): no value is None
        return set(new)
    return {k for k in old.keys() | new.keys() if old.get(k) != new.get(k)}


@dataclass(frozen=True)
class ServiceChanges:
    changed: frozenset[ServicePortName]
    #: Cluster IPs of connectionless service ports that were deleted (for conntrack cleanup).
    stale_service_ips: frozenset[str]


class ServiceChangeTracker:
    def __init__(self, family: IPFamily) -> None:
        self.family = family
        self._applied: dict[str, PortMap] = {}
        self._pending: dict[str, PortMap] = {}
        self._ports: PortMap = {}

    def update(self, key: str, svc: ServiceObject | None) -> bool:
        """Record the new state of Service ``key`` (None: deleted). True if a sync is needed."""
        new = service_ports(svc, self.family) if svc is not None else {}
        if new == self._applied.get(key, {}):
            self._pending.pop(key, None)
        else:
            self._pending[key] = new
        return bool(self._pending)

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def ports(self) -> Mapping[ServicePortName, ServicePort]:
        """Service ports as of the last checkout."""
        return self._ports

    def checkout(self) -> ServiceChanges:
        changed: set[ServicePortName] = set()
        stale_ips: set[str] = set()
        for key, new in self._pending.items():
            old = self._applied.get(key, {})
            diff = _changed_keys(old, new)
            changed |= diff
            # A new Service (old empty) has nothing to give up, nor anything in the map yet.
            for spn in diff if old else ():
                gone = old.get(spn)
                if gone is not None and spn not in new and gone.protocol in CONNECTIONLESS:
                    stale_ips.add(gone.cluster_ip)
                self._ports.pop(spn, None)
            self._ports.update(new)
            if new:
                self._applied[key] = new
            else:
                self._applied.pop(key, None)
        self._pending.clear()
        return ServiceChanges(frozenset(changed), frozenset(stale_ips))


@dataclass(frozen=True)
class EndpointChanges:
    changed: frozenset[ServicePortName]
    stale_endpoints: tuple[StaleEndpoint, ...]
    newly_active: frozenset[ServicePortName]
    #: Earliest ``last-change-trigger-time`` (epoch seconds) per changed Service (latency metric).
    trigger_times: Mapping[str, float]


def merge_slices(slices: Mapping[str, EndpointSliceObject], node_name: str) -> EndpointsMap:
    """Endpoints of one Service from all of its slices: merged, de-duplicated, upstream order."""
    # The hot loop of a first checkout (an Endpoint per endpoint and port): each address is
    # formatted once (as Endpoint.address does), and an Endpoint only made when it is kept.
    by_port: dict[ServicePortName, dict[str, Endpoint]] = {}
    local_name = node_name or None  # (no endpoint is local to a node without a name)
    make = new_endpoint
    for slice_name in sorted(slices):
        es = slices[slice_name]
        endpoints = es.endpoints
        for port in es.ports:
            spn = new_service_port_name(es.namespace, es.service_name, port.name, port.protocol)
            seen = by_port.setdefault(spn, {})
            number = port.port
            suffix = f":{number}"
            for sep in endpoints:
                ip = sep.ip
                address = "[" + ip + "]" + suffix if ":" in ip else ip + suffix
                is_local = sep.node_name == local_name
                # An endpoint moving between slices shows up twice for a moment; upstream
                # keeps one, preferring the copy that says it is local.
                if is_local or address not in seen:
                    seen[address] = make(
                        ip,
                        number,
                        sep.ready,
                        sep.serving,
                        sep.terminating,
                        is_local,
                        sep.node_name,
                        sep.zone,
                        sep.zone_hints,
                        sep.node_hints,
                    )
    # Sorted by address (the keys, each one endpoint's).
    return {spn: tuple([eps[a] for a in sorted(eps)]) for spn, eps in by_port.items() if eps}


def _parse_trigger_time(text: str) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class EndpointsChangeTracker:
    def __init__(self, family: IPFamily, node_name: str) -> None:
        self.family = family
        self._address_type = family.value  # (an enum's value is a property)
        self.node_name = node_name
        self._slices: dict[str, dict[str, EndpointSliceObject]] = {}
        self._applied: dict[str, EndpointsMap] = {}
        self._pending: set[str] = set()
        self._trigger: dict[str, float] = {}
        self._endpoints: EndpointsMap = {}

    def update(self, es: EndpointSliceObject, removed: bool = False) -> bool:
        """Record a slice add/update (or its removal). True if a sync is needed."""
        if es.address_type != self._address_type:
            return bool(self._pending)  # the other family's tracker takes it
        svc_key = es.service_key
        slices = self._slices.setdefault(svc_key, {})
        if removed:
            slices.pop(es.name, None)
            if not slices:
                del self._slices[svc_key]
        else:
            if slices.get(es.name) == es:
                return bool(self._pending)
            slices[es.name] = es
            when = _parse_trigger_time(es.trigger_time)
            if when is not None:
                self._trigger[svc_key] = min(when, self._trigger.get(svc_key, when))
        self._pending.add(svc_key)
        return True

    def remove_service_slices(self, svc_key: str) -> None:
        """Forget every slice of a Service (used by a relist that no longer lists them)."""
        if self._slices.pop(svc_key, None) is not None:
            self._pending.add(svc_key)

    def slice_keys(self) -> set[tuple[str, str]]:
        return {(svc, name) for svc, slices in self._slices.items() for name in slices}

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def endpoints(self) -> Mapping[ServicePortName, tuple[Endpoint, ...]]:
        return self._endpoints

    def checkout(self) -> EndpointChanges:
        changed: set[ServicePortName] = set()
        stale: list[StaleEndpoint] = []
        newly_active: set[ServicePortName] = set()
        for svc_key in sorted(self._pending):
            old = self._applied.get(svc_key, {})
            new = merge_slices(self._slices.get(svc_key, {}), self.node_name)
            diff = _changed_keys(old, new)
            changed |= diff
            for spn in diff:
                if spn.protocol not in CONNECTIONLESS:
                    continue
                before, after = old.get(spn, ()), new.get(spn, ())
                # Only a serving endpoint can have had traffic, so only it leaves entries; it is
                # stale once no serving endpoint has its address (upstream compares ip:port and
                # serving only: a ready endpoint that starts terminating keeps its flows).
                still_serving = {ep.address for ep in after if ep.serving}
                stale.extend(
                    StaleEndpoint(spn, ep)
                    for ep in before
                    if ep.serving and ep.address not in still_serving
                )
                # Upstream: 0 -> >0 serving endpoints (a terminating fallback counts too).
                if any(ep.serving for ep in after) and not any(ep.serving for ep in before):
                    newly_active.add(spn)
            if old:  # (only what it held before can be in the map)
                for spn in diff:
                    self._endpoints.pop(spn, None)
            self._endpoints.update(new)
            if new:
                self._applied[svc_key] = new
            else:
                self._applied.pop(svc_key, None)
        triggers = {k: v for k, v in self._trigger.items() if k in self._pending}
        self._pending.clear()
        self._trigger.clear()
        return EndpointChanges(frozenset(changed), tuple(stale), frozenset(newly_active), triggers)
