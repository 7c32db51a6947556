"""All-or-nothing syncs: undoing a half-applied set of iptables-restore inputs.

iptables-restore commits each table of an input on its own (a refused ``*nat`` leaves the
``*filter`` before it written), and a large plan is written as several inputs. When an input
fails after anything may have committed, one rollback input puts back what the sync's chains
held before it: chains that existed get their old rules back, chains the sync created are
removed, and (full syncs, which know every chain's rules) jumps it inserted are deleted. The
success path pays nothing: the kernel is only read again after a failure.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kubeplex.backends.netfilter import iptables
from kubeplex.backends.netfilter.iptables import IptablesSeam, SavedRuleset
from kubeplex.core.model.errors import BackendError
from kubeplex.core.model.types import IPFamily

Tables = Mapping[str, Mapping[str, Sequence[str]]]

#: Chains named in a message before "and N more".
SHOWN_CHAINS = 5
_TARGET = re.compile(r" -j (\S+)")


@dataclass(frozen=True)
class Before:
    """The kernel before a sync, as far as the sync can change it.

    ``saved`` (full syncs): what iptables-save showed, every chain and rule. ``applied``
    (partial syncs): our chains' rules as the last successful apply wrote them; a partial sync
    writes only those chains and new service chains.
    """

    saved: SavedRuleset | None = None
    applied: Tables | None = None

    def tables(self) -> dict[str, dict[str, list[str]]]:
        """Per table, chain -> its rules as restore lines (``-A CHAIN ...``)."""
        if self.saved is not None:
            return self.saved.by_chain()
        return {
            t: {c: list(r) for c, r in chains.items()} for t, chains in (self.applied or {}).items()
        }


def declared(inputs: Sequence[str]) -> dict[str, dict[str, None]]:
    """The chains each table of ``inputs`` declares (writes, creates or deletes), in order."""
    out: dict[str, dict[str, None]] = {}
    table = ""
    for text in inputs:
        for line in text.splitlines():
            if line.startswith("*"):
                table = line[1:]
                out.setdefault(table, {})
            elif line.startswith(":"):
                out[table][line[1:].split(" ", 1)[0]] = None
    return out


def may_have_committed(inputs: Sequence[str], failed: int) -> bool:
    """Whether anything of ``inputs`` up to the failed one can be in the kernel."""
    return failed > 0 or inputs[failed].count("\nCOMMIT\n") > 1


def rollback_inputs(before: Before, attempted: Sequence[str], now: SavedRuleset) -> list[str]:
    """The restore inputs that turn ``now`` back into ``before`` for the chains ``attempted``
    declares (none if nothing differs), to be run in order.

    Only chains whose rules differ are rewritten (a full sync rewrites every chain, mostly
    with the same rules). Like a sync, a large rollback is split, each input at most
    BATCH_RULES rules: first the chains a committed input deleted are created (empty), so
    every rule written next finds its target; then the old chains' rules; last, one input
    deletes the jumps the sync inserted and the chains it created.
    """
    old = before.tables()
    current = now.by_chain()
    missing: list[str] = []
    rewrites: list[str] = []
    final: list[str] = []
    for table, chains in declared(attempted).items():
        had, has = old.get(table, {}), current.get(table, {})
        restore = [c for c in chains if c in had and has.get(c) != had[c]]
        created = [c for c in chains if c not in had and c in has]
        gone = [c for c in restore if c not in has]
        if gone:
            missing += [f"*{table}", *(f":{c} - [0:0]" for c in gone), "COMMIT"]
        rewrites += _chunks(table, {c: had[c] for c in restore})
        unjump = _inserted_jumps(table, old, now, set(chains)) if before.saved else []
        if created or unjump:
            final += [f"*{table}", *(f":{c} - [0:0]" for c in created), *unjump]
            final += [*(f"-X {c}" for c in created), "COMMIT"]
    out = ["\n".join(missing) + "\n"] if missing else []
    out += rewrites
    if final:
        out.append("\n".join(final) + "\n")
    return out


def _chunks(table: str, chains: Mapping[str, Sequence[str]]) -> list[str]:
    """Inputs that write ``chains`` (declare, then their rules), at most BATCH_RULES each."""
    out: list[str] = []
    lines: list[str] = []
    size = 0
    for chain, rules in chains.items():
        if lines and size + len(rules) > iptables.BATCH_RULES:
            out.append("\n".join([f"*{table}", *lines, "COMMIT"]) + "\n")
            lines, size = [], 0
        lines += [f":{chain} - [0:0]", *rules]
        size += len(rules)
    if lines:
        out.append("\n".join([f"*{table}", *lines, "COMMIT"]) + "\n")
    return out


def _inserted_jumps(
    table: str, old: Mapping[str, Mapping[str, Sequence[str]]], now: SavedRuleset, ours: set[str]
) -> list[str]:
    """``-D`` lines for jumps into ``ours`` that other chains gained since ``old``."""
    had = old.get(table, {})
    gained = Counter(
        r for r in now.rules.get(table, []) if r.split(" ", 2)[1] not in ours
    ) - Counter(r for chain, rules in had.items() if chain not in ours for r in rules)
    out = []
    for rule, n in gained.items():
        m = _TARGET.search(rule)
        if m is not None and m.group(1) in ours:
            out += [rule.replace("-A ", "-D ", 1)] * n
    return out


def restore_all(
    kernel: IptablesSeam, family: IPFamily, inputs: Sequence[str], before: Before
) -> None:
    """Write ``inputs`` to ``family``'s tables in order, all or nothing.

    Raises BackendError saying what the kernel holds: the previous rules (nothing had
    committed, or the rollback put them back), or which chains may hold the new ones.
    """
    for index, text in enumerate(inputs):
        try:
            kernel.restore(family, text)
        except BackendError as err:
            raise _undo(kernel, family, inputs, index, before, err) from err


def _undo(
    kernel: IptablesSeam,
    family: IPFamily,
    inputs: Sequence[str],
    failed: int,
    before: Before,
    err: BackendError,
) -> BackendError:
    where = f" (input {failed + 1} of {len(inputs)})" if len(inputs) > 1 else ""
    what = f"{kernel.restore_command(family)}{where}: {err}"
    if not may_have_committed(inputs, failed):
        return BackendError(f"{what}; nothing was written, the previous rules are in place")
    attempted = inputs[: failed + 1]
    try:
        now = SavedRuleset.parse(kernel.save(family))
        for undo in rollback_inputs(before, attempted, now):
            kernel.restore(family, undo)
    except BackendError as rb_err:
        chains = [c for chains in declared(attempted).values() for c in chains]
        shown = ", ".join(chains[:SHOWN_CHAINS])
        more = f" and {len(chains) - SHOWN_CHAINS} more" if len(chains) > SHOWN_CHAINS else ""
        return BackendError(
            f"{what}; rolling back failed too ({rb_err}): up to {len(chains)} chains "
            f"({shown}{more}) may hold the new rules, the rest hold the previous ones"
        )
    return BackendError(
        f"{what}; what had been written was rolled back, the previous rules are in place"
    )
