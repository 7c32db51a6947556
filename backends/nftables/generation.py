"""The generation gate: whether anyone but kubeplex has written nftables since its last look.

nf_tables keeps one ruleset generation per network namespace and bumps it at every committed
transaction, whatever the table and whoever the writer. The gate keeps the generation at which
kubeplex's record of its chains (fingerprints.py) last matched the kernel ("ours"): set when a
trusted full sync reads the tables, and carried over each of kubeplex's own writes only when
the generation went, across it, from ours up by exactly the transactions kubeplex committed.
Any other writer in between (another table's, too) leaves a different number, and the gate
forgets ours. At the next trusted full sync, a generation equal to ours means the record still
holds: the rule dump and the comparison can be skipped.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


class GenerationGate:
    """The generation at which kubeplex's record of its rules matches the kernel (``ours``),
    or None when it is not known."""

    def __init__(self) -> None:
        self.ours: int | None = None

    @property
    def following(self) -> bool:
        """Whether a write is worth the generation reads around it (else it cannot keep
        anything that is ours)."""
        return self.ours is not None

    def read(self, generation: int) -> None:
        """The tables were read (and the record made from them) at ``generation``."""
        self.ours = generation

    def wrote(self, before: int | None, after: int | None, commits: int) -> None:
        """kubeplex committed ``commits`` transactions between the readings ``before`` and
        ``after`` (None: not read): ours carries over only if nothing else was committed
        before, during or between them."""
        carried = (
            self.ours is not None
            and before is not None
            and before == self.ours
            and after is not None
            and after - before == commits
        )
        self.ours = after if carried else None

    def unchanged(self, generation: int | None) -> bool:
        """Whether the kernel at ``generation`` still holds what kubeplex last saw and wrote."""
        return generation is not None and generation == self.ours

    def forget(self) -> None:
        self.ours = None


@runtime_checkable
class GenerationSeam(Protocol):
    """A kernel seam that reads the ruleset generation and follows its own writes with it."""

    generations: GenerationGate

    def generation(self) -> int | None:
        """The ruleset generation now; None where it cannot be read."""
