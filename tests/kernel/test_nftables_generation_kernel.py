"""A trusted full sync reads no rules while the netns's ruleset generation says nothing was
committed since kubeplex's last look or whole rewrite (generation.py); any other writer, of any
table, makes it dump and compare them again (root, a throw-away namespace)."""

from __future__ import annotations

import subprocess
from collections.abc import Collection, Sequence

import pytest
from kits.nftables_kit import NODE, Harness, many_services
from kits.render_kit import V4, endpoint_slice, ep

from kubeplex.backends.nftables import NftablesBackend
from kubeplex.backends.nftables.fingerprints import Fingerprints
from kubeplex.backends.nftables.kernel import NftKernel
from kubeplex.core.dataplane.backend import BackendContext, SyncResult

pytestmark = pytest.mark.kernel


class Counting(NftKernel):
    """The real kernel, counting its rule dumps (of whole tables, and of any rules) and
    keeping every list command nft was given."""

    def __init__(self, netns: str) -> None:
        super().__init__(netns)
        self.dumps = 0
        self.rule_reads = 0
        self.listed: list[str] = []

    def rule_fingerprints(
        self, family: str, chains: Collection[str] | None = None
    ) -> Fingerprints | None:
        self.rule_reads += 1
        if chains is None:
            self.dumps += 1
        return super().rule_fingerprints(family, chains)

    def list(self, commands: str, terse: bool = False) -> str:
        self.listed.append(commands)
        return super().list(commands, terse)

    def rules_listed(self) -> list[str]:
        """The list commands that printed rules (not the object names alone)."""
        return [c for c in self.listed if not c.startswith(("list tables", "list chains"))]


def nft(ns: str, *args: str) -> str:
    argv = ["ip", "netns", "exec", ns, "nft", *args]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def full_sync(h: Harness) -> SyncResult:
    result = h.backend.sync(h.cluster.checkout(full=True))
    assert result.full
    return result


def scale(h: Harness, i: int, endpoints: int) -> None:
    """ns{i}/web of many_services() with ``endpoints`` endpoints, off this node."""
    h.feed(
        [endpoint_slice(f"ns{i}", "web", [ep(f"10.0.{i}.{j + 1}", "n2") for j in range(endpoints)])]
    )


def started(netns: str, kernel: Counting | None = None) -> tuple[Harness, Counting, str]:
    """Three Services programmed by a start's whole (untrusted) write, and nothing since;
    and one Service's chain."""
    kernel = kernel or Counting(netns)
    h = Harness(many_services(3), families=(V4,))
    h.backend = NftablesBackend(BackendContext(h.cfg, NODE, (V4,), netns=netns, kernel=kernel))
    assert h.backend.sync(h.cluster.checkout(full=True)).full
    chain = next(c for c in h.backend.renderers[V4].applied_chains if c.startswith("service-"))
    kernel.listed.clear()
    return h, kernel, chain


def synced(netns: str) -> tuple[Harness, Counting, str]:
    """Three Services programmed, then two trusted full syncs (the first makes the record,
    the second reads the tables at a known generation); and one Service's chain."""
    kernel = Counting(netns)
    h = Harness(many_services(3), families=(V4,))
    h.backend = NftablesBackend(BackendContext(h.cfg, NODE, (V4,), netns=netns, kernel=kernel))
    assert h.backend.sync(h.cluster.checkout(full=True)).full
    assert not full_sync(h).repaired
    assert not full_sync(h).repaired
    chain = next(c for c in h.backend.renderers[V4].applied_chains if c.startswith("service-"))
    kernel.dumps = 0
    return h, kernel, chain


def test_no_foreign_write_no_rule_dump(netns: str) -> None:
    h, kernel, _ = synced(netns)
    assert not full_sync(h).repaired
    assert not full_sync(h).repaired
    assert kernel.dumps == 0


def test_kubeplex_own_partial_writes_keep_the_gate(netns: str) -> None:
    h, kernel, _ = synced(netns)
    scale(h, 1, 2)
    assert not h.backend.sync(h.cluster.checkout()).full
    assert kernel.generations.ours == kernel.generation()
    assert not full_sync(h).repaired
    assert kernel.dumps == 0


def test_a_write_to_another_table_makes_the_full_sync_dump(netns: str) -> None:
    h, kernel, _ = synced(netns)
    nft(netns, "add", "table", "inet", "other")
    assert not full_sync(h).repaired
    assert kernel.dumps == 1
    # Read again at the new generation: the next one skips.
    assert not full_sync(h).repaired
    assert kernel.dumps == 1


def test_a_foreign_rule_in_a_service_chain_is_found_and_repaired(netns: str) -> None:
    h, kernel, chain = synced(netns)
    nft(netns, "insert", "rule", "ip", "kube-proxy", chain, "drop")
    repaired = full_sync(h).repaired
    assert [(d.chain, d.change, d.found) for d in repaired] == [(chain, "extra", "drop")]
    assert kernel.dumps == 1
    assert "drop" not in nft(netns, "list", "chain", "ip", "kube-proxy", chain)


def test_a_foreign_write_between_kubeplex_writes_is_not_hidden(netns: str) -> None:
    h, kernel, chain = synced(netns)
    nft(netns, "insert", "rule", "ip", "kube-proxy", chain, "drop")
    scale(h, 2, 2)  # a partial write after the foreign one
    assert not h.backend.sync(h.cluster.checkout()).full
    assert kernel.generations.ours is None
    repaired = full_sync(h).repaired
    assert [(d.chain, d.found) for d in repaired] == [(chain, "drop")]


def test_without_netlink_the_full_sync_behaves_as_before(netns: str) -> None:
    h, kernel, chain = synced(netns)
    kernel.use_netlink = False
    assert kernel.generation() is None
    nft(netns, "insert", "rule", "ip", "kube-proxy", chain, "drop")
    assert [d.change for d in full_sync(h).repaired] == ["extra"]


def test_the_first_full_sync_after_a_start_reads_no_rules(netns: str) -> None:
    h, kernel, _ = started(netns)
    assert kernel.generations.ours == kernel.generation()
    assert not full_sync(h).repaired
    assert kernel.rules_listed() == []
    assert kernel.rule_reads == 0
    scale(h, 1, 2)  # kubeplex's own partial write keeps it so
    assert not h.backend.sync(h.cluster.checkout()).full
    assert not full_sync(h).repaired
    assert (kernel.rules_listed(), kernel.rule_reads) == ([], 0)


def test_a_restart_rewrites_what_another_writer_left_and_reads_no_rules(netns: str) -> None:
    _, _, chain = started(netns)
    nft(netns, "insert", "rule", "ip", "kube-proxy", chain, "drop")
    nft(netns, "add", "chain", "ip", "kube-proxy", "foreign")
    nft(netns, "add", "rule", "ip", "kube-proxy", "foreign", "drop")
    restarted, kernel, _ = started(netns)  # a new process over the tables left behind
    assert not full_sync(restarted).repaired
    assert (kernel.rules_listed(), kernel.rule_reads) == ([], 0)
    assert "drop" not in nft(netns, "list", "chain", "ip", "kube-proxy", chain)
    assert "chain foreign" not in nft(netns, "list", "table", "ip", "kube-proxy")


def test_after_a_start_a_foreign_rule_is_found_and_repaired(netns: str) -> None:
    h, kernel, chain = started(netns)
    nft(netns, "insert", "rule", "ip", "kube-proxy", chain, "drop")
    repaired = full_sync(h).repaired
    assert [(d.chain, d.change, d.found) for d in repaired] == [(chain, "extra", "drop")]
    assert "list table ip kube-proxy\n" in kernel.rules_listed()  # no record: listed whole
    assert "drop" not in nft(netns, "list", "chain", "ip", "kube-proxy", chain)
    # That sync made the record and read the generation: the next one reads nothing.
    kernel.listed.clear()
    kernel.dumps = 0
    assert not full_sync(h).repaired
    assert (kernel.rules_listed(), kernel.dumps) == ([], 0)


class InterruptedStart(Counting):
    """The real kernel; another writer commits once between the start's listing of the
    tables and its whole rewrite."""

    def run(self, text: str) -> None:
        if self.listed and not self.interrupted:
            self.interrupted = True
            nft(self.netns or "", "add", "table", "inet", "other")
        super().run(text)

    interrupted = False


def test_a_commit_between_the_starts_listing_and_its_rewrite_is_not_ours(netns: str) -> None:
    h, kernel, _ = started(netns, InterruptedStart(netns))
    assert isinstance(kernel, InterruptedStart) and kernel.interrupted
    assert kernel.generations.ours is None
    assert not full_sync(h).repaired
    assert "list table ip kube-proxy\n" in kernel.rules_listed()


class Staging(Counting):
    """The real kernel, counting the transactions sent in stages."""

    staged = 0

    def run_stages(self, texts: Sequence[str], empty_tables: bool = True) -> None:
        self.staged += len(texts)
        super().run_stages(texts, empty_tables)


def test_a_start_loaded_in_stages_reads_no_rules_either(
    netns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kubeplex.backends.nftables as backend_module

    monkeypatch.setattr(backend_module, "STAGE_LINES", 50)
    monkeypatch.setattr(backend_module, "STAGE_MIN_LINES", 0)
    h, kernel, _ = started(netns, Staging(netns))
    assert isinstance(kernel, Staging) and kernel.staged > 2
    assert not full_sync(h).repaired
    assert (kernel.rules_listed(), kernel.rule_reads) == ([], 0)
