"""The nftables backend's side-effect seam: ``nft -f -`` (through core.execer, in the netns).

Every sync is one ``nft -f -`` call: nft hands the whole input to the kernel as one batch,
committed atomically or not at all. Only on a full sync are object names listed, with
``nft -t list chains/sets/maps`` (chain headers without rules, sets without elements: a
fraction of ``list table``), to find leftovers of earlier runs and chains gone missing.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from kubeplex.backends.nftables import names
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


class NftKernel:
    def __init__(self, netns: str | None) -> None:
        self.netns = netns
        #: The nft executable (tests swap it for one that fails).
        self.nft_cmd = "nft"

    def run(self, text: str) -> None:
        """Apply ``text`` as one atomic transaction; BackendError if nft or the kernel refuse.

        The kernel names each anonymous set (every ``numgen ... vmap``) by scanning all sets of
        the table, so writing N services costs O(N^2): allow more time for big transactions.
        """
        timeout = 60.0 + text.count("\n") / 1000
        execer.run([self.nft_cmd, "-f", "-"], self.netns, input=text, timeout=timeout)

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
