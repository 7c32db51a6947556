"""``kubeplex migrate --to MODE --check``: what changes for the cluster's traffic if this node
switches from its current mode to MODE, before anything is switched.

For the current cluster state it compares what the current mode programs (read back from
the kernel through ``inspect``) with what the target mode would program: the mode-neutral
expectation every mode follows (``kubeplex.core.model.expectations``), less what the target
mode cannot do. Every Service IP:port and NodePort is compared — endpoints, masquerading,
traffic policy, affinity — and every behavioural difference the operator must accept is
listed, derived from the two backends' declared capabilities and metric families, never
from their names.

Exit codes: 0 safe, 1 differences to accept, 2+ errors (4: the target mode cannot run here,
or the kernel cannot be read).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubeplex.core.cli import logs
from kubeplex.core.cli.inspecting import PortState, load_cluster, port_states, served_ports
from kubeplex.core.cli.options import (
    EXIT_BACKEND,
    EXIT_OK,
    EXIT_SYNC_FAILED,
    load_effective_config,
    node_name,
)
from kubeplex.core.cli.printing import echo
from kubeplex.core.cli.shared import make_backend
from kubeplex.core.config.kubeproxy import KubeProxyConfiguration, with_overrides
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import Backend, BackendContext
from kubeplex.core.dataplane.drift import compare, match
from kubeplex.core.model.expectations import (
    CLUSTER_IP,
    DROP,
    LOAD_BALANCER,
    LOCAL_POLICY_FALLBACK,
    NODE_PORT,
    SOCKET_LOAD_BALANCING,
    Expectation,
    as_programmed,
)
from kubeplex.core.model.types import IPFamily, Protocol

EXIT_DIFFERENCES = EXIT_SYNC_FAILED


@dataclass(frozen=True)
class Behaviour:
    """What a capability means for traffic, and which service ports it touches."""

    #: What the node does once the mode has the capability (the current one lacked it).
    gained: str
    #: What the node stops doing once the mode lacks it (the current one had it).
    lost: str
    #: Whether it touches ``exp`` (None: the whole node, whatever Services there are).
    applies: Callable[[Expectation], bool] | None = None
    #: It changes what the node does around the Services (e.g. their unused ports), not what
    #: a Service's own ports do: listed once, the Services stay "the same".
    node_wide: bool = False


def _has(kind: str) -> Callable[[Expectation], bool]:
    return lambda exp: any(f.kind == kind for f in exp.frontends)


def _source_ranges(exp: Expectation) -> bool:
    return any(f.kind == LOAD_BALANCER and DROP in f.also for f in exp.frontends)


#: The capabilities that change what traffic meets (docs/backends.md lists them). One a
#: backend declares that is not here is still listed, by name.
BEHAVIOURS: dict[str, Behaviour] = {
    "localhost-nodeports": Behaviour(
        "NodePorts answer on 127.0.0.1 too",
        "NodePorts no longer answer on 127.0.0.1 (localhost): clients on the node must use a "
        "node address",
        lambda exp: exp.family is IPFamily.IPv4 and _has(NODE_PORT)(exp),
    ),
    "session-affinity": Behaviour(
        "sessionAffinity ClientIP is honoured",
        "sessionAffinity ClientIP is not honoured: a client's connections spread over every "
        "endpoint",
        lambda exp: exp.affinity_seconds is not None,
    ),
    "load-balancer-source-ranges": Behaviour(
        "loadBalancerSourceRanges are enforced",
        "loadBalancerSourceRanges are not enforced: every source reaches the load-balancer IPs",
        _source_ranges,
    ),
    "sctp": Behaviour(
        "SCTP Services are served",
        "SCTP Services are not served",
        lambda exp: exp.service.protocol is Protocol.SCTP,
    ),
    "ipv6": Behaviour(
        "IPv6 Services are served",
        "IPv6 Services are not served",
        lambda exp: exp.family is IPFamily.IPv6,
    ),
    "reject-unused-clusterip-ports": Behaviour(
        "traffic to a ClusterIP port no Service has is rejected at once",
        "traffic to a ClusterIP port no Service has is no longer rejected (clients time out)",
        _has(CLUSTER_IP),
        node_wide=True,
    ),
    "binds-service-ips": Behaviour(
        "the Service IPs are bound to a link of the node as its own addresses: they show in "
        "`ip addr`, and the node answers ARP for them unless strict ARP is configured",
        "the Service IPs are no longer bound to a link of the node: they leave `ip addr`, "
        "and the node no longer answers ARP for them",
        _has(CLUSTER_IP),
        node_wide=True,
    ),
    LOCAL_POLICY_FALLBACK: Behaviour(
        "a Local traffic policy without a local endpoint sends traffic to the endpoints on "
        "other nodes instead of dropping it: pods and the node reach them, outside clients "
        "still time out (the replies come back unreversed); with no such endpoint at all, "
        "connections are refused instead of dropped",
        "a Local traffic policy without a local endpoint drops the traffic instead of sending "
        "it to the endpoints on other nodes: pods and the node no longer reach the Service "
        "through it",
        lambda exp: any(f.verdict == DROP for f in exp.frontends),
    ),
    SOCKET_LOAD_BALANCING: Behaviour(
        "connections started on the node (pods and the host) are sent to the endpoint where "
        "the socket connects: neither DNATed nor masqueraded, and conntrack holds no NAT "
        "entry for them; a Local traffic policy without a local endpoint refuses them",
        "connections started on the node are DNATed by the kernel's rules again (conntrack "
        "holds their NAT), and masqueraded where the mode's rules say",
    ),
    "render-only": Behaviour(
        "no packet path is programmed on this node at all",
        "the node's packet path is programmed again",
    ),
}


@dataclass
class Report:
    current: str
    target: str
    node: str
    #: Items the operator must accept ("kind", "what", "message", "affects").
    differences: list[dict[str, Any]] = field(default_factory=list)
    #: What keeps the target from running here at all.
    blockers: list[str] = field(default_factory=list)
    #: Informational: what is new and changes nothing that worked.
    notes: list[str] = field(default_factory=list)
    services: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "from": self.current,
            "to": self.target,
            "node": self.node,
            "safe": not (self.differences or self.blockers),
            "blockers": self.blockers,
            "differences": self.differences,
            "notes": self.notes,
            "services": self.services,
        }


def run_check(args: argparse.Namespace) -> int:
    """``kubeplex migrate --to args.to --check`` (``args.output``: "text" or "json")."""
    cfg = load_effective_config(args)
    logs.configure(cfg, getattr(args, "verbosity", None))
    netns = getattr(args, "netns", None)
    current = make_backend(cfg, netns)
    target_cfg = with_overrides(cfg, mode=args.to, known_modes=plugins.known_modes())
    target = plugins.load_backend(
        args.to, BackendContext(config=target_cfg, node_name=node_name(cfg), netns=netns)
    )
    cluster = load_cluster(cfg, args)
    state = cluster.checkout(full=True)
    ports = port_states(cfg, state, current, served_ports(state))
    if ports is None:
        print(
            f"kubeplex migrate: mode {current.mode} cannot read its kernel back (inspect): "
            "nothing to compare with",
            file=sys.stderr,
        )
        return EXIT_BACKEND
    report = check(cfg, target_cfg, current, target, ports)
    if getattr(args, "output", "text") == "json":
        json.dump(report.as_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        echo(text(report), end="")  # the kernel's lines
    if report.blockers:
        return EXIT_BACKEND
    return EXIT_DIFFERENCES if report.differences else EXIT_OK


def check(
    cfg: KubeProxyConfiguration,
    target_cfg: KubeProxyConfiguration,
    current: Backend,
    target: Backend,
    ports: Sequence[PortState],
) -> Report:
    """The comparison, from the kernel's views (``ports``) and the two backends."""
    report = Report(current.mode, target.mode, current.ctx.node_name)
    if current.mode == target.mode:
        report.notes.append(f"the node is in mode {target.mode} already: nothing switches")
    missing = plugins.missing_requirements(target.mode, target)
    report.blockers += [f"mode {target.mode}: {m}" for m in missing]

    now_caps = _effective(cfg, current)
    after_caps = _effective(target_cfg, target)
    lost = sorted(now_caps - after_caps)
    gained = sorted(after_caps - now_caps)
    touched: dict[tuple[str, str], list[str]] = {}
    for cap, change in [(c, "lost") for c in lost] + [(c, "gained") for c in gained]:
        behaviour = BEHAVIOURS.get(cap)
        if behaviour is None:
            report.differences.append(
                {
                    "kind": "capability",
                    "what": cap,
                    "message": f"capability {cap!r}: mode {current.mode} "
                    f"{'has' if change == 'lost' else 'lacks'} it, mode {target.mode} "
                    f"{'lacks' if change == 'lost' else 'has'} it",
                    "affects": [],
                }
            )
            continue
        affected = [
            p
            for p in ports
            if p.expectation is not None
            and (behaviour.applies is None or behaviour.applies(p.expectation))
        ]
        if behaviour.applies is not None and not affected:
            continue  # nothing in this cluster meets it
        names = [] if behaviour.node_wide else sorted({_port_name(p) for p in affected})
        for p in [] if behaviour.node_wide else affected:
            touched.setdefault((str(p.service), p.family.value), []).append(cap)
        report.differences.append(
            {
                "kind": "capability",
                "what": cap,
                "message": behaviour.lost if change == "lost" else behaviour.gained,
                "affects": names,
            }
        )

    for p in ports:
        exp = p.expectation
        drift = compare(
            as_programmed(exp, current.capabilities) if exp is not None else None, p.view
        )
        for d in drift:
            report.differences.append(
                {
                    "kind": "kernel",
                    "what": d.kind,
                    "message": f"now {d.message}; mode {target.mode} will program what the "
                    "cluster state says",
                    "affects": [_port_name(p)],
                }
            )
        caps = touched.get((str(p.service), p.family.value))
        report.services.append(_service(p, drift, caps, current, target))

    now_metrics = {m.name for m in current.metric_families()}
    after_metrics = {m.name for m in target.metric_families()}
    for name in sorted(now_metrics - after_metrics):
        report.differences.append(
            {
                "kind": "metric",
                "what": name,
                "message": f"metric {name} disappears (dashboards and alerts on it go blank)",
                "affects": [],
            }
        )
    report.notes += [f"new metric: {n}" for n in sorted(after_metrics - now_metrics)]
    if current.uses_conntrack != target.uses_conntrack:
        report.notes.append(
            f"mode {target.mode} {'cleans' if target.uses_conntrack else 'does not clean'} "
            "conntrack entries of removed endpoints itself"
        )
    return report


def _effective(cfg: KubeProxyConfiguration, backend: Backend) -> frozenset[str]:
    """The backend's capabilities as this configuration leaves them (a capability switched
    off in the mode's section, or by nodePortAddresses, is not one)."""
    caps = set(backend.capabilities)
    section = getattr(cfg, backend.mode, None)
    if not getattr(section, "localhost_node_ports", True) or not _admits_loopback(cfg):
        caps.discard("localhost-nodeports")
    return frozenset(caps)


def _admits_loopback(cfg: KubeProxyConfiguration) -> bool:
    """nodePortAddresses leaves 127.0.0.1 in (none given: every address is)."""
    given = [a for a in cfg.node_port_addresses if a != "primary"]
    if not cfg.node_port_addresses:
        return True
    loopback = ipaddress.ip_address("127.0.0.1")
    return any(
        ipaddress.ip_network(a, strict=False).version == 4
        and loopback in ipaddress.ip_network(a, strict=False)
        for a in given
    )


def _port_name(p: PortState) -> str:
    return f"{p.service} ({p.family.value})"


def _service(
    p: PortState, drift: list[Any], caps: list[str] | None, current: Backend, target: Backend
) -> dict[str, Any]:
    base, view = p.expectation, p.view
    exp = as_programmed(base, target.capabilities) if base is not None else None
    frontends = []
    if base is not None and exp is not None:
        now = as_programmed(base, current.capabilities)
        matched = match(now, view.entries) if view is not None else None
        for f, f_now in zip(exp.frontends, now.frontends, strict=True):
            found = matched.by_frontend.get(f_now, []) if matched is not None else []
            frontends.append(
                {
                    "frontend": str(f),
                    "kind": f.kind,
                    "now": sorted({e.verdict for e in found}),
                    "after": f.verdict,
                }
            )
    return {
        "service": str(p.service),
        "family": p.family.value,
        "frontends": frontends,
        "endpoints": {
            "now": sorted(e.target for e in view.endpoints) if view is not None else [],
            "after": sorted(e.target for e in exp.endpoints) if exp is not None else [],
        },
        "masquerade": {
            "now": view.masquerade if view is not None else None,
            "after": exp.masquerade if exp is not None else None,
        },
        "affinity_seconds": {
            "now": view.affinity_seconds if view is not None else None,
            "after": exp.affinity_seconds if exp is not None else None,
        },
        "traffic_policy": {
            "internal": exp.internal_policy if exp is not None else None,
            "external": exp.external_policy if exp is not None else None,
        },
        "capabilities": sorted(caps or []),
        "same": not drift and not caps,
    }


def text(report: Report) -> str:
    lines = [f"migrate {report.current} -> {report.target} on node {report.node}: pre-flight check"]
    same = [s for s in report.services if s["same"]]
    lines.append(
        f"  {len(report.services)} service ports compared (every Service IP:port and NodePort: "
        f"endpoints, masquerading, traffic policy, affinity); {len(same)} the same"
    )
    for s in report.services:
        fronts = ", ".join(f["frontend"] for f in s["frontends"]) or "no frontend"
        status = "same" if s["same"] else "DIFFERS"
        lines.append(f"    {status:<8}{s['service']} ({s['family']}): {fronts}")
    if report.blockers:
        lines.append(f"  BLOCKED: mode {report.target} cannot run on this node")
        lines += [f"    - {b}" for b in report.blockers]
    if report.differences:
        lines.append(f"  {len(report.differences)} differences to accept:")
        for d in report.differences:
            affects = f" [{', '.join(d['affects'])}]" if d["affects"] else ""
            lines.append(f"    - {d['message']}{affects}")
    elif not report.blockers:
        lines.append("  safe: no difference in behaviour")
    lines += [f"  note: {n}" for n in report.notes]
    return "\n".join(lines) + "\n"
