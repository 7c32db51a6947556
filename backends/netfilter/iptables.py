"""The iptables-save / iptables-restore seam every netfilter backend shares.

``IptablesSeam`` is a node's iptables, both IP families, at the text level: ``save`` (the
tool's output; ``SavedRuleset.parse`` reads it), ``restore --noflush``, and the few node reads
and writes the rules depend on (interface addresses, sysctls, nfacct counters). ``Iptables``
is the real one; the iptables mode programs everything through a seam, and the IPVS mode its
fixed chains; tests and plugin authors pass ``kubeplex.testing.fakes.FakeIptables`` instead.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from kubeplex.backends.netfilter.nfacct import Nfacct, NfacctError
from kubeplex.core.dataplane import execer
from kubeplex.core.model.types import IPFamily, normalize_ip

log = logging.getLogger(__name__)

#: Rules per iptables-restore input before a large write is split (iptables-nft-restore slows
#: down with the square of one input's size).
BATCH_RULES = 4000

_TABLE = re.compile(r"^\*(\S+)")
_CHAIN = re.compile(r"^:(\S+) ")
#: A rule of ``iptables-save -c``: ``[pkts:bytes] -A CHAIN ...``.
_COUNTED = re.compile(r"^\[(\d+):(\d+)\] (-A .*)$")


class IptablesSeam(Protocol):
    """A node's iptables (both families) as text, the way the tools read and print it."""

    #: The methods through which a sync writes.
    writes: ClassVar[tuple[str, ...]]

    def save(self, family: IPFamily, table: str | None = None, counters: bool = False) -> str:
        """``iptables-save`` (``-t table``) (``-c``) output of ``family``."""
        ...

    def restore(self, family: IPFamily, text: str) -> None:
        """``iptables-restore --noflush``; BackendError (with the tool's stderr) if refused.
        Each ``*table ... COMMIT`` block commits on its own, in order."""
        ...

    def restore_command(self, family: IPFamily) -> str:
        """The restore tool's name, for messages."""
        ...

    def interface_addresses(self) -> tuple[str, ...]:
        """Every address on the node's interfaces (where NodePorts can be reached)."""
        ...

    def sysctl(self, key: str, value: str) -> None:
        """Set a sysctl if it differs."""
        ...

    def ensure_nfacct(self, counters: tuple[str, ...]) -> frozenset[str]:
        """Create missing nfacct counters; those that exist afterwards."""
        ...

    def read_nfacct(self, name: str) -> int | None:
        """Packets of nfacct counter ``name``; None if it cannot be read."""
        ...


@dataclass
class SavedRuleset:
    """What iptables-save shows: chains per table, and the rule lines (``-A ...``, without
    counters). With ``-c`` output, ``counters`` holds each rule's (packets, bytes), in the
    order of ``rules``."""

    chains: dict[str, set[str]] = field(default_factory=dict)
    rules: dict[str, list[str]] = field(default_factory=dict)
    counters: dict[str, list[tuple[int, int]]] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> SavedRuleset:
        saved = cls()
        table = ""
        for line in text.splitlines():
            if m := _TABLE.match(line):
                table = m.group(1)
                saved.chains.setdefault(table, set())
                saved.rules.setdefault(table, [])
            elif m := _CHAIN.match(line):
                saved.chains[table].add(m.group(1))
            elif line.startswith("-A "):
                saved.rules[table].append(line)
            elif m := _COUNTED.match(line):
                saved.rules[table].append(m.group(3))
                saved.counters.setdefault(table, []).append((int(m.group(1)), int(m.group(2))))
        return saved

    def by_chain(self) -> dict[str, dict[str, list[str]]]:
        """Per table, every chain iptables-save showed -> its rules."""
        out: dict[str, dict[str, list[str]]] = {}
        for table, chains in self.chains.items():
            rules: dict[str, list[str]] = {c: [] for c in chains}
            for rule in self.rules.get(table, []):
                rules.setdefault(rule.split(" ", 2)[1], []).append(rule)
            out[table] = rules
        return out

    def counted(self, table: str) -> list[tuple[str, tuple[int, int] | None]]:
        """The rules of ``table`` with their (packets, bytes), None without ``-c``."""
        rules = self.rules.get(table, [])
        counts = self.counters.get(table, [])
        if len(counts) != len(rules):
            return [(r, None) for r in rules]
        return list(zip(rules, counts, strict=True))

    def has_jump(self, table: str, chain: str, comment: str, target: str) -> bool:
        head = f"-A {chain} "
        if not comment:
            return f"{head}-j {target}" in self.rules.get(table, [])
        return any(
            r.startswith(head) and f'"{comment}"' in r and r.endswith(f"-j {target}")
            for r in self.rules.get(table, [])
        )


def tool(family: IPFamily) -> str:
    """``iptables`` or ``ip6tables``."""
    return "ip6tables" if family is IPFamily.IPv6 else "iptables"


class Iptables:
    """The node's real iptables, in network namespace ``netns`` (None: the host's)."""

    writes: ClassVar[tuple[str, ...]] = ("restore",)

    def __init__(self, netns: str | None = None, restore_wait: int = 5) -> None:
        self.netns = netns
        self.restore_wait = restore_wait
        self._nfacct = Nfacct(netns)

    def save(self, family: IPFamily, table: str | None = None, counters: bool = False) -> str:
        argv = [f"{tool(family)}-save", *(["-t", table] if table else [])]
        return execer.run(argv + (["-c"] if counters else []), self.netns).stdout

    def restore(self, family: IPFamily, text: str) -> None:
        argv = [self.restore_command(family), "--noflush", "--wait", str(self.restore_wait)]
        execer.run(argv, self.netns, input=text)

    def restore_command(self, family: IPFamily) -> str:
        return f"{tool(family)}-restore"

    def interface_addresses(self) -> tuple[str, ...]:
        out = execer.run(["ip", "-j", "address", "show"], self.netns).stdout
        return tuple(
            normalize_ip(a["local"])
            for link in json.loads(out or "[]")
            for a in link.get("addr_info", [])
            if "local" in a
        )

    def sysctl(self, key: str, value: str) -> None:
        """Only if it differs: /proc/sys may be read-only to an unprivileged proxy whose init
        container already set it."""
        current = execer.run(["sysctl", "-n", key], self.netns, check=False).stdout.strip()
        if current != value:
            execer.run(["sysctl", "-q", "-w", f"{key}={value}"], self.netns)

    def ensure_nfacct(self, counters: tuple[str, ...]) -> frozenset[str]:
        """As upstream's Ensure, over netlink: each counter is created unless it exists (then
        it keeps its counts). Those that exist afterwards; none where the kernel has no nfacct
        (the rules then match without it)."""
        have = set()
        for name in counters:
            try:
                self._nfacct.ensure(name)
            except NfacctError as err:
                log.debug("nfacct counter %s unavailable: %s", name, err)
                continue
            have.add(name)
        return frozenset(have)

    def read_nfacct(self, name: str) -> int | None:
        try:
            return self._nfacct.packets(name)
        except NfacctError:
            return None
