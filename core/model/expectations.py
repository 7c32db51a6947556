"""What kubeplex would program for one Service port now, whatever the mode.

Every mode makes the same decisions from the graph (``topology`` picks the endpoints,
``policy`` what happens without them); this module states them as mode-neutral facts that a
reading of the kernel (``Backend.inspect``) can be compared with: where traffic enters
(frontends: address, port, verdict), which endpoints get an even share of new connections,
whether traffic is masqueraded, and how long sessions stick.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace

from kubeplex.core.model.graph import ServiceGraph
from kubeplex.core.model.policy import TrafficPlan, traffic_plan
from kubeplex.core.model.types import IPFamily, Protocol, ServicePort, ServicePortName

# What a frontend does with a new connection.
FORWARD = "forward"  # DNAT to one of the endpoints
REJECT = "reject"  # no endpoint anywhere: refused (TCP reset / ICMP unreachable)
DROP = "drop"  # Local traffic policy and no local endpoint: dropped (the client times out)

# Kinds of frontends.
CLUSTER_IP = "ClusterIP"
EXTERNAL_IP = "external IP"
LOAD_BALANCER = "load-balancer IP"
NODE_PORT = "NodePort"

# Endpoint sets.
CLUSTER = "cluster"
LOCAL = "local"

#: The capability of a mode that, as upstream's PR 97081, sends the traffic of a Local policy
#: that finds no local endpoint to the cluster's endpoints instead of dropping it (pods and
#: the node still reach the Service; an outside client's replies come back from another
#: node, unreversed, and are lost), and refuses it where there is no such endpoint either.
LOCAL_POLICY_FALLBACK = "local-policy-fallback"
#: The capability of a mode that translates a Service address where the socket connects
#: (cgroup BPF): a connection started on the node goes to the endpoint itself, so it is
#: neither DNATed nor masqueraded (no hairpin either: an endpoint reaching itself connects
#: to itself). A Local policy without a local endpoint is refused at the connect, and an
#: external address reached from the node takes the cluster's endpoints, as upstream's
#: short-circuit of the node's own traffic: ``LOCAL_POLICY_FALLBACK``'s decisions.
SOCKET_LOAD_BALANCING = "socket-load-balancing"


@dataclass(frozen=True, slots=True)
class Frontend:
    """One address and port where the Service port's traffic enters."""

    kind: str
    #: The address; "" for a NodePort (every NodePort address of the node).
    address: str
    port: int
    protocol: Protocol
    verdict: str
    #: The endpoint set a forwarding frontend uses ("cluster" or "local"; "" otherwise).
    endpoints: str = ""
    #: Verdicts that may appear next to ``verdict`` for this frontend: a Local policy without
    #: local endpoints still forwards the node's and pods' own traffic; a load-balancer IP
    #: with source ranges drops what they do not allow.
    also: frozenset[str] = frozenset()

    def __str__(self) -> str:
        if not self.address:
            return f"node port {self.port}/{self.protocol}"
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{host}:{self.port}/{self.protocol}"


@dataclass(frozen=True, slots=True)
class ExpectedEndpoint:
    target: str
    #: Its share of new connections in the set the service's main path uses (even); None
    #: for an endpoint only the other set reaches.
    share: float | None
    local: bool
    #: The sets it is in ("cluster", "local").
    sets: tuple[str, ...]
    #: Serving but terminating: used only because no endpoint is ready.
    terminating: bool = False


@dataclass(frozen=True, slots=True)
class Expectation:
    """What every mode programs for one Service port in one IP family."""

    service: ServicePortName
    family: IPFamily
    frontends: tuple[Frontend, ...]
    endpoints: tuple[ExpectedEndpoint, ...]
    masquerade: bool
    #: Why traffic is masqueraded, in words (empty: it is not).
    masquerade_reasons: tuple[str, ...]
    affinity_seconds: int | None
    internal_policy: str
    external_policy: str
    #: Topology narrowing in force ("" or PreferSameNode / PreferSameZone).
    topology: str
    has_endpoints: bool
    #: The health-check NodePort (0: none); modes differ in how they open it.
    health_check_node_port: int = 0
    #: Other addresses of the Service (its ClusterIP, external and load-balancer IPs).
    addresses: tuple[str, ...] = ()

    @property
    def main_set(self) -> str:
        """The set whose shares ``endpoints`` give ("cluster", "local" or "")."""
        return next((f.endpoints for f in self.frontends if f.endpoints), "")


def expect(
    graph: ServiceGraph,
    spn: ServicePortName,
    *,
    masquerade_all: bool = False,
    local_traffic: str = "",
) -> Expectation:
    """The expectation for ``spn`` (which must be in ``graph``).

    ``masquerade_all`` and ``local_traffic`` (how pod traffic is told apart, in words, e.g.
    "source in 10.244.0.0/16"; "" if it cannot be) only add to ``masquerade_reasons``.
    """
    svc = graph.services[spn]
    cat = graph.categorized(spn)
    plan = traffic_plan(svc, cat)
    internal_set = LOCAL if svc.internal_policy_local else CLUSTER
    external_set = LOCAL if svc.external_policy_local else CLUSTER
    main = CLUSTER if plan.uses_cluster_endpoints else LOCAL if plan.uses_local_endpoints else ""

    cluster = {ep.address for ep in cat.cluster} if plan.uses_cluster_endpoints else set()
    local = {ep.address for ep in cat.local} if plan.uses_local_endpoints else set()
    primary = cluster if main == CLUSTER else local
    endpoints = []
    for ep in cat.reachable:
        sets = tuple(
            s for s, members in ((CLUSTER, cluster), (LOCAL, local)) if ep.address in members
        )
        if not sets:
            continue
        share = 1 / len(primary) if ep.address in primary else None
        endpoints.append(
            ExpectedEndpoint(ep.address, share, ep.is_local, sets, not ep.ready and ep.terminating)
        )

    frontends = _frontends(svc, plan, internal_set, external_set)
    reasons = _masquerade_reasons(svc, plan, bool(endpoints), masquerade_all, local_traffic)
    sticky = svc.session_affinity_client_ip and bool(endpoints)
    return Expectation(
        service=spn,
        family=graph.family,
        frontends=frontends,
        endpoints=tuple(endpoints),
        masquerade=bool(reasons),
        masquerade_reasons=reasons,
        affinity_seconds=svc.sticky_max_age_seconds if sticky else None,
        internal_policy="Local" if svc.internal_policy_local else "Cluster",
        external_policy="Local" if svc.external_policy_local else "Cluster",
        topology=cat.topology_mode,
        has_endpoints=plan.has_endpoints,
        health_check_node_port=svc.health_check_node_port,
        addresses=(svc.cluster_ip, *svc.external_ips, *svc.load_balancer_vips),
    )


def _frontends(
    svc: ServicePort, plan: TrafficPlan, internal_set: str, external_set: str
) -> tuple[Frontend, ...]:
    def verdict(has: bool) -> str:
        return FORWARD if has else DROP if plan.has_endpoints else REJECT

    internal = verdict(plan.has_internal)
    external = verdict(plan.has_external)
    # A Local external policy without local endpoints still sends the node's own and its pods'
    # traffic to the cluster endpoints (the external chain's short-circuit).
    ext_also = frozenset({FORWARD}) if external == DROP else frozenset()
    out = [
        Frontend(
            CLUSTER_IP,
            svc.cluster_ip,
            svc.port,
            svc.protocol,
            internal,
            internal_set if internal == FORWARD else "",
        )
    ]
    ext_set = external_set if external == FORWARD else ""
    for ip in svc.external_ips:
        out.append(Frontend(EXTERNAL_IP, ip, svc.port, svc.protocol, external, ext_set, ext_also))
    firewall = frozenset({DROP}) if svc.load_balancer_source_ranges else frozenset()
    for ip in svc.load_balancer_vips:
        also = ext_also | (firewall if external == FORWARD else frozenset())
        out.append(Frontend(LOAD_BALANCER, ip, svc.port, svc.protocol, external, ext_set, also))
    if svc.node_port:
        out.append(
            Frontend(NODE_PORT, "", svc.node_port, svc.protocol, external, ext_set, ext_also)
        )
    return tuple(out)


def _masquerade_reasons(
    svc: ServicePort,
    plan: TrafficPlan,
    has_endpoint_paths: bool,
    masquerade_all: bool,
    local_traffic: str,
) -> tuple[str, ...]:
    reasons = []
    if plan.has_internal:
        if masquerade_all:
            reasons.append("every client of the cluster IP (masqueradeAll)")
        elif local_traffic:
            reasons.append(f"off-cluster clients of the cluster IP (not {local_traffic})")
    if plan.uses_external_chain:
        if svc.external_policy_local:
            reasons.append("the node's own traffic to external addresses (policy Local)")
        else:
            reasons.append("external traffic (externalTrafficPolicy Cluster)")
    if has_endpoint_paths:
        reasons.append("hairpin: an endpoint reaching itself through the Service")
    return tuple(reasons)


def expectations(
    graph: ServiceGraph, *, masquerade_all: bool = False, local_traffic: str = ""
) -> dict[ServicePortName, Expectation]:
    """Every service port of ``graph``, by name."""
    return {
        spn: expect(graph, spn, masquerade_all=masquerade_all, local_traffic=local_traffic)
        for spn in sorted(graph.services)
    }


def as_programmed(exp: Expectation, capabilities: Collection[str]) -> Expectation:
    """``exp`` as a mode with ``capabilities`` programs it: the shared decisions, with the
    ones a capability changes (``LOCAL_POLICY_FALLBACK``, ``SOCKET_LOAD_BALANCING``)
    changed."""
    if SOCKET_LOAD_BALANCING in capabilities:
        exp = replace(exp, masquerade=False, masquerade_reasons=())
    elif LOCAL_POLICY_FALLBACK not in capabilities:
        return exp
    cluster = any(CLUSTER in e.sets for e in exp.endpoints)
    frontends = tuple(
        replace(
            f,
            verdict=FORWARD if cluster else REJECT,
            endpoints=CLUSTER if cluster else "",
            also=f.also - {FORWARD},
        )
        if f.verdict == DROP
        else f
        for f in exp.frontends
    )
    if frontends == exp.frontends:
        return exp
    return replace(exp, frontends=frontends)
