"""Rule fingerprints: which of kubeplex's chains changed since its own last write.

Listing a table with its rules through nft costs a multiple of the periodic full sync that
compares them with what kubeplex rendered (nft decodes and prints every rule). A netlink dump
of the same rules, left undecoded, costs a fraction of it. So the backend keeps, per table,
each chain's rules as the kernel encoded them right after kubeplex's own last write to that
chain (its fingerprint); at a trusted full sync, one dump of the table tells which chains
differ from that record (a rule added, removed or replaced by someone else, or a chain the
record does not know), and only those are listed through nft and compared rule by rule. A
chain without rules is in no dump: a chain that lost every rule differs as well.

No rule kubeplex writes carries a counter or anything else the kernel updates by itself, so a
fingerprint changes only with the rules.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Protocol, runtime_checkable

from kubeplex.backends.nftables.generation import GenerationSeam

#: Chain -> its rules as the kernel encodes them (expressions and comment), in order.
Fingerprints = dict[str, tuple[bytes, ...]]


@runtime_checkable
class FingerprintSeam(Protocol):
    """A kernel seam that can also read the rules of a kube-proxy table undecoded."""

    def rule_fingerprints(
        self, family: str, chains: Collection[str] | None = None
    ) -> Fingerprints | None:
        """The rules of ``family``'s ("ip", "ip6") kube-proxy table by chain: of every chain,
        or of ``chains`` alone (one without rules, or gone, is left out). None where they
        cannot be read so (then they are compared as nft lists them)."""


def changed_chains(recorded: Mapping[str, tuple[bytes, ...]], held: Fingerprints) -> set[str]:
    """The chains whose rules the kernel ``held`` now differ from those ``recorded`` after
    kubeplex's last write: changed, gone, or there only one side (none: nothing to list)."""
    return {c for c in recorded.keys() | held.keys() if recorded.get(c) != held.get(c)}


def after_write(
    before: Fingerprints, touched: Collection[str], rewritten: Fingerprints
) -> Fingerprints:
    """The record after a write that changed the ``touched`` chains: the ``before`` record
    of every other chain, and what the kernel holds of the touched ones (``rewritten``,
    dumped after the write)."""
    out = {c: rules for c, rules in before.items() if c not in touched}
    out.update(rewritten)
    return out


#: Above this many chains to read again after a write, one dump of the whole table does it.
WHOLE_TABLE_ABOVE = 256


class ChainRecords:
    """Per table ("ip", "ip6"), the fingerprints of its chains after kubeplex's last write.

    ``changed`` reads the tables at a trusted full sync; ``written`` records what a write
    left, reading again only the chains it touched. A seam that cannot read fingerprints, a
    failed read, or a failed write (``forget``) leaves no record: the next trusted full sync
    lists the tables whole, as nft prints them.

    A table that kubeplex rewrote whole (``rewriting``; after a start, or a failed sync)
    needs no record while the ruleset generation stays ours from that rewrite on
    (generation.py): it holds what kubeplex wrote, and a trusted full sync reads nothing."""

    def __init__(self) -> None:
        self._recorded: dict[str, Fingerprints] = {}
        #: What ``changed`` read, by table, with the chains found changed: the record of the
        #: chains this sync's write leaves alone.
        self._read: dict[str, tuple[Fingerprints, set[str]]] = {}
        #: Tables rewritten whole, without a record, while the generation is ours since.
        self._rewritten: set[str] = set()
        #: Trusted full syncs that found the ruleset generation unchanged and read no rules.
        self.skipped = 0

    def rewriting(self, kernel: object) -> None:
        """A full sync that rewrites a table whole lists the tables next: the generation
        then is the rewrite's base, if nothing else is known to be ours (no record: a
        start, or after a failure; a record would have to be compared anyway)."""
        if isinstance(kernel, GenerationSeam):
            unknown = not self._recorded and kernel.generations.ours is None
            kernel.generations.rewriting(kernel.generation() if unknown else None)

    def changed(self, kernel: object, families: Collection[str]) -> dict[str, set[str]] | None:
        """The chains of each table that differ from the record; None where there is no
        record of every one of them (or they cannot be read): compare them whole then."""
        self._read.clear()
        if not isinstance(kernel, FingerprintSeam):
            return None
        if isinstance(kernel, GenerationSeam) and (now := kernel.generation()) is not None:
            known = self._recorded.keys() | self._rewritten
            if kernel.generations.unchanged(now) and known >= set(families):
                # Nothing was committed since kubeplex's last look or whole rewrite: the
                # record (or the rewrite) holds.
                self.skipped += 1
                self._read.update(
                    (f, (self._recorded[f], set())) for f in families if f in self._recorded
                )
                return {f: set() for f in families}
            kernel.generations.read(now)
        self._rewritten.clear()  # another writer since: the tables are compared whole
        out = {}
        for fam in families:
            recorded = self._recorded.get(fam)
            held = kernel.rule_fingerprints(fam) if recorded is not None else None
            if recorded is None or held is None:
                self._read.clear()
                return None
            out[fam] = changed_chains(recorded, held)
            self._read[fam] = (held, out[fam])
        return out

    def written(
        self,
        kernel: object,
        fam: str,
        full: bool,
        touched: Collection[str],
        drifted: set[str],
        trusted: bool = True,
        whole: bool = True,
    ) -> None:
        """Record the table ``fam`` after a successful write (a ``full`` one or not) that
        flushed, filled or deleted the ``touched`` chains. ``drifted``: chains whose rules
        differed from the rendered ones and that the write left as they are (no record of
        them: the next full sync compares them again). An untrusted full write (after a
        start, or a failure) records nothing: the dump of a whole table costs a good part of
        that write, and ``kubeplex run --once`` would never use it; the first trusted full
        sync after it lists the table whole and records it, unless the generation says nothing
        else was committed since the rewrite: the table holds what kubeplex wrote, with no
        record to make. ``whole``: the untrusted write flushed every chain of the table
        (else, chains awaiting deletion, it cannot stand for a record)."""
        read = self._read.pop(fam, None)
        if not isinstance(kernel, FingerprintSeam):
            return
        if full and not trusted:
            self._recorded.pop(fam, None)
            self._rewritten.discard(fam)
            if whole and isinstance(kernel, GenerationSeam) and kernel.generations.rewritten():
                self._rewritten.add(fam)
            return
        if fam in self._rewritten:  # kubeplex's own write since the rewrite: still no record
            return
        again = set(touched)
        if read is not None:  # a trusted full sync: the chains it read stay as they were
            held, changed = read
            before = {c: rules for c, rules in held.items() if c not in changed}
            again |= changed - drifted
        elif full:  # a trusted full sync that listed the table whole: the first record
            before, again = {}, set()
        elif fam in self._recorded:
            before = self._recorded[fam]
        else:
            return
        if (full and read is None) or len(again) > WHOLE_TABLE_ABOVE:
            dumped = kernel.rule_fingerprints(fam)
            record = dumped
        else:
            dumped = kernel.rule_fingerprints(fam, sorted(again)) if again else {}
            record = after_write(before, again, dumped) if dumped is not None else None
        if record is None:
            self._recorded.pop(fam, None)
        else:
            self._recorded[fam] = record

    def forget(self) -> None:
        self._recorded.clear()
        self._read.clear()
        self._rewritten.clear()
