"""The normalized endpoint graph a backend renders, and the change set since the last sync."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from kubeplex.core.model.topology import CategorizedEndpoints, categorize_endpoints
from kubeplex.core.model.types import Endpoint, IPFamily, NodeInfo, ServicePort, ServicePortName


@dataclass(frozen=True, slots=True)
class StaleEndpoint:
    """A UDP/SCTP endpoint that went away: conntrack entries to it must be deleted."""

    service: ServicePortName
    endpoint: Endpoint


@dataclass(frozen=True)
class ChangeSet:
    """What changed in one IP family since the previous sync.

    ``full`` asks the backend to rewrite everything (first sync, periodic resync, a node label
    change, or a failed previous apply); ``services`` are the service ports whose Service or
    endpoints changed, deleted ones included.
    """

    full: bool = False
    services: frozenset[ServicePortName] = frozenset()
    stale_endpoints: tuple[StaleEndpoint, ...] = ()
    stale_service_ips: frozenset[str] = frozenset()
    newly_active_services: frozenset[ServicePortName] = frozenset()
    #: Earliest EndpointSlice ``last-change-trigger-time`` (epoch seconds) per changed Service
    #: ("ns/name"): the start of the network programming latency.
    trigger_times: Mapping[str, float] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (
            self.full
            or self.services
            or self.stale_endpoints
            or self.stale_service_ips
            or self.newly_active_services
        )

    @property
    def namespaced_names(self) -> frozenset[str]:
        return frozenset(spn.namespaced_name for spn in self.services)


@dataclass(frozen=True)
class ServiceGraph:
    """All service ports of one IP family with their merged endpoints, as seen from ``node``."""

    family: IPFamily
    node: NodeInfo
    services: Mapping[ServicePortName, ServicePort]
    endpoints: Mapping[ServicePortName, tuple[Endpoint, ...]]
    _categorized: dict[ServicePortName, CategorizedEndpoints] = field(
        default_factory=dict, repr=False, compare=False
    )

    @classmethod
    def build(
        cls,
        family: IPFamily,
        node: NodeInfo,
        services: Mapping[ServicePortName, ServicePort],
        endpoints: Mapping[ServicePortName, tuple[Endpoint, ...]],
    ) -> ServiceGraph:
        # Snapshots: the trackers go on mutating their own dicts after a sync.
        return cls(
            family, node, MappingProxyType(dict(services)), MappingProxyType(dict(endpoints))
        )

    def __iter__(self) -> Iterator[ServicePort]:
        """Service ports in a stable order (by name), so rendered output is deterministic."""
        for spn in sorted(self.services):
            yield self.services[spn]

    def endpoints_of(self, spn: ServicePortName) -> tuple[Endpoint, ...]:
        return self.endpoints.get(spn, ())

    def categorized(self, spn: ServicePortName) -> CategorizedEndpoints:
        """Cluster/local/reachable endpoints of a service port on this node (cached)."""
        found = self._categorized.get(spn)
        if found is None:
            found = categorize_endpoints(
                self.endpoints_of(spn), self.services[spn], self.node.name, self.node.zone
            )
            self._categorized[spn] = found
        return found

    def total_endpoints(self) -> int:
        """Endpoints of existing service ports; upstream's large-cluster switch counts these."""
        return sum(len(self.endpoints.get(spn, ())) for spn in self.services)


@dataclass(frozen=True)
class ProxyState:
    """One sync's input: the node and a graph per IP family served."""

    node: NodeInfo
    graphs: Mapping[IPFamily, ServiceGraph]
    changes: Mapping[IPFamily, ChangeSet]
    #: The CIDRs of every ServiceCIDR object (both families, de-duplicated, sorted): the
    #: ranges ClusterIPs come from. A change makes the sync a full one.
    service_cidrs: tuple[str, ...] = ()

    def is_full(self) -> bool:
        return any(c.full for c in self.changes.values())

    @property
    def empty(self) -> bool:
        return all(c.empty for c in self.changes.values())
