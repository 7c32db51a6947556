"""A burst of new Services in nftables mode, in the kernel (root, namespaces).

Many new services' chains go ahead in stages over netlink (the kernel numbering their
anonymous maps, in a table that has some already), and one last transaction makes them
reachable: the kernel must end with the very table one ``nft -f`` of the whole cluster writes.
"""

from __future__ import annotations

import pytest
from kits.nftables_kit import (
    assert_as_one_nft_transaction,
    kernel_harness,
    kernel_table,
    many_services,
)

import kubeplex.backends.nftables as backend_module
from kubeplex.backends.nftables import names as N
from kubeplex.backends.nftables import netlink
from kubeplex.backends.nftables.kernel import NftKernel

pytestmark = pytest.mark.kernel


@pytest.fixture
def small_stages(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stages of about 2,000 lines, from 4,000 lines of new chains on (a burst of 150-odd
    services, where the defaults stage one of 430-odd)."""
    monkeypatch.setattr(backend_module, "FRESH_STAGE_LINES", 2000)
    monkeypatch.setattr(backend_module, "STAGE_MIN_LINES", 4000)


@pytest.mark.usefixtures("small_stages")
def test_a_partial_burst_is_staged_and_ends_as_one_nft_transaction(netns: str, netns2: str) -> None:
    h = kernel_harness(many_services(20), netns)
    h.sync()
    h.feed(many_services(400))
    r = h.sync()
    kernel = h.backend.kernel
    assert isinstance(kernel, NftKernel) and kernel.last_path == "netlink"
    assert not r.full and len(r.fresh_stages) >= 3
    assert_as_one_nft_transaction(h, netns, netns2)
    # The next syncs find what they recorded: a full one changes nothing.
    before = kernel_table(netns)
    assert h.sync(full=True).fresh_stages == []
    assert kernel_table(netns) == before


@pytest.mark.usefixtures("small_stages")
def test_a_burst_taken_by_a_full_sync_is_staged_too(netns: str, netns2: str) -> None:
    h = kernel_harness(many_services(20), netns)
    h.sync()
    h.feed(many_services(400))
    r = h.sync(full=True)
    assert r.full and len(r.fresh_stages) >= 3
    assert_as_one_nft_transaction(h, netns, netns2)


@pytest.mark.usefixtures("small_stages")
def test_services_removed_and_added_at_once(netns: str, netns2: str) -> None:
    """Half the cluster goes, a burst comes in the same sync: the stages add, the last
    transaction removes."""
    h = kernel_harness(many_services(200), netns)
    h.sync()
    gone = {f"ns{i}" for i in range(100)}
    for ns in sorted(gone):
        h.cluster.delete_service(ns, "web")
        h.cluster.delete_endpoint_slice(ns, "web-1")
    h.feed(many_services(500)[201:])
    r = h.sync()
    assert not r.full and r.fresh_stages
    assert all("delete" not in stage for stage in r.fresh_stages)
    assert_as_one_nft_transaction(h, netns, netns2)


@pytest.mark.usefixtures("small_stages")
def test_a_bursts_maps_are_named_above_those_the_table_holds(netns: str, netns2: str) -> None:
    """The stages name their anonymous maps themselves (the kernel would scan every set of the
    table for each), above every number in use: none taken twice, none of the table's lost."""
    h = kernel_harness(many_services(30), netns)
    h.sync()
    for i in range(10):  # gaps in the numbering, which the kernel would fill first
        h.cluster.delete_service(f"ns{i}", "web")
    h.sync()
    link = netlink.NftNetlink(netns)
    try:
        assert link.set_names("ip6", "no-such-table") == []
        before = set(link.set_names("ip", N.TABLE))
        h.feed(many_services(400)[21:])
        r = h.sync()
        after = set(link.set_names("ip", N.TABLE))
    finally:
        link.close()
    assert r.fresh_stages and before <= after
    numbers = {int(name[5:]) for name in before if name.startswith("__map")}
    assert len(numbers) == 20
    new = {int(name[5:]) for name in after - before if name.startswith("__map")}
    assert len(new) == 370 and min(new) > max(numbers)
    assert_as_one_nft_transaction(h, netns, netns2)
