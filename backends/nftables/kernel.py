"""The nftables backend's side-effect seam: ``nft -f -`` (through core.execer, in the netns),
or the same batch straight over netlink.

Every sync is one transaction: one batch, committed atomically or not at all. A transaction
made only of the commands ``netlink`` encodes (what partial syncs write: service chains and
their rules, affinity sets, elements, deletions) goes over a netlink socket kept open in the
netns, as the very messages nft would send; anything else (full syncs: base chains, set and map
definitions, flushes) goes through ``nft -f -``. Only on a full sync are object names listed,
with ``nft -t list chains/sets/maps`` (chain headers without rules, sets without elements: a
fraction of ``list table``), to find leftovers of earlier runs and chains gone missing.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from kubeplex.backends.nftables import names, netlink
from kubeplex.core import execer
from kubeplex.core.errors import BackendError

log = logging.getLogger(__name__)

_TABLE = re.compile(r"^table (ip6?) (\S+) \{$")
_OBJECT = re.compile(r"^\s+(chain|set|map) (\S+) \{$")


@dataclass
class TableObjects:
    """Names of the chains, sets and maps of one ``kube-proxy`` table."""

    chains: set[str] = field(default_factory=set)
    sets: set[str] = field(default_factory=set)
    maps: set[str] = field(default_factory=set)


def parse_listing(text: str) -> dict[str, TableObjects]:
    """``nft -t list chains/sets/maps`` output -> the kube-proxy table's objects by family."""
    found: dict[str, TableObjects] = {}
    current: TableObjects | None = None
    for line in text.splitlines():
        if m := _TABLE.match(line):
            current = (
                found.setdefault(m.group(1), TableObjects()) if m.group(2) == names.TABLE else None
            )
        elif current is not None and (m := _OBJECT.match(line)):
            kind, name = m.groups()
            {"chain": current.chains, "set": current.sets, "map": current.maps}[kind].add(name)
    return found


#: Transactions longer than this go through nft (a partial sync this big is rare, and nft's
#: cache fetch is then a small part of its cost).
NETLINK_MAX_LINES = 20_000
#: The nft executable that the netlink path stands in for.
NFT = "nft"


class NftKernel:
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

    def run(self, text: str, bulk: bool = False) -> None:
        """Apply ``text`` as one atomic transaction; BackendError if nft or the kernel refuse.

        ``bulk``: always through nft (its parser beats this module's encoder on volume, and the
        cache it fetches is small while a table is being built).

        The kernel binds each anonymous set (every ``numgen ... vmap``) by walking the whole
        transaction, and names it by scanning every set of the table, so writing N services in
        one transaction costs O(N^2): allow more time for big transactions.
        """
        lines = text.count("\n")
        if not bulk and self.use_netlink and self.nft_cmd == NFT and lines <= NETLINK_MAX_LINES:
            try:
                messages = netlink.compile_transaction(text)
            except netlink.Unsupported:
                pass
            else:
                if self._run_netlink(messages):
                    return
        self.last_path = "nft"
        timeout = 60.0 + lines / 1000
        execer.run([self.nft_cmd, "-f", "-"], self.netns, input=text, timeout=timeout)

    def _run_netlink(self, messages: list[netlink.Message]) -> bool:
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

    def close(self) -> None:
        if self._netlink is not None:
            self._netlink.close()
            self._netlink = None

    def list_objects(self, families: Iterable[str]) -> dict[str, TableObjects] | None:
        """Chains, sets and maps of ``<family> kube-proxy`` ("ip", "ip6"), by family (absent:
        no such table); None if listing fails."""
        commands = "".join(
            f"list chains {fam}\nlist sets {fam}\nlist maps {fam}\n" for fam in families
        )
        try:
            proc = execer.run([self.nft_cmd, "-t", "-f", "-"], self.netns, input=commands)
        except BackendError as err:
            log.error("listing nftables objects failed, leftovers stay: %s", err)
            return None
        return parse_listing(proc.stdout)

    def delete_tables(self, families: Iterable[str]) -> None:
        """Remove ``<family> kube-proxy`` tables (adding each first: deleting a missing table
        would fail the transaction)."""
        text = "".join(
            f"add table {fam} {names.TABLE}\ndelete table {fam} {names.TABLE}\n" for fam in families
        )
        execer.run([self.nft_cmd, "-f", "-"], self.netns, input=text)
