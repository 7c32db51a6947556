"""Where a Service port's traffic goes on this node, by traffic policy: the decisions every
dataplane makes the same way (upstream repeats them in each proxier)."""

from __future__ import annotations

from dataclasses import dataclass

from kubeplex.core.model.topology import CategorizedEndpoints
from kubeplex.core.model.types import ServicePort


@dataclass(frozen=True, slots=True)
class TrafficPlan:
    #: The Service has a usable endpoint somewhere in the cluster.
    has_endpoints: bool
    #: Cluster-IP traffic has somewhere to go (with internalTrafficPolicy Local: a local endpoint).
    has_internal: bool
    #: External traffic (NodePort, external IPs, LB IPs) has somewhere to go.
    has_external: bool
    #: The "cluster" endpoint set is used (the SVC chain / service- chain).
    uses_cluster_endpoints: bool
    #: The "local" endpoint set is used (the SVL chain / local-only chain).
    uses_local_endpoints: bool
    #: The external-destination chain is needed: based on has_endpoints, not has_external,
    #: because the short-circuit of pod and host traffic is needed even without local endpoints.
    uses_external_chain: bool

    @property
    def no_endpoints(self) -> bool:
        """Reject: no endpoint anywhere ("connection refused" rather than a timeout)."""
        return not self.has_endpoints

    @property
    def drop_internal(self) -> bool:
        """Drop cluster-IP traffic: internalTrafficPolicy Local and no local endpoint."""
        return self.has_endpoints and not self.has_internal

    @property
    def drop_external(self) -> bool:
        """Drop external traffic: externalTrafficPolicy Local and no local endpoint."""
        return self.has_endpoints and not self.has_external


def traffic_plan(svc: ServicePort, cat: CategorizedEndpoints) -> TrafficPlan:
    has = cat.has_any
    return TrafficPlan(
        has_endpoints=has,
        has_internal=has and (not svc.internal_policy_local or bool(cat.local)),
        has_external=has and (not svc.external_policy_local or bool(cat.local)),
        uses_cluster_endpoints=bool(cat.cluster) and svc.uses_cluster_endpoints,
        uses_local_endpoints=bool(cat.local) and svc.uses_local_endpoints,
        uses_external_chain=has and svc.externally_accessible,
    )
