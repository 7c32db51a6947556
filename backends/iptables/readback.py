"""Reading the kernel back: what of the iptables mode is on a node (cleanup, leftovers), and
what one Service port has (inspect), from iptables-save output."""

from __future__ import annotations

import re
from dataclasses import dataclass

from kubeplex.backends.iptables import names
from kubeplex.backends.netfilter.iptables import SavedRuleset, tool
from kubeplex.core.dataplane.backend import EndpointView, ProgrammedService
from kubeplex.core.model.types import IPFamily, ServicePortName

#: Chains of the mode besides the per-service ones. KUBE-FIREWALL is kubelet's: never ours.
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
CLEANUP_TABLES = ("filter", "nat", "mangle")

_TARGET = re.compile(r" -j (\S+)")
_PROBABILITY = re.compile(r" --probability (\S+)")
_DESTINATION = re.compile(r" --to-destination (\S+)")
_SECONDS = re.compile(r" --rcheck --seconds (\d+)")


@dataclass(frozen=True)
class Artifacts:
    """One table's chains of the mode, and the jumps into them from other chains."""

    table: str
    chains: tuple[str, ...]
    jumps: tuple[str, ...]


def artifacts(saved: SavedRuleset) -> list[Artifacts]:
    """What of the mode ``saved`` holds, per table (tables with nothing left out)."""
    out = []
    for table in CLEANUP_TABLES:
        chains = saved.chains.get(table, set())
        ours = sorted(c for c in chains if c in FIXED_CHAINS or names.is_service_chain(c))
        mine = set(ours)
        jumps = tuple(
            r for r in saved.rules.get(table, []) if r.split()[1] not in mine and _target(r) in mine
        )
        if ours or jumps:
            out.append(Artifacts(table, tuple(ours), jumps))
    return out


def describe(family: IPFamily, found: list[Artifacts]) -> list[str]:
    """One line per artifact, as ``CleanupReport`` and ``leftovers`` word them."""
    cmd = tool(family)
    lines = []
    for a in found:
        lines += [f"{cmd} {a.table} chain {c}" for c in a.chains]
        lines += [f"{cmd} {a.table} jump {r.split()[1]} -> {_target(r)}" for r in a.jumps]
    return lines


def removal(found: list[Artifacts]) -> str:
    """The restore input removing ``found``: chains flushed, jumps deleted, chains deleted."""
    lines: list[str] = []
    for a in found:
        lines.append(f"*{a.table}")
        lines += [f":{c} - [0:0]" for c in a.chains]
        lines += [r.replace("-A ", "-D ", 1) for r in a.jumps]
        lines += [f"-X {c}" for c in a.chains]
        lines.append("COMMIT")
    return "\n".join(lines) + "\n" if lines else ""


def _target(rule: str) -> str | None:
    m = _TARGET.search(rule)
    return m.group(1) if m else None


def programmed(
    spn: ServicePortName, family: IPFamily, nat: SavedRuleset, filter_: SavedRuleset
) -> ProgrammedService | None:
    """What ``nat`` (saved with counters) and ``filter_`` hold for ``spn``; None if nothing."""
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
            target = _target(rule)
            if target and target.startswith("KUBE-SEP-") and target not in seps:
                seps.append(target)
    objects = chains + [c for c in seps if c in present]
    mine = set(objects)

    entries: list[str] = []
    packets: int | None = None
    for chain in (names.SERVICES, names.NODEPORTS):
        for rule, counts in by_chain.get(chain, []):
            if _target(rule) in mine:
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
        target = _target(rule)
        if not target or not target.startswith("KUBE-SEP-") or " --rcheck " in rule:
            continue
        m = _PROBABILITY.search(rule)
        share = remaining * (float(m.group(1)) if m else 1.0)
        remaining -= share
        endpoints.append(_endpoint(by_chain.get(target, []), share))

    rules = [r for c in objects for r, _ in by_chain.get(c, [])]
    seconds = next((int(m.group(1)) for r in rules if (m := _SECONDS.search(r))), None)
    return ProgrammedService(
        service=str(spn),
        family=family,
        entries=tuple(entries),
        endpoints=tuple(endpoints),
        masquerade=any(_target(r) == names.MARK_MASQ for r in rules),
        affinity_seconds=seconds,
        packets=packets,
        objects=tuple(objects),
    )


def _endpoint(rules: list[tuple[str, tuple[int, int] | None]], share: float) -> EndpointView:
    for rule, counts in rules:
        if m := _DESTINATION.search(rule):
            return EndpointView(
                target=m.group(1),
                share=share,
                packets=counts[0] if counts else None,
                bytes=counts[1] if counts else None,
            )
    return EndpointView(target="", share=share)
