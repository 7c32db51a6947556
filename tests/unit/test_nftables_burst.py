"""A burst of new Services in nftables mode: their chains go ahead in stages, the rest last.

One transaction with thousands of new services costs the kernel O(services^2) (each anonymous
map it binds walks the whole transaction), so a sync with many chains the kernel does not hold
yet sends them first, in transactions of about FRESH_STAGE_LINES lines that no packet can reach,
and the elements and every change to what the kernel holds in one last transaction.
"""

from __future__ import annotations

from collections import Counter

import pytest
from kits.nftables_kit import Harness, assert_same_table, many_services
from kits.render_kit import V4

import kubeplex.backends.nftables as backend_module
from kubeplex.backends.nftables import NftObserved, stage_new_objects
from kubeplex.backends.nftables.listing import TableObjects
from kubeplex.backends.nftables.render import FamilyPlan, NftablesRendered
from kubeplex.core.model.errors import BackendError
from kubeplex.core.model.types import IPFamily


@pytest.fixture
def small_stages(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stages of about 40 lines, from 100 lines of new chains on."""
    monkeypatch.setattr(backend_module, "FRESH_STAGE_LINES", 40)
    monkeypatch.setattr(backend_module, "STAGE_MIN_LINES", 100)


def synced(n: int, families: tuple[IPFamily, ...] = (V4,)) -> Harness:
    h = Harness(many_services(n), families=families)
    h.sync()
    return h


def from_scratch(n: int, family: IPFamily = V4) -> str:
    """The table one full sync writes for ``n`` services into an empty kernel."""
    return synced(n, (family,)).dump(family)


def declared_chains(texts: list[str]) -> Counter[str]:
    return Counter(
        line.split()[4]
        for text in texts
        for line in text.splitlines()
        if line.startswith("add chain ")
    )


# --- the decision -------------------------------------------------------------------------------


def plan(fresh_lines: int, full: bool = False) -> FamilyPlan:
    p = FamilyPlan(synced(1).backend.renderers[V4].settings, full)
    p.fresh_parts = ["add chain ip kube-proxy x\n"]
    p.fresh_lines = fresh_lines
    return p


def test_new_chains_go_ahead_in_stages_only_beyond_the_threshold() -> None:
    at, above = backend_module.STAGE_MIN_LINES, backend_module.STAGE_MIN_LINES + 1
    small = NftablesRendered([plan(at)])
    stage_new_objects(small, NftObserved())
    assert small.fresh_stages == []
    big = NftablesRendered([plan(above)])
    stage_new_objects(big, NftObserved())
    assert big.fresh_stages == ["add chain ip kube-proxy x\n"]
    # Two families count together.
    both = NftablesRendered([plan(at // 2 + 1), plan(at // 2 + 1)])
    stage_new_objects(both, NftObserved())
    assert len(both.fresh_stages) == 2


def test_a_full_plan_is_staged_only_into_a_table_the_listing_found() -> None:
    listed = NftObserved(listed=("ip",), tables={"ip": TableObjects()})
    gone = NftObserved(listed=("ip",), tables={})
    found = NftablesRendered([plan(10**6, full=True)])
    stage_new_objects(found, listed)
    assert found.fresh_stages
    missing = NftablesRendered([plan(10**6, full=True)])
    stage_new_objects(missing, gone)
    assert missing.fresh_stages == []


# --- partial syncs ------------------------------------------------------------------------------


@pytest.mark.usefixtures("small_stages")
def test_a_burst_of_new_services_goes_in_stages_ahead_of_one_last_transaction() -> None:
    h = synced(5)
    before = len(h.kernel.applied())
    h.feed(many_services(40))
    r = h.sync()
    sent = h.kernel.applied()[before:]
    assert not r.full and len(r.fresh_stages) > 2
    assert sent == r.kernel_inputs() and len(sent) == len(r.fresh_stages) + 1
    # Nothing in the stages is reachable: no element, no rule of a chain the kernel held.
    held = set(declared_chains(h.kernel.applied()[:before]))
    for stage in sent[:-1]:
        assert "element" not in stage
        assert not set(declared_chains([stage])) & held
        assert not any(f" {chain} " in stage for chain in held if chain.startswith("service-"))
    # What makes them reachable comes last, and every chain is written once.
    assert "add element ip kube-proxy service-ips" in sent[-1]
    assert "add chain" not in sent[-1]
    assert max(declared_chains(sent).values()) == 1
    assert_same_table(from_scratch(40), h.dump())


@pytest.mark.usefixtures("small_stages")
def test_a_few_new_services_stay_one_transaction() -> None:
    h = synced(5)
    before = len(h.kernel.applied())
    h.feed(many_services(6))
    r = h.sync()
    assert r.fresh_stages == [] and len(h.kernel.applied()) == before + 1
    assert_same_table(from_scratch(6), h.dump())


# --- full syncs ---------------------------------------------------------------------------------


@pytest.mark.usefixtures("small_stages")
def test_a_full_sync_stages_new_services_and_writes_each_chain_once() -> None:
    h = synced(5)
    before = len(h.kernel.applied())
    h.feed(many_services(40))
    r = h.sync(full=True)
    sent = h.kernel.applied()[before:]
    assert r.full and r.fresh_stages and len(sent) == len(r.fresh_stages) + 1
    # The listing shows the new chains missing: they are written once, not repaired again.
    assert max(declared_chains(sent).values()) == 1
    assert_same_table(from_scratch(40), h.dump())


@pytest.mark.usefixtures("small_stages")
def test_a_full_sync_into_a_table_removed_behind_kubeplex_is_one_transaction() -> None:
    h = synced(5)
    h.kernel.run("delete table ip kube-proxy\n")
    h.feed(many_services(40))
    r = h.sync(full=True)
    assert r.full and r.fresh_stages == []
    assert_same_table(from_scratch(40), h.dump())


@pytest.mark.usefixtures("small_stages")
def test_a_refused_stage_fails_the_sync_and_the_next_full_one_repairs() -> None:
    h = synced(5)
    h.feed(many_services(40))
    real_run, calls = h.kernel.run, []

    def second_fails(text: str) -> None:
        calls.append(text)
        if len(calls) == 2:
            raise BackendError("nft -f failed: simulated")
        real_run(text)

    h.kernel.run = second_fails  # type: ignore[method-assign]
    elements = [line for line in h.dump().splitlines() if "element" in line]
    with pytest.raises(BackendError):
        h.sync()
    # The first stage's chains are in the kernel, unreachable: not one element changed.
    assert len(calls) == 2 and "add chain" in calls[0]
    assert [line for line in h.dump().splitlines() if "element" in line] == elements
    r = h.sync()
    assert r.full
    assert_same_table(from_scratch(40), h.dump())
