"""A netfilter mode's chains on a node, and the jumps into them: found in iptables-save output,
worded for ``CleanupReport`` / ``leftovers``, and removed.

Every mode that writes iptables chains words them here, so two modes sharing a chain (the
iptables and ipvs modes both write KUBE-SERVICES) name it alike, and a mode switch can keep
what the active mode still uses (``Backend.cleanup(keep)``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from kubeplex.backends.netfilter.iptables import SavedRuleset, tool
from kubeplex.core.model.types import IPFamily

#: The tables a mode's chains may live in.
TABLES = ("filter", "nat", "mangle")

_TARGET = re.compile(r" -j (\S+)")


@dataclass(frozen=True)
class Artifacts:
    """One table's chains of a mode, and the jumps into them from other chains."""

    table: str
    chains: tuple[str, ...]
    jumps: tuple[str, ...]


def rule_target(rule: str) -> str | None:
    """The ``-j`` target of a saved rule line."""
    m = _TARGET.search(rule)
    return m.group(1) if m else None


def chain_line(family: IPFamily, table: str, chain: str) -> str:
    """``iptables nat chain KUBE-SERVICES`` (``ip6tables`` for IPv6)."""
    return f"{tool(family)} {table} chain {chain}"


def jump_line(family: IPFamily, table: str, rule: str) -> str:
    """``iptables nat jump PREROUTING -> KUBE-SERVICES`` for a saved ``-A`` rule line."""
    return f"{tool(family)} {table} jump {rule.split()[1]} -> {rule_target(rule)}"


def find(
    saved: SavedRuleset,
    family: IPFamily,
    ours: Callable[[str, str], bool],
    keep: Collection[str] = (),
    tables: Iterable[str] = TABLES,
) -> list[Artifacts]:
    """The chains ``ours(table, chain)`` claims in ``saved`` (one family), per table, and the
    jumps into them, but for what ``keep`` names in the words of ``describe``: a kept chain
    stays with the jumps into it, a kept jump stays; a jump into a chain that goes, goes too."""
    out = []
    for table in tables:
        mine = {
            c
            for c in saved.chains.get(table, set())
            if ours(table, c) and chain_line(family, table, c) not in keep
        }
        jumps = tuple(
            r
            for r in saved.rules.get(table, [])
            if r.split()[1] not in mine
            and rule_target(r) in mine
            and jump_line(family, table, r) not in keep
        )
        if mine or jumps:
            out.append(Artifacts(table, tuple(sorted(mine)), jumps))
    return out


def describe(family: IPFamily, found: list[Artifacts]) -> list[str]:
    """One line per artifact, as ``CleanupReport`` and ``leftovers`` word them."""
    lines = []
    for a in found:
        lines += [chain_line(family, a.table, c) for c in a.chains]
        lines += [jump_line(family, a.table, r) for r in a.jumps]
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
