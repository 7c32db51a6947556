"""Which chains a trusted full sync lists with their rules: those whose fingerprints (their
rules as the kernel encodes them) changed since kubeplex's own last write."""

from __future__ import annotations

from collections.abc import Collection

from kubeplex.backends.nftables.fingerprints import (
    ChainRecords,
    Fingerprints,
    after_write,
    changed_chains,
)
from kubeplex.backends.nftables.generation import GenerationGate


def test_changed_chains_are_those_with_other_rules_or_on_one_side_only() -> None:
    recorded = {"a": (b"1", b"2"), "b": (b"3",), "gone": (b"4",)}
    held = {"a": (b"1", b"2"), "b": (b"3x",), "new": (b"5",)}
    assert changed_chains(recorded, held) == {"b", "gone", "new"}
    assert changed_chains(recorded, dict(recorded)) == set()
    # The same rules in another order differ.
    assert changed_chains({"a": (b"1", b"2")}, {"a": (b"2", b"1")}) == {"a"}


def test_after_write_keeps_the_untouched_chains_and_reads_the_touched() -> None:
    before = {"a": (b"1",), "b": (b"2",), "deleted": (b"3",)}
    assert after_write(before, {"b", "deleted"}, {"b": (b"2new",)}) == {
        "a": (b"1",),
        "b": (b"2new",),
    }


class Kernel:
    """A seam holding a table's fingerprints, keeping which chains each read asked for."""

    def __init__(self, table: Fingerprints) -> None:
        self.table = table
        self.reads: list[list[str] | None] = []

    def rule_fingerprints(
        self, family: str, chains: Collection[str] | None = None
    ) -> Fingerprints | None:
        self.reads.append(None if chains is None else list(chains))
        wanted = self.table if chains is None else {c: () for c in chains}
        return {c: self.table[c] for c in wanted if c in self.table}


def test_records_follow_writes_and_find_what_changed_since() -> None:
    kernel = Kernel({"fixed": (b"f",), "svc-a": (b"a",)})
    records = ChainRecords()
    assert records.changed(kernel, ["ip"]) is None  # no record yet: list the table whole
    records.written(kernel, "ip", full=True, touched=(), drifted=set(), trusted=False)
    assert kernel.reads == [] and records.changed(kernel, ["ip"]) is None  # after a start
    records.written(kernel, "ip", full=True, touched=(), drifted=set())
    assert kernel.reads[-1] is None  # a trusted full write without a record: the whole table
    # A partial write of one chain reads that chain alone.
    kernel.table["svc-b"] = (b"b",)
    records.written(kernel, "ip", full=False, touched={"svc-b"}, drifted=set())
    assert kernel.reads[-1] == ["svc-b"]
    assert records.changed(kernel, ["ip"]) == {"ip": set()}
    # A trusted full sync: someone changed svc-a; the write rewrites the fixed chain only
    # and leaves svc-a drifted: it stays out of the record, to be compared again.
    kernel.table["svc-a"] = (b"foreign", b"a")
    assert records.changed(kernel, ["ip"]) == {"ip": {"svc-a"}}
    kernel.table["fixed"] = (b"f2",)
    records.written(kernel, "ip", full=True, touched={"fixed"}, drifted={"svc-a"})
    assert kernel.reads[-1] == ["fixed"]
    assert records.changed(kernel, ["ip"]) == {"ip": {"svc-a"}}
    # Repaired (touched) this time: recorded again, nothing changed since.
    kernel.table["svc-a"] = (b"a2",)
    records.written(kernel, "ip", full=True, touched={"fixed", "svc-a"}, drifted={"svc-a"})
    assert records.changed(kernel, ["ip"]) == {"ip": set()}
    records.forget()
    assert records.changed(kernel, ["ip"]) is None


def test_a_seam_without_fingerprints_keeps_no_record() -> None:
    records = ChainRecords()
    records.written(object(), "ip", full=True, touched={"a"}, drifted=set())
    assert records.changed(object(), ["ip"]) is None


class Generations(Kernel):
    """The same seam with a ruleset generation; ``commit`` stands for a writer's commit,
    ``write`` for one of kubeplex's, followed as the real seam follows it."""

    def __init__(self, table: Fingerprints) -> None:
        super().__init__(table)
        self.generations = GenerationGate()
        self.now = 5

    def generation(self) -> int | None:
        return self.now

    def commit(self) -> None:
        self.now += 1

    def write(self) -> None:
        before = self.now if self.generations.following else None
        self.commit()
        self.generations.wrote(before, self.now if before is not None else None, 1)


def test_a_whole_rewrite_stands_for_a_record_while_the_generation_is_ours() -> None:
    kernel = Generations({"fixed": (b"f",), "svc-a": (b"a",)})
    records = ChainRecords()
    records.rewriting(kernel)  # a start: the base is read before the listing
    kernel.write()
    records.written(kernel, "ip", full=True, touched=(), drifted=set(), trusted=False)
    assert records.changed(kernel, ["ip"]) == {"ip": set()}  # nothing read
    records.written(kernel, "ip", full=True, touched={"fixed"}, drifted=set())
    kernel.write()  # a partial one of kubeplex's own
    records.written(kernel, "ip", full=False, touched={"svc-a"}, drifted=set())
    assert records.changed(kernel, ["ip"]) == {"ip": set()}
    assert kernel.reads == [] and records.skipped == 2
    # Another writer: no record to compare with, the table is listed whole and recorded.
    kernel.commit()
    assert records.changed(kernel, ["ip"]) is None
    records.written(kernel, "ip", full=True, touched=(), drifted=set())
    assert kernel.reads == [None]
    assert records.changed(kernel, ["ip"]) == {"ip": set()}


def test_a_rewrite_does_not_stand_for_a_record_when_it_cannot_vouch_for_the_table() -> None:
    kernel = Generations({"fixed": (b"f",)})
    records = ChainRecords()
    records.rewriting(kernel)
    kernel.commit()  # between the listing and the rewrite
    kernel.write()
    records.written(kernel, "ip", full=True, touched=(), drifted=set(), trusted=False)
    assert records.changed(kernel, ["ip"]) is None
    # Chains awaiting deletion were left out of the write.
    records.forget()
    kernel.generations.forget()
    records.rewriting(kernel)
    kernel.write()
    records.written(kernel, "ip", True, (), set(), trusted=False, whole=False)
    assert records.changed(kernel, ["ip"]) is None
