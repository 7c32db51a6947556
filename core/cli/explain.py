"""``kubeplex explain NS/NAME[:PORT]``: the packet path of one Service as the kernel holds it.

It reads the active mode's kernel (``Backend.inspect``) and walks the path the way an
operator's debugging guide does — entry, the Service's own objects, the endpoint choice with
its shares and weights, the DNAT target, the masquerade decision, with the kernel's packet
counters — and flags drift: what the kernel holds that differs from what kubeplex would
program now for the cluster state (``kubeplex.core.dataplane.drift``).

Exit codes: 0 no drift, 1 drift found, 2 unknown Service, 3 configuration, 4 kernel or backend.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Collection, Sequence
from dataclasses import asdict
from typing import Any

from kubeplex.core.cli import logs
from kubeplex.core.cli.inspecting import (
    PortState,
    add_source_options,
    load_cluster,
    port_states,
    served_ports,
)
from kubeplex.core.cli.options import (
    EXIT_BACKEND,
    EXIT_OK,
    EXIT_SYNC_FAILED,
    EXIT_USAGE,
    Subparsers,
    add_common_options,
    load_effective_config,
)
from kubeplex.core.cli.printing import echo, escaped_fields
from kubeplex.core.cli.shared import make_backend
from kubeplex.core.dataplane.backend import ProgrammedService
from kubeplex.core.dataplane.drift import Drift, EntryFacts, compare, match
from kubeplex.core.model.errors import escaped
from kubeplex.core.model.expectations import (
    DROP,
    FORWARD,
    REJECT,
    Expectation,
    Frontend,
    as_programmed,
)
from kubeplex.core.model.graph import ProxyState
from kubeplex.core.model.types import ServicePortName

EXIT_DRIFT = EXIT_SYNC_FAILED


def add_parser(sub: Subparsers, name: str) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        name,
        help="the packet path of a Service as the kernel holds it, and drift from what "
        "kubeplex would program",
    )
    p.add_argument("service", metavar="NS/NAME[:PORT]", help="Service (PORT: name or number)")
    add_common_options(p)
    add_source_options(p)
    return p


class UnknownService(Exception):
    """The argument names no service port kubeplex serves."""


def select(state: ProxyState, known: set[str], text: str) -> list[ServicePortName]:
    """The service ports ``NS/NAME[:PORT]`` names (PORT: a port's name or number)."""
    ref, _, port = text.partition(":")
    ns, slash, name = ref.partition("/")
    if not (slash and ns and name):
        raise UnknownService(f"{text!r} is not NS/NAME[:PORT]")
    ports = sorted({spn for spn in served_ports(state) if (spn.namespace, spn.name) == (ns, name)})
    if not ports:
        if f"{ns}/{name}" in known:
            raise UnknownService(
                f"Service {ns}/{name} has no ClusterIP port kube-proxy serves (headless or "
                "ExternalName): nothing is programmed for it"
            )
        others = sorted(k.split("/", 1)[1] for k in known if k.startswith(f"{ns}/"))
        hint = f" (Services in {ns}: {', '.join(others)})" if others else ""
        raise UnknownService(f"no Service {ns}/{name} in the cluster state{hint}")
    if not port:
        return ports
    numbers = {
        spn: graph.services[spn].port
        for graph in state.graphs.values()
        for spn in ports
        if spn in graph.services
    }
    chosen = [s for s in ports if s.port == port or (port.isdigit() and numbers[s] == int(port))]
    if not chosen:
        have = ", ".join(f"{s.port or '(unnamed)'} {numbers[s]}/{s.protocol}" for s in ports)
        raise UnknownService(f"Service {ns}/{name} has no port {port!r} (ports: {have})")
    return chosen


def run(args: argparse.Namespace) -> int:
    cfg = load_effective_config(args)
    logs.configure(cfg, args.verbosity)
    backend = make_backend(cfg, args.netns)
    cluster = load_cluster(cfg, args)
    state = cluster.checkout(full=True)
    try:
        spns = select(state, cluster.service_keys(), args.service)
    except UnknownService as err:
        echo(f"kubeplex explain: {escaped(str(err))}", file=sys.stderr)
        return EXIT_USAGE
    ports = port_states(cfg, state, backend, spns)
    if ports is None:
        print(
            f"kubeplex explain: mode {backend.mode} cannot read its kernel back (inspect)",
            file=sys.stderr,
        )
        return EXIT_BACKEND
    reports = [explain(p) for p in for_mode(ports, backend.capabilities)]
    if args.output == "json":
        doc = {
            "mode": backend.mode,
            "node": backend.ctx.node_name,
            "services": reports,
            "drift": sum(len(r["drift"]) for r in reports),
        }
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(text(backend.mode, reports))
    return EXIT_DRIFT if any(r["drift"] for r in reports) else EXIT_OK


def for_mode(ports: Sequence[PortState], capabilities: Collection[str]) -> list[PortState]:
    """``ports`` with each expectation as a mode of ``capabilities`` programs it."""
    return [
        dataclasses.replace(p, expectation=as_programmed(p.expectation, capabilities))
        if p.expectation is not None
        else p
        for p in ports
    ]


# --- the report ------------------------------------------------------------------------------


def explain(port: PortState) -> dict[str, Any]:
    """One service port in one family, as JSON-ready data (the text is printed from it)."""
    exp, view = port.expectation, port.view
    drift: list[Drift] = compare(exp, view)
    out: dict[str, Any] = {
        "service": str(port.service),
        "protocol": str(port.service.protocol),
        "family": port.family.value,
        "expected": _expectation(exp) if exp is not None else None,
        "programmed": _programmed(view) if view is not None else None,
    }
    frontends: list[dict[str, Any]] = []
    extra: list[str] = []
    if exp is not None and view is not None:
        matched = match(exp, view.entries)
        for f, found in matched.by_frontend.items():
            frontends.append(_frontend(f, found))
        extra = [e.line for e in matched.unmatched + matched.health_check]
    elif exp is not None:
        frontends = [_frontend(f, []) for f in exp.frontends]
    elif view is not None:
        extra = list(view.entries)
    out["frontends"] = frontends
    out["other_entries"] = extra
    out["endpoints"] = _endpoints(exp, view)
    out["drift"] = [d.as_dict() for d in drift]
    return out


def _expectation(exp: Expectation) -> dict[str, Any]:
    return {
        "has_endpoints": exp.has_endpoints,
        "internal_traffic_policy": exp.internal_policy,
        "external_traffic_policy": exp.external_policy,
        "topology": exp.topology,
        "masquerade": exp.masquerade,
        "masquerade_reasons": list(exp.masquerade_reasons),
        "affinity_seconds": exp.affinity_seconds,
    }


def _programmed(view: ProgrammedService) -> dict[str, Any]:
    doc = asdict(view)
    doc["family"] = view.family.value
    return doc


def _frontend(f: Frontend, found: Sequence[EntryFacts]) -> dict[str, Any]:
    return {
        "frontend": str(f),
        "kind": f.kind,
        "verdict": f.verdict,
        "endpoints": f.endpoints,
        "entries": [e.line for e in found],
        "kernel_verdicts": sorted({e.verdict for e in found}),
        "localhost": any(e.loopback for e in found),
    }


def _endpoints(exp: Expectation | None, view: ProgrammedService | None) -> list[dict[str, Any]]:
    want = {e.target: e for e in exp.endpoints} if exp is not None else {}
    out: list[dict[str, Any]] = []
    seen = set()
    remaining = 1.0
    for e in view.endpoints if view is not None else ():
        seen.add(e.target)
        w = want.get(e.target)
        # Without a weight, a share is what a chain of random choices gives: each endpoint
        # takes this probability of what the earlier ones left.
        probability = None
        if e.share is not None and e.weight is None and remaining > 1e-9:
            probability = min(1.0, e.share / remaining)
            remaining -= e.share
        out.append(
            {
                "target": e.target,
                "share": e.share,
                "expected_share": w.share if w is not None else None,
                "weight": e.weight,
                "probability": probability,
                "packets": e.packets,
                "bytes": e.bytes,
                "local": w.local if w is not None else None,
                "programmed": True,
                "expected": w is not None,
            }
        )
    for target, w in want.items():
        if target not in seen:
            out.append(
                {
                    "target": target,
                    "share": None,
                    "expected_share": w.share,
                    "weight": None,
                    "probability": None,
                    "packets": None,
                    "bytes": None,
                    "local": w.local,
                    "programmed": False,
                    "expected": True,
                }
            )
    return out


# --- text --------------------------------------------------------------------------------------

_VERDICT_WORDS = {
    FORWARD: "forwarded to an endpoint",
    REJECT: "refused (no endpoints)",
    DROP: "dropped (Local policy, no local endpoint)",
    "accept": "accepted by the node",
}


def text(mode: str, reports: Sequence[dict[str, Any]]) -> str:
    # Kernel lines (a foreign rule's comment) and names are printed escaped, each on its line.
    return "\n".join(_service_text(mode, escaped_fields(r)) for r in reports)


def _service_text(mode: str, r: dict[str, Any]) -> str:
    exp, prog = r["expected"], r["programmed"]
    lines = [f"{r['service']} ({r['protocol']}, {r['family']}), mode {mode}"]
    if exp is not None:
        affinity = exp["affinity_seconds"]
        lines.append(
            f"  traffic policy: internal {exp['internal_traffic_policy']}, external "
            f"{exp['external_traffic_policy']}"
            + (f", topology {exp['topology']}" if exp["topology"] else "")
            + f"; session affinity: {f'ClientIP {affinity}s' if affinity else 'none'}"
        )
    else:
        lines.append("  not in the cluster state for this family: kubeplex would program nothing")
    if prog is None:
        lines.append("  the kernel holds nothing of it")
    packets = (
        f", {prog['packets']} packets counted there" if prog and prog["packets"] is not None else ""
    )
    lines.append(f"  1. entry{packets}")
    for f in r["frontends"]:
        wanted = _VERDICT_WORDS.get(f["verdict"], f["verdict"])
        lines.append(f"     {f['kind']} {f['frontend']}: {wanted}")
        for entry in f["entries"]:
            lines.append(f"       {entry}")
        if not f["entries"]:
            lines.append("       (no entry in the kernel)")
    for entry in r["other_entries"]:
        lines.append(f"     other: {entry}")
    refusing = [f for f in r["frontends"] if f["verdict"] in (REJECT, DROP)]
    for f in refusing:
        where = f["entries"][0] if f["entries"] else "nowhere: no entry is programmed"
        if f["verdict"] == REJECT:
            lines.append(
                f"     -> no endpoints: new connections to {f['frontend']} are refused (TCP "
                f"reset / ICMP unreachable) at: {where}"
            )
        else:
            lines.append(
                f"     -> no local endpoint: connections to {f['frontend']} from outside the "
                f"node are dropped (clients time out) at: {where}"
            )
    if prog is not None and prog["objects"]:
        lines.append(f"  2. the Service's own objects: {', '.join(prog['objects'])}")
    else:
        lines.append("  2. the Service's own objects: none")
    eps = r["endpoints"]
    lines.append(f"  3. endpoint choice: {_choice(eps)}")
    for e in eps:
        lines.append("     " + _endpoint_text(e))
    if any(e["programmed"] for e in eps):
        lines.append(
            "  4. DNAT to the chosen endpoint's address (above); the kernel keeps it for the "
            "connection (conntrack, or the mode's own connection table) and undoes it on replies"
        )
    else:
        lines.append("  4. DNAT: none (no endpoint is programmed)")
    if exp is not None:
        found = prog["masquerade"] if prog is not None else False
        reasons = "; ".join(exp["masquerade_reasons"]) or "never"
        lines.append(
            f"  5. masquerade: {'yes' if found else 'no'} in the kernel; kubeplex masquerades: "
            f"{reasons}"
        )
    drift = r["drift"]
    if drift:
        lines.append(f"  DRIFT ({len(drift)}): the kernel differs from what kubeplex would program")
        lines += [f"    - {d['message']}" for d in drift]
    else:
        lines.append("  drift: none (the kernel holds what kubeplex would program)")
    return "\n".join(lines) + "\n"


def _choice(eps: Sequence[dict[str, Any]]) -> str:
    programmed = [e for e in eps if e["programmed"]]
    if not programmed:
        return "no endpoints"
    weights = [e["weight"] for e in programmed if e["weight"] is not None]
    if weights and len(weights) == len(programmed):
        return f"{len(programmed)} endpoints by weight (of {sum(weights)} in all)"
    return f"{len(programmed)} endpoints, each with its share of new connections"


def _endpoint_text(e: dict[str, Any]) -> str:
    parts = [f"{e['target'] or '(no DNAT target)':<24}"]
    if e["share"] is not None:
        parts.append(f"share {e['share']:.1%}")
    elif e["programmed"]:
        parts.append("reached through the other endpoint set")
    if e["weight"] is not None:
        parts.append(f"weight {e['weight']}")
    if e["probability"] is not None:
        parts.append(f"probability {e['probability']:.5f} of the rest")
    if e["packets"] is not None:
        parts.append(f"packets {e['packets']} bytes {e['bytes']}")
    if e["local"]:
        parts.append("on this node")
    if not e["programmed"]:
        parts.append("NOT PROGRAMMED")
    elif not e["expected"] and e["share"] == 0:
        parts.append(
            "draining: no endpoint now, no new connections (kept until its connections close)"
        )
    elif not e["expected"]:
        parts.append("STALE: no endpoint now")
    return "  ".join(parts)
