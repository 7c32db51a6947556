"""A trusted full sync lists through nft only the chains whose rules changed since kubeplex's
own last write (read from one netlink dump of the table, fingerprints.py), and still finds and
repairs what someone else put there: a rule inserted, or one replaced in place (root, a
throw-away namespace)."""

from __future__ import annotations

import re
import subprocess

import pytest
from kits.nftables_kit import NODE, Harness, many_services
from kits.render_kit import V4

from kubeplex.backends.nftables import NftablesBackend
from kubeplex.backends.nftables.kernel import NftKernel
from kubeplex.core.dataplane.backend import BackendContext, SyncResult

pytestmark = pytest.mark.kernel


class Listing(NftKernel):
    """The real kernel, keeping every list command nft was given."""

    def __init__(self, netns: str) -> None:
        super().__init__(netns)
        self.listed: list[str] = []

    def list(self, commands: str, terse: bool = False) -> str:
        self.listed.append(commands)
        return super().list(commands, terse)


def nft(ns: str, *args: str) -> str:
    argv = ["ip", "netns", "exec", ns, "nft", *args]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def synced(netns: str) -> tuple[Harness, Listing, str]:
    """Three Services programmed, then one trusted full sync that reads the table and makes
    the record (another table's commit before it: else the ruleset generation says the
    start's whole rewrite still holds, and nothing is read); and one Service's chain."""
    kernel = Listing(netns)
    h = Harness(many_services(3), families=(V4,))
    h.backend = NftablesBackend(BackendContext(h.cfg, NODE, (V4,), netns=netns, kernel=kernel))
    assert h.backend.sync(h.cluster.checkout(full=True)).full
    nft(netns, "add", "table", "inet", "other")
    assert not full_sync(h).repaired
    chain = next(c for c in h.backend.renderers[V4].applied_chains if c.startswith("service-"))
    return h, kernel, chain


def full_sync(h: Harness) -> SyncResult:
    result = h.backend.sync(h.cluster.checkout(full=True))
    assert result.full
    return result


def rules_listed(kernel: Listing) -> list[str]:
    return [c for c in kernel.listed if not c.startswith(("list tables", "list chains"))]


def test_an_unchanged_table_is_not_listed_with_its_rules(netns: str) -> None:
    h, kernel, _ = synced(netns)
    kernel.listed.clear()
    assert not full_sync(h).repaired
    assert rules_listed(kernel) == []


def test_a_rule_inserted_after_a_sync_is_found_and_repaired(netns: str) -> None:
    h, kernel, chain = synced(netns)
    before = nft(netns, "list", "chain", "ip", "kube-proxy", chain)
    nft(netns, "insert", "rule", "ip", "kube-proxy", chain, "drop")
    kernel.listed.clear()
    repaired = full_sync(h).repaired
    assert [(d.chain, d.change, d.found) for d in repaired] == [(chain, "extra", "drop")]
    # Only that chain was listed with its rules, and it holds what kubeplex wrote again.
    assert rules_listed(kernel) == [f"list chain ip kube-proxy {chain}\n"]
    strip = re.compile(r" # handle \d+")
    after = nft(netns, "list", "chain", "ip", "kube-proxy", chain)
    assert strip.sub("", after) == strip.sub("", before)
    kernel.listed.clear()
    assert not full_sync(h).repaired  # the repair is the new record
    assert rules_listed(kernel) == []


def test_a_rule_replaced_in_place_is_found_and_repaired(netns: str) -> None:
    h, kernel, chain = synced(netns)
    listed = nft(netns, "-a", "list", "chain", "ip", "kube-proxy", chain)
    # The chain's last rule (the jump to an endpoint), by its handle: same place, new content.
    handle = re.findall(r"# handle (\d+)", listed)[-1]
    nft(netns, "replace", "rule", "ip", "kube-proxy", chain, "handle", handle, "accept")
    kernel.listed.clear()
    repaired = full_sync(h).repaired
    assert [(d.chain, d.change, d.found) for d in repaired] == [(chain, "changed", "accept")]
    assert rules_listed(kernel) == [f"list chain ip kube-proxy {chain}\n"]
    assert "accept" not in nft(netns, "list", "chain", "ip", "kube-proxy", chain)


def test_without_netlink_the_table_is_listed_whole(netns: str) -> None:
    h, kernel, chain = synced(netns)
    kernel.use_netlink = False
    nft(netns, "insert", "rule", "ip", "kube-proxy", chain, "drop")
    kernel.listed.clear()
    assert [d.change for d in full_sync(h).repaired] == ["extra"]
    assert rules_listed(kernel) == ["list table ip kube-proxy\n"]
