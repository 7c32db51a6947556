"""The generation gate's bookkeeping: a generation is ours only across kubeplex's own writes,
each seen from ours up by exactly the transactions it committed."""

from __future__ import annotations

from kubeplex.backends.nftables.generation import GenerationGate


def gate_at(generation: int) -> GenerationGate:
    gate = GenerationGate()
    gate.read(generation)
    return gate


def test_nothing_is_ours_before_the_tables_are_read() -> None:
    gate = GenerationGate()
    assert not gate.following
    gate.wrote(None, None, 1)
    assert gate.ours is None
    assert not gate.unchanged(7)


def test_a_write_of_exactly_our_commits_keeps_the_gate() -> None:
    gate = gate_at(7)
    gate.wrote(7, 8, 1)
    gate.wrote(8, 11, 3)
    assert gate.unchanged(11)
    assert not gate.unchanged(12)


def test_a_jump_by_more_than_our_commits_is_not_ours() -> None:
    gate = gate_at(7)
    gate.wrote(7, 9, 1)
    assert gate.ours is None
    assert not gate.unchanged(9)


def test_a_commit_by_someone_else_before_our_write_is_not_ours() -> None:
    gate = gate_at(7)
    gate.wrote(8, 9, 1)  # 7 -> 8 was another writer's
    assert not gate.unchanged(9)


def test_a_write_that_committed_nothing_is_not_ours() -> None:
    gate = gate_at(7)
    gate.wrote(7, 7, 1)
    assert gate.ours is None


def test_an_unread_generation_is_not_ours() -> None:
    gate = gate_at(7)
    gate.wrote(7, None, 1)
    assert gate.ours is None
    assert not gate.unchanged(None)


def test_reading_the_tables_again_makes_a_new_start() -> None:
    gate = gate_at(7)
    gate.wrote(7, 9, 1)
    gate.read(9)
    assert gate.unchanged(9)
    gate.forget()
    assert not gate.unchanged(9)


def test_a_whole_rewrite_makes_ours_from_its_base() -> None:
    gate = GenerationGate()
    gate.rewriting(7)  # read before the tables were listed
    assert gate.following
    gate.wrote(7, 8, 1)  # a pending deletion
    gate.wrote(8, 11, 3)  # the rewrite, in stages
    assert gate.ours is None  # not until the rewrite is done
    assert gate.rewritten()
    assert gate.unchanged(11)
    assert gate.rewrite is None


def test_a_commit_between_the_listing_and_the_rewrite_is_not_ours() -> None:
    gate = GenerationGate()
    gate.rewriting(7)
    gate.wrote(8, 9, 1)  # 7 -> 8 was another writer's
    assert not gate.rewritten()
    assert not gate.unchanged(9)


def test_a_rewrite_that_was_not_read_or_failed_is_not_ours() -> None:
    gate = GenerationGate()
    gate.rewriting(None)
    assert not gate.following
    assert not gate.rewritten()
    gate.rewriting(7)
    gate.forget()  # the write failed
    assert not gate.rewritten()
    assert gate.ours is None
