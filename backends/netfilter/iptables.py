"""The iptables-save / iptables-restore seam every netfilter backend shares.

``IptablesKernel`` is one IP family's iptables: ``save`` (parsed into a ``SavedRuleset``),
``restore --noflush``, and the few node reads and writes the rules depend on (interface
addresses, sysctls, nfacct counters). The iptables mode programs everything through it, and the
IPVS mode its fixed chains; tests and plugin authors pass ``kubeplex.testing.fakes`` instead.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from kubeplex.core.dataplane import execer
from kubeplex.core.model.types import IPFamily, normalize_ip

#: Rules per iptables-restore input before a large write is split (iptables-nft-restore slows
#: down with the square of one input's size: 32k rules 4.2 s in one input, 0.8 s in eight).
BATCH_RULES = 4000

_TABLE = re.compile(r"^\*(\S+)")
_CHAIN = re.compile(r"^:(\S+) ")


@dataclass
class SavedRuleset:
    """What iptables-save shows: chains per table, and the rule lines."""

    chains: dict[str, set[str]] = field(default_factory=dict)
    rules: dict[str, list[str]] = field(default_factory=dict)

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

    def has_jump(self, table: str, chain: str, comment: str, target: str) -> bool:
        head = f"-A {chain} "
        if not comment:
            return f"{head}-j {target}" in self.rules.get(table, [])
        return any(
            r.startswith(head) and f'"{comment}"' in r and r.endswith(f"-j {target}")
            for r in self.rules.get(table, [])
        )


class IptablesKernel:
    def __init__(self, family: IPFamily, netns: str | None, restore_wait: int = 5) -> None:
        self.family = family
        self.netns = netns
        prefix = "ip6tables" if family is IPFamily.IPv6 else "iptables"
        self.save_cmd = f"{prefix}-save"
        self.restore_cmd = f"{prefix}-restore"
        self.restore_wait = restore_wait

    def save(self, table: str | None = None) -> SavedRuleset:
        argv = [self.save_cmd] + (["-t", table] if table else [])
        return SavedRuleset.parse(execer.run(argv, self.netns).stdout)

    def restore(self, text: str) -> None:
        execer.run(
            [self.restore_cmd, "--noflush", "--wait", str(self.restore_wait)],
            self.netns,
            input=text,
        )

    def interface_addresses(self) -> tuple[str, ...]:
        """Every address on the node's interfaces (where NodePorts can be reached)."""
        out = execer.run(["ip", "-j", "address", "show"], self.netns).stdout
        return tuple(
            normalize_ip(a["local"])
            for link in json.loads(out or "[]")
            for a in link.get("addr_info", [])
            if "local" in a
        )

    def sysctl(self, key: str, value: str) -> None:
        """Set a sysctl only if it differs: /proc/sys may be read-only to an unprivileged proxy
        whose init container already set it."""
        current = execer.run(["sysctl", "-n", key], self.netns, check=False).stdout.strip()
        if current != value:
            execer.run(["sysctl", "-q", "-w", f"{key}={value}"], self.netns)

    def ensure_nfacct(self, counters: tuple[str, ...]) -> frozenset[str]:
        """Create missing nfacct counters; returns those that exist (none where nfacct is
        unsupported). As upstream's Ensure: look first, add only what is missing. `nfacct add`
        of an existing counter fails with EBUSY, which must not read as "unsupported" (a
        restart would drop the rules' nfacct matches)."""
        have = set()
        for name in counters:
            if not self._nfacct_exists(name):
                execer.run(["nfacct", "add", name], self.netns, check=False)
                if not self._nfacct_exists(name):  # refused, not merely raced
                    continue
            have.add(name)
        return frozenset(have)

    def _nfacct_exists(self, name: str) -> bool:
        return execer.run(["nfacct", "get", name], self.netns, check=False).returncode == 0
