"""The nftables backend's side-effect seam: every transaction straight over netlink, or through
``nft -f -`` (core.execer, in the netns) when it holds a command the encoder does not know.

Every sync is one transaction: one batch, committed atomically or not at all (but the first
load of tables created empty, and the new chains of a burst of Services, which ``run_stages``
commits in pieces no packet reaches before the last). ``netlink`` encodes what the renderer
writes (the table, base chains, sets and maps, every rule of the fixed chains and of services,
elements, flushes, deletions) as the very messages nft would send, and skips nft's parser (a
third of a first sync's time) and its cache fetch (O(chains^2) per call). What it does not
encode (a set of several source ranges, for one) goes to nft. ``list`` runs nft's list commands
and returns its text (listing.py parses it).

``NftSeam`` is what the backend needs of a kernel: the real ``NftKernel`` or an in-memory fake.
"""

from __future__ import annotations

import builtins
import logging
import threading
from collections.abc import Callable, Collection, Sequence
from typing import ClassVar, Protocol

from kubeplex.backends.netfilter import nft
from kubeplex.backends.nftables import names, netlink
from kubeplex.backends.nftables.fingerprints import Fingerprints
from kubeplex.backends.nftables.generation import GenerationGate
from kubeplex.core.model.errors import BackendError

log = logging.getLogger(__name__)

#: The nft executable that the netlink path stands in for.
NFT = nft.NFT


class NftSeam(Protocol):
    """The nftables kernel as the backend sees it: transactions in, listings out."""

    #: The methods through which ``apply`` writes.
    writes: ClassVar[tuple[str, ...]]

    def run(self, text: str) -> None:
        """One atomic transaction in ``nft -f`` syntax; BackendError if refused (nothing
        applied)."""

    def run_stages(self, texts: Sequence[str], empty_tables: bool = True) -> None:
        """Several transactions in order, stopping at the first refused (BackendError).
        ``empty_tables``: the first one creates the tables, which had nothing yet."""

    def list(self, commands: str, terse: bool = False) -> str:
        """The output of ``nft [-t] -f -`` for list commands ("list tables", "list table ip
        kube-proxy", "list chains ip", ...), as nft prints it; BackendError if nft fails (a
        missing table, for one)."""
        return ""


class NftKernel:
    """The node's nftables (in ``netns``): netlink where it can, ``nft -f -`` otherwise."""

    writes: ClassVar[tuple[str, ...]] = ("run", "run_stages")

    def __init__(self, netns: str | None) -> None:
        self.netns = netns
        #: The nft executable (tests swap it for one that fails). Any other than the default
        #: also turns the netlink path off: every transaction then goes through it.
        self.nft_cmd = NFT
        #: Send what ``netlink`` can encode over netlink (False: always ``nft -f``).
        self.use_netlink = True
        self._netlink: netlink.NftNetlink | None = None
        #: How the last transaction went: "netlink" or "nft" (for logs, tests and benchmarks).
        self.last_path = ""
        #: The ruleset generation at which kubeplex last saw its tables (generation.py).
        self.generations = GenerationGate()

    def run(self, text: str) -> None:
        """Apply ``text`` as one atomic transaction; BackendError if nft or the kernel refuse."""
        self._followed(1, lambda: self._run(text))

    def run_stages(self, texts: Sequence[str], empty_tables: bool = True) -> None:
        """Several transactions in order, stopping at the first one refused (BackendError):
        the first load of tables created empty, or (``empty_tables=False``) new services'
        chains ahead of a big sync's last transaction (``_run_stages``)."""
        self._followed(len(texts), lambda: self._run_stages(texts, empty_tables))

    def _followed(self, commits: int, write: Callable[[], None]) -> None:
        """``write``, which commits ``commits`` transactions, with the ruleset generation read
        before and after it (only while the gate holds a generation of ours: else it could
        not keep one)."""
        before = self.generation() if self.generations.following else None
        try:
            write()
        except BaseException:
            self.generations.forget()  # how many were committed is not known
            raise
        after = self.generation() if before is not None else None
        self.generations.wrote(before, after, commits)

    def generation(self) -> int | None:
        """The ruleset generation of the netns over netlink; None without netlink, or if the
        read fails."""
        if not (self.use_netlink and self.nft_cmd == NFT):
            return None
        if self._netlink is None:
            self._netlink = netlink.NftNetlink(self.netns)
        try:
            return self._netlink.generation()
        except (OSError, netlink.NetlinkError) as err:
            log.debug("reading the nftables ruleset generation failed: %s", err)
            self.close()
            return None

    def _run(self, text: str) -> None:
        """``run`` without the generation reads.

        The kernel binds each anonymous set (every ``numgen ... vmap``) by walking the whole
        transaction, and names it by scanning every set of the table, so writing N services in
        one transaction costs O(N^2): allow more time for big transactions.
        """
        if self.use_netlink and self.nft_cmd == NFT:
            messages = self._compile(text)
            if messages is not None and self._run_netlink(messages):
                return
        self.last_path = "nft"
        nft.run_transaction(text, self.netns, self.nft_cmd)

    def _run_stages(self, texts: Sequence[str], empty_tables: bool) -> None:
        """``run_stages`` without the generation reads. Over netlink, each one is encoded
        while the kernel commits the one before (the socket's send releases the GIL, and the
        kernel commits inside it), and anonymous maps are named here, not by the kernel (which
        scans every set of the table for each): into empty tables from 0, into tables that
        exist above every number in use."""
        if not (self.use_netlink and self.nft_cmd == NFT):
            for text in texts:
                self._run(text)
            return
        failed: list[BaseException] = []
        sender: threading.Thread | None = None
        # Anonymous maps named here: only while no stage went through nft, whose maps the
        # kernel numbers (it would pick the names this counter is yet to give).
        anonymous_names = {} if empty_tables else self._anonymous_numbers_above()

        def send(text: str, messages: list[netlink.Message] | None) -> None:
            try:
                if messages is None or not self._run_netlink(messages):
                    self._run(text)
            except BaseException as err:  # handed to the caller's thread
                failed.append(err)

        for text in texts:
            messages = self._compile(text, anonymous_names)
            if messages is None:
                anonymous_names = None
            if sender is not None:
                sender.join()
            if failed:
                raise failed[0]
            sender = threading.Thread(target=send, args=(text, messages), name="nft-stage")
            sender.start()
        if sender is not None:
            sender.join()
        if failed:
            raise failed[0]

    @staticmethod
    def _compile(
        text: str, anonymous_names: dict[int, int] | None = None
    ) -> builtins.list[netlink.Message] | None:
        try:
            return netlink.compile_transaction(text, anonymous_names)
        except netlink.Unsupported as err:
            log.debug("nftables transaction through nft (not encoded here: %s)", err)
            return None

    def _anonymous_numbers_above(self) -> dict[int, int] | None:
        """Per family, the number above every anonymous map's (``__map<N>``) in the
        kube-proxy tables; None if they cannot be listed (the kernel numbers them then)."""
        if self._netlink is None:
            self._netlink = netlink.NftNetlink(self.netns)
        out = {}
        try:
            for family in ("ip", "ip6"):
                found = self._netlink.set_names(family, names.TABLE)
                numbers = [int(n[5:]) for n in found if n[:5] == "__map" and n[5:].isdigit()]
                out[netlink.FAMILIES[family]] = max(numbers, default=-1) + 1
        except (OSError, netlink.NetlinkError) as err:
            log.debug("listing the nftables sets failed (%s): the kernel names maps", err)
            self.close()
            return None
        return out

    def _run_netlink(self, messages: builtins.list[netlink.Message]) -> bool:
        """Send the batch; False if no socket can be had (then nft does it, from now on)."""
        if self._netlink is None:
            self._netlink = netlink.NftNetlink(self.netns)
        try:
            self._netlink.connect()
        except OSError as err:
            log.warning("no netlink socket for nftables, using nft for every sync: %s", err)
            self.use_netlink = False
            self.close()
            return False
        self.last_path = "netlink"
        try:
            self._netlink.apply(messages)
        except netlink.NetlinkError as err:
            raise BackendError(f"nftables netlink batch failed: {err}") from err
        return True

    def _netlink_tables(self) -> builtins.list[tuple[str, str]] | None:
        """The tables over netlink; None if the socket or the dump fails (nft is asked)."""
        if self._netlink is None:
            self._netlink = netlink.NftNetlink(self.netns)
        try:
            return self._netlink.tables()
        except (OSError, netlink.NetlinkError) as err:
            log.debug("listing nftables tables over netlink failed (%s): asking nft", err)
            self.close()
            return None

    def rule_fingerprints(
        self, family: str, chains: Collection[str] | None = None
    ) -> Fingerprints | None:
        """The kube-proxy table's rules by chain, undecoded (fingerprints.py), from one netlink
        dump of the table or one per chain of ``chains``; None without netlink, or if a dump
        fails (the caller lists them through nft)."""
        if not (self.use_netlink and self.nft_cmd == NFT):
            return None
        if self._netlink is None:
            self._netlink = netlink.NftNetlink(self.netns)
        out: Fingerprints = {}
        try:
            for chain in [None] if chains is None else chains:
                found = self._netlink.rules(family, names.TABLE, chain)
                out.update((c, tuple(rules)) for c, rules in found.items())
        except (OSError, netlink.NetlinkError) as err:
            log.debug("dumping the nftables rules failed (%s): nft lists them", err)
            self.close()
            return None
        return out

    def close(self) -> None:
        if self._netlink is not None:
            self._netlink.close()
            self._netlink = None

    def list(self, commands: str, terse: bool = False) -> str:
        """``nft [-t] -f -`` with ``commands`` (list commands only): what nft prints.
        ``list tables`` alone is answered from one netlink dump where netlink is used: nft
        builds its whole cache for it (0.3 s with 1,000 Services' rules loaded)."""
        if commands == "list tables\n" and self.use_netlink and self.nft_cmd == NFT:
            tables = self._netlink_tables()
            if tables is not None:
                return "".join(f"table {family} {name}\n" for family, name in tables)
        return nft.run_listing(commands, self.netns, terse, self.nft_cmd)
