"""The generation gate: whether anyone but kubeplex has written nftables since its last look.

nf_tables keeps one ruleset generation per network namespace and bumps it at every committed
transaction, whatever the table and whoever the writer. The gate keeps the generation at which
kubeplex's record of its chains (fingerprints.py) last matched the kernel ("ours"): set when a
trusted full sync reads the tables, and carried over each of kubeplex's own writes only when
the generation went, across it, from ours up by exactly the transactions kubeplex committed.
Any other writer in between (another table's, too) leaves a different number, and the gate
forgets ours. At the next trusted full sync, a generation equal to ours means the record still
holds: the rule dump and the comparison can be skipped.

A whole rewrite (after a start, or a failed sync) also makes ours, without a record: it flushes
every chain the listing before it found and refills those it wants, so what it leaves does not
depend on what was there. Its base is the generation read just before that listing; when the
rewrite's transactions took it from there up by exactly their number, nothing else was
committed in between, and the generation after them is ours.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


class GenerationGate:
    """The generation at which kubeplex's record of its rules matches the kernel (``ours``),
    or None when it is not known."""

    def __init__(self) -> None:
        self.ours: int | None = None
        #: A whole rewrite under way: the generation its listing was read at, carried over
        #: each of its writes as ``ours`` is (None: none, or another writer came between).
        self.rewrite: int | None = None

    @property
    def following(self) -> bool:
        """Whether a write is worth the generation reads around it (else it cannot keep
        anything that is ours)."""
        return self.ours is not None or self.rewrite is not None

    def read(self, generation: int) -> None:
        """The tables were read (and the record made from them) at ``generation``."""
        self.ours = generation
        self.rewrite = None

    def rewriting(self, generation: int | None) -> None:
        """A whole rewrite of the tables follows a listing of them read at ``generation``
        (None: it cannot make ours)."""
        self.rewrite = generation

    def rewritten(self) -> bool:
        """The whole rewrite's transactions are all committed: ours is the generation after
        them if nothing else was committed since its listing. Whether ours is known."""
        if self.rewrite is not None:
            self.ours, self.rewrite = self.rewrite, None
        return self.ours is not None

    def wrote(self, before: int | None, after: int | None, commits: int) -> None:
        """kubeplex committed ``commits`` transactions between the readings ``before`` and
        ``after`` (None: not read): ours (and a rewrite's base) carries over only if nothing
        else was committed before, during or between them."""
        exact = before is not None and after is not None and after - before == commits
        self.ours = after if exact and before == self.ours else None
        self.rewrite = after if exact and before == self.rewrite else None

    def unchanged(self, generation: int | None) -> bool:
        """Whether the kernel at ``generation`` still holds what kubeplex last saw and wrote."""
        return generation is not None and generation == self.ours

    def forget(self) -> None:
        self.ours = None
        self.rewrite = None


@runtime_checkable
class GenerationSeam(Protocol):
    """A kernel seam that reads the ruleset generation and follows its own writes with it."""

    generations: GenerationGate

    def generation(self) -> int | None:
        """The ruleset generation now; None where it cannot be read."""
