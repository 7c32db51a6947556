"""The jumps from the built-in chains into a mode's chains, as upstream's EnsureRule(Prepend)
makes them: each missing one is inserted at position 1, in upstream's order."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from kubeplex.backends.netfilter.iptables import SavedRuleset

#: (table, built-in chain, comment, extra match, target).
Jump = tuple[str, str, str, str, str]


def missing_jumps(
    saved: SavedRuleset, jumps: Iterable[Jump], planned: Mapping[str, Collection[str]]
) -> dict[str, list[str]]:
    """``-I CHAIN 1 ...`` lines per table for the jumps ``saved`` lacks; a jump is written only
    to a chain that exists or that ``planned`` (chains per table the restore declares) makes."""
    out: dict[str, list[str]] = {}
    for table, chain, comment, extra, target in jumps:
        exists = target in saved.chains.get(table, set()) or target in planned.get(table, ())
        if exists and not saved.has_jump(table, chain, comment, target):
            match = f"{extra} " if extra else ""
            note = f'-m comment --comment "{comment}" ' if comment else ""
            out.setdefault(table, []).append(f"-I {chain} 1 {match}{note}-j {target}")
    return out


def insert_before_commit(text: str, lines: Mapping[str, list[str]]) -> str:
    """``text`` (restore input of ``*table ... COMMIT`` blocks) with ``lines`` added at the end
    of their table's block; a table without a block gets one of its own at the end."""
    if not any(lines.values()):
        return text
    out: list[str] = []
    table = ""
    done: set[str] = set()
    for line in text.splitlines():
        if line.startswith("*"):
            table = line[1:]
        elif line == "COMMIT" and table:
            out += lines.get(table, [])
            done.add(table)
        out.append(line)
    for table, extra in lines.items():
        if table not in done and extra:
            out += [f"*{table}", *extra, "COMMIT"]
    return "\n".join(out) + "\n"
