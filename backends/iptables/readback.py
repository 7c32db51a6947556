"""Reading the kernel back: what of the iptables mode is on a node (cleanup, leftovers), what
one Service port has (inspect), and where the mode's own chains differ from what it wrote
(drift), from iptables-save output."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence

from kubeplex.backends.iptables import names
from kubeplex.backends.iptables.rulekey import rule_key
from kubeplex.backends.iptables.rules import KUBELET_FIREWALL
from kubeplex.backends.netfilter.artifacts import Artifacts, rule_target
from kubeplex.backends.netfilter.artifacts import describe as describe_chains
from kubeplex.backends.netfilter.artifacts import find as found_chains
from kubeplex.backends.netfilter.iptables import SavedRuleset
from kubeplex.core.dataplane.backend import EndpointView, ProgrammedService, RuleDrift
from kubeplex.core.dataplane.drift import diff_chains
from kubeplex.core.model.types import IPFamily, ServicePortName

#: Chains of the mode besides the per-service ones (KUBE-FIREWALL: see ``firewall_is_ours``).
FIXED_CHAINS = frozenset(
    {
        names.SERVICES,
        names.EXTERNAL_SERVICES,
        names.NODEPORTS,
        names.POSTROUTING,
        names.MARK_MASQ,
        names.FORWARD,
        names.PROXY_FIREWALL,
        names.CANARY,
    }
)
#: Chains only kubelet makes: where one exists, kubelet manages this node's KUBE-FIREWALL.
KUBELET_MARKERS = (("mangle", "KUBE-IPTABLES-HINT"), ("mangle", "KUBE-KUBELET-CANARY"),
                   ("nat", "KUBE-KUBELET-CANARY"), ("filter", "KUBE-KUBELET-CANARY"))  # fmt: skip
#: The comment of the one rule the mode writes into KUBE-FIREWALL (and kubelet too).
MARTIAN_COMMENT = "block incoming localnet connections"
ROUTE_LOCALNET = "net.ipv4.conf.all.route_localnet"
#: The leftover line of route_localnet, which the mode sets for localhost NodePorts.
ROUTE_LOCALNET_LINE = f"sysctl {ROUTE_LOCALNET}=1"
#: The leftover line of the mode's own KUBE-FIREWALL (IPv4), route_localnet's guard.
GUARD_LINE = f"iptables filter chain {KUBELET_FIREWALL}"

_PROBABILITY = re.compile(r" --probability (\S+)")
_DESTINATION = re.compile(r" --to-destination (\S+)")
_SECONDS = re.compile(r" --rcheck --seconds (\d+)")


def firewall_is_ours(saved: SavedRuleset) -> bool:
    """Whether filter KUBE-FIREWALL is the mode's own copy, to remove with the rest.

    The mode writes kubelet's anti-martian rule into it (localhost NodePorts make 127/8
    routable). Where kubelet runs, the chain is kubelet's (upstream never deletes it): kubelet
    leaves its marker chains, and deleting its guard would leave the node open until kubelet
    restarts. A chain holding any other rule (an older kubelet's drop-mark rule, someone
    else's) is not ours either. Empty is not ours: the mode never leaves it empty."""
    rules = [r for r in saved.rules.get("filter", []) if r.split(" ", 2)[1] == KUBELET_FIREWALL]
    if KUBELET_FIREWALL not in saved.chains.get("filter", set()) or not rules:
        return False
    if any(chain in saved.chains.get(table, set()) for table, chain in KUBELET_MARKERS):
        return False
    return all(f'"{MARTIAN_COMMENT}"' in r and r.endswith(" -j DROP") for r in rules)


def _ours(table: str, chain: str, firewall: bool) -> bool:
    if chain in FIXED_CHAINS:
        return True
    if table == "filter" and chain == KUBELET_FIREWALL:
        return firewall
    # Per-service chains live in nat only (as upstream hunts them); elsewhere a KUBE-SVC-...
    # chain is someone else's.
    return table == "nat" and names.is_service_chain(chain)


def artifacts(
    saved: SavedRuleset, family: IPFamily = IPFamily.IPv4, keep: Collection[str] = ()
) -> list[Artifacts]:
    """What of the mode ``saved`` (one family) holds, per table, but for what ``keep`` names
    (see ``netfilter.artifacts.find``)."""
    firewall = firewall_is_ours(saved)
    return found_chains(saved, family, lambda table, c: _ours(table, c, firewall), keep)


def removes_martian_guard(family: IPFamily, found: list[Artifacts]) -> bool:
    """Whether removing ``found`` takes the mode's KUBE-FIREWALL away (IPv4): then the
    route_localnet it guarded goes back to the kernel's default too."""
    return family is IPFamily.IPv4 and any(
        a.table == "filter" and KUBELET_FIREWALL in a.chains for a in found
    )


def describe(family: IPFamily, found: list[Artifacts]) -> list[str]:
    """One line per artifact, as ``CleanupReport`` and ``leftovers`` word them (iptables
    chains as every netfilter mode words them, so a mode sharing one names it the same)."""
    lines = describe_chains(family, found)
    if removes_martian_guard(family, found):
        lines.append(ROUTE_LOCALNET_LINE)
    return lines


def written_drift(
    written: Mapping[str, Mapping[str, Sequence[str]]], saved: SavedRuleset
) -> list[RuleDrift]:
    """Where the chains the mode ``written`` (per table, chain -> rules; empty: no record)
    differ in ``saved``. KUBE-FIREWALL is left out: kubelet may write there too."""
    found = saved.by_chain()
    out: list[RuleDrift] = []
    for table, chains in written.items():
        mine = {c: rules for c, rules in chains.items() if c != KUBELET_FIREWALL}
        held = found.get(table, {})
        out += diff_chains(mine, {c: held.get(c, []) for c in mine}, rule_key)
    return out


def programmed(
    spn: ServicePortName,
    family: IPFamily,
    nat: SavedRuleset,
    filter_: SavedRuleset,
    rendered: Mapping[str, Sequence[str]] | None = None,
) -> ProgrammedService | None:
    """What ``nat`` (saved with counters) and ``filter_`` hold for ``spn``; None if nothing.
    ``rendered``: the rules the mode renders for the service's own nat chains now, to compare
    those chains whole with (None: not compared)."""
    own = [
        names.service_chain(spn),
        names.local_service_chain(spn),
        names.external_chain(spn),
        names.firewall_chain(spn),
    ]
    present = nat.chains.get("nat", set())
    by_chain: dict[str, list[tuple[str, tuple[int, int] | None]]] = {}
    for rule, counts in nat.counted("nat"):
        by_chain.setdefault(rule.split(" ", 2)[1], []).append((rule, counts))
    chains = [c for c in own if c in present]
    main = next((c for c in chains[:2] if c.startswith(("KUBE-SVC-", "KUBE-SVL-"))), None)
    seps: list[str] = []
    for chain in chains[:2]:
        for rule, _ in by_chain.get(chain, []):
            target = rule_target(rule)
            if target and target.startswith("KUBE-SEP-") and target not in seps:
                seps.append(target)
    objects = chains + [c for c in seps if c in present]
    mine = set(objects)

    entries: list[str] = []
    packets: int | None = None
    for chain in (names.SERVICES, names.NODEPORTS):
        for rule, counts in by_chain.get(chain, []):
            if rule_target(rule) in mine:
                entries.append(rule)
                if counts is not None:
                    packets = (packets or 0) + counts[0]
    quoted, bare = f'--comment "{spn} ', f"--comment {spn} "
    for rule in filter_.rules.get("filter", []):
        if quoted in rule or bare in rule:
            entries.append(rule)
    if not entries and not objects:
        return None

    endpoints: list[EndpointView] = []
    remaining = 1.0
    for rule, _ in by_chain.get(main, []) if main else []:
        target = rule_target(rule)
        if not target or not target.startswith("KUBE-SEP-") or " --rcheck " in rule:
            continue
        m = _PROBABILITY.search(rule)
        share = remaining * (float(m.group(1)) if m else 1.0)
        remaining -= share
        endpoints.append(_endpoint(by_chain.get(target, []), share))
    # Endpoints only the other of the cluster and local chains reaches: no share of the main one.
    shared = {e.target for e in endpoints}
    for chain in chains[:2]:
        if chain == main or not chain.startswith(("KUBE-SVC-", "KUBE-SVL-")):
            continue
        for rule, _ in by_chain.get(chain, []):
            target = rule_target(rule)
            if target and target.startswith("KUBE-SEP-") and " --rcheck " not in rule:
                view = _endpoint(by_chain.get(target, []), None)
                if view.target not in shared:
                    shared.add(view.target)
                    endpoints.append(view)

    rules = [r for c in objects for r, _ in by_chain.get(c, [])]
    seconds = next((int(m.group(1)) for r in rules if (m := _SECONDS.search(r))), None)
    held = {c: [r for r, _ in by_chain.get(c, [])] for c in objects}
    rule_drift = diff_chains(rendered, held, rule_key) if rendered is not None else []
    return ProgrammedService(
        service=str(spn),
        family=family,
        entries=tuple(entries),
        endpoints=tuple(endpoints),
        masquerade=any(rule_target(r) == names.MARK_MASQ for r in rules),
        affinity_seconds=seconds,
        packets=packets,
        objects=tuple(objects),
        rule_drift=tuple(rule_drift),
    )


def _endpoint(rules: list[tuple[str, tuple[int, int] | None]], share: float | None) -> EndpointView:
    for rule, counts in rules:
        if m := _DESTINATION.search(rule):
            return EndpointView(
                target=m.group(1),
                share=share,
                packets=counts[0] if counts else None,
                bytes=counts[1] if counts else None,
            )
    return EndpointView(target="", share=share)
