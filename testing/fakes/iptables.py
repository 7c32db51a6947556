"""An in-memory iptables of both IP families, read and written as iptables-save/-restore text.

``FakeIptables`` models what ``iptables-restore --noflush`` and ``iptables-save`` do (as
iptables 1.8 with the nf_tables kernel API does them), at the level of rule text:

* Tables filter, nat, mangle, raw and security, each with its built-in chains. A table exists
  once an input wrote to it (as with iptables-nft); ``save`` prints the existing tables in the
  tool's order (mangle, security, raw, filter, nat), each with its built-in chains first and
  then its own chains sorted by name, rules in chain order.
* ``restore``: every ``*table ... COMMIT`` block commits on its own, in order; the first
  refused line stops the input, so the blocks committed before it stay and nothing of its own
  block is applied. ``:CHAIN - [0:0]`` creates a chain or flushes it (a built-in chain is not
  flushed; a policy other than ``-`` sets its policy); chains the input does not declare keep
  their rules and counters. ``-A``, ``-I CHAIN [N]``, ``-D CHAIN spec|N``, ``-R CHAIN N``,
  ``-N``, ``-F [CHAIN]``, ``-X CHAIN``, ``-P`` are understood; errors are those of the tool
  (a missing chain, a jump to a chain that does not exist, an insertion index too big, a
  deletion of a rule that is not there, ``-X`` of a chain that is referenced or not empty,
  a missing COMMIT).

What it cannot model: packets (no rule ever matches anything; set counters by hand with
``set_counters``), the meaning of matches and targets (any ``-m`` module and option is taken,
and a target is known if it is a chain of the table or an upper-case extension target such as
DNAT, MARK or MASQUERADE, in any table), and the tool's canonical rewriting of a rule, except
that ``-s``/``-d`` addresses without a prefix length get one (``/32``, ``/128``): a rule is
saved as it was written otherwise (``-p tcp --dport 80`` stays, where the tool prints
``-p tcp -m tcp --dport 80``). Error messages name the line that failed (the tool sometimes
names the next one). Rules are compared by their words for ``-D``.

Usage::

    from kubeplex.core.model.types import IPFamily
    from kubeplex.testing.fakes import FakeIptables

    ipt = FakeIptables(addresses=("10.0.0.1",))
    ipt.restore(
        IPFamily.IPv4, "*nat\\n:KUBE-SERVICES - [0:0]\\n-A OUTPUT -j KUBE-SERVICES\\nCOMMIT\\n"
    )
    assert "-A OUTPUT -j KUBE-SERVICES" in ipt.save(IPFamily.IPv4, "nat")
    ipt.set_counters(IPFamily.IPv4, "nat", "-A OUTPUT -j KUBE-SERVICES", packets=3, bytes=180)
    assert "[3:180] -A OUTPUT -j KUBE-SERVICES" in ipt.save(IPFamily.IPv4, counters=True)
    assert ipt.inputs(IPFamily.IPv4) == [...]  # every restore input received, refused ones too

Pass it as ``BackendContext(kernel=FakeIptables())`` to a backend whose seam is
``IptablesSeam`` (the iptables mode).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import ClassVar

from kubeplex.core.model.errors import BackendError
from kubeplex.core.model.types import IPFamily

#: Built-in chains of each table, in iptables-save's order; tables in its order too.
BUILTIN_CHAINS: dict[str, tuple[str, ...]] = {
    "mangle": ("PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"),
    "security": ("INPUT", "FORWARD", "OUTPUT"),
    "raw": ("PREROUTING", "OUTPUT"),
    "filter": ("INPUT", "FORWARD", "OUTPUT"),
    "nat": ("PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"),
}
#: Verdicts and extension targets taken without a chain of that name.
TARGETS = frozenset(
    {
        "ACCEPT", "DROP", "RETURN", "QUEUE", "NFQUEUE", "REJECT", "LOG", "NFLOG", "ULOG",
        "DNAT", "SNAT", "MASQUERADE", "REDIRECT", "NETMAP", "MARK", "CONNMARK", "CT",
        "NOTRACK", "TRACE", "TPROXY", "TCPMSS", "TOS", "TTL", "HL", "DSCP", "CLASSIFY",
        "CHECKSUM", "SET", "AUDIT", "IDLETIMER", "LED", "SECMARK", "CONNSECMARK", "SYNPROXY",
        "TEE", "HMARK", "RATEEST", "CLUSTERIP", "ECN",
    }
)  # fmt: skip
_COUNTED = re.compile(r"^\[(\d+):(\d+)\]\s+(.*)$")
_ADDR_OPTS = frozenset({"-s", "--source", "-d", "--destination"})


def _tool(family: IPFamily) -> str:
    return "ip6tables" if family is IPFamily.IPv6 else "iptables"


@dataclass
class Rule:
    """One rule: its words after ``-A CHAIN`` as written (canonical addresses), its counters."""

    spec: str
    packets: int = 0
    bytes: int = 0


@dataclass
class Chain:
    builtin: bool = False
    policy: str = "ACCEPT"
    rules: list[Rule] = field(default_factory=list)


@dataclass
class Table:
    chains: dict[str, Chain] = field(default_factory=dict)

    @classmethod
    def new(cls, name: str) -> Table:
        return cls({c: Chain(builtin=True) for c in BUILTIN_CHAINS[name]})

    def copy(self) -> Table:
        """A copy to change (rules are never changed in place, so they are shared)."""
        return Table({n: Chain(c.builtin, c.policy, list(c.rules)) for n, c in self.chains.items()})

    def referrers(self, chain: str) -> list[str]:
        """Chains with a rule that jumps or goes to ``chain``."""
        return [
            name
            for name, c in self.chains.items()
            if any(_target(r.spec) == chain for r in c.rules)
        ]


class Refused(Exception):
    """A refused line: the tool's stderr and exit status."""

    def __init__(self, stderr: str, status: int = 1) -> None:
        super().__init__(stderr)
        self.stderr = stderr
        self.status = status


def _target(spec: str) -> str | None:
    words = spec.split()
    for i, w in enumerate(words[:-1]):
        if w in ("-j", "--jump", "-g", "--goto"):
            return words[i + 1]
    return None


#: A word of a rule: a double-quoted string (with its escapes) or a run of non-blanks.
_WORD = re.compile(r'"(?:[^"\\]|\\.)*"|\S+')
#: What iptables-save prints of a string without quotes (xtables_save_string).
_PLAIN = re.compile(r"^[A-Za-z0-9_-]+$")


def _words(spec: str) -> list[str]:
    return _WORD.findall(spec)


def _canonical(spec: str, family: IPFamily) -> str:
    """The rule as iptables-save prints it, as far as modelled: prefix lengths on addresses,
    comments quoted unless they are one plain word."""
    words = _words(spec)
    bits = "128" if family is IPFamily.IPv6 else "32"
    for i in range(1, len(words)):
        w, before = words[i], words[i - 1]
        if before in _ADDR_OPTS and "/" not in w and "," not in w:
            words[i] = f"{w}/{bits}"
        elif before == "--comment":
            inner = w[1:-1] if len(w) > 1 and w[0] == w[-1] == '"' else w
            words[i] = inner if _PLAIN.match(inner) else f'"{inner}"'
    return " ".join(words)


class _Restore:
    """One restore input applied to a copy of a family's tables, block by block."""

    def __init__(self, tool: str, family: IPFamily, tables: dict[str, Table]) -> None:
        self.tool = tool
        self.family = family
        self.tables = tables
        self.lineno = 0

    def fail(self, message: str, status: int = 1) -> Refused:
        return Refused(f"{self.tool}: line {self.lineno} failed: {message}", status)

    def bad(self, message: str, versioned: bool = True) -> Refused:
        head = f"{self.tool} v1.8.9 (nf_tables): " if versioned else ""
        return Refused(
            f"{head}{message}\nError occurred at line: {self.lineno}\n"
            f"Try `{self.tool} -h' or '{self.tool} --help' for more information.",
            2,
        )

    def run(self, text: str) -> None:
        """Apply ``text``; committed blocks stay in ``self.tables`` even if a later one fails."""
        name: str | None = None
        work: Table | None = None
        touched = False
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        for self.lineno, raw in enumerate(lines, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("*"):
                if name is not None:
                    raise self.bad(f"Bad argument `{line}'", versioned=False)
                name = line[1:].strip()
                if name not in BUILTIN_CHAINS:
                    raise self.bad(f"{self.tool}: line {self.lineno} table name '{name}' invalid")
                have = self.tables.get(name)
                work = have.copy() if have is not None else Table.new(name)
                touched = False
                continue
            if line == "COMMIT":
                if name is None or work is None:
                    raise self.fail("COMMIT without a table")
                if touched or name in self.tables:
                    self.tables[name] = work
                name, work = None, None
                continue
            if work is None:
                raise self.fail("no table selected")
            self.command(work, line)
            touched = True
        if name is not None:
            raise Refused(f"{self.tool}: COMMIT expected at line {len(lines) + 1}", 1)

    def chain(self, table: Table, name: str) -> Chain:
        c = table.chains.get(name)
        if c is None:
            raise self.fail("No chain/target/match by that name.")
        return c

    def rule(self, table: Table, spec: str) -> Rule:
        packets = nbytes = 0
        words = spec.split()
        if "-c" in words:  # inline counters: -c PACKETS BYTES
            i = words.index("-c")
            try:
                packets, nbytes = int(words[i + 1]), int(words[i + 2])
            except (IndexError, ValueError) as err:
                raise self.bad("-c packet counter not numeric") from err
            spec = " ".join(words[:i] + words[i + 3 :])
        target = _target(spec)
        if target is not None and target not in TARGETS and target not in table.chains:
            raise self.bad(f"Chain '{target}' does not exist")
        return Rule(_canonical(spec, self.family), packets, nbytes)

    def command(self, table: Table, line: str) -> None:
        if m := _COUNTED.match(line):
            line = m.group(3)  # [packets:bytes] are only restored with -c, which is not used
        if line.startswith(":"):
            parts = line[1:].split()
            if not parts:
                raise self.bad(f"Bad argument `{line}'")
            name, policy = parts[0], parts[1] if len(parts) > 1 else "-"
            existing = table.chains.get(name)
            if existing is not None and existing.builtin:
                if policy != "-":
                    existing.policy = policy
            elif existing is not None:
                existing.rules.clear()
            else:
                table.chains[name] = Chain()
            return
        words = _words(line)
        op, args = words[0], words[1:]
        rest = line.split(None, 2)[2] if len(words) > 2 else ""
        if op in ("-A", "--append") and args:
            self.chain(table, args[0]).rules.append(self.rule(table, rest))
        elif op in ("-I", "--insert") and args:
            chain = self.chain(table, args[0])
            pos, spec = 1, rest
            head = rest.split(None, 1)
            if head and head[0].isdigit():
                pos, spec = int(head[0]), head[1] if len(head) > 1 else ""
            if pos < 1 or pos > len(chain.rules) + 1:
                raise self.fail("Index of insertion too big.")
            chain.rules.insert(pos - 1, self.rule(table, spec))
        elif op in ("-D", "--delete") and args:
            chain = self.chain(table, args[0])
            if rest.isdigit():
                if not 1 <= int(rest) <= len(chain.rules):
                    raise self.fail("Index of deletion too big.")
                del chain.rules[int(rest) - 1]
                return
            want = _canonical(rest, self.family).split()
            for i, r in enumerate(chain.rules):
                if r.spec.split() == want:
                    del chain.rules[i]
                    return
            raise self.fail("Bad rule (does a matching rule exist in that chain?).")
        elif op in ("-R", "--replace") and len(args) > 1 and args[1].isdigit():
            chain = self.chain(table, args[0])
            pos = int(args[1])
            if not 1 <= pos <= len(chain.rules):
                raise self.fail("Index of replacement too big.")
            chain.rules[pos - 1] = self.rule(table, rest.split(None, 1)[1] if " " in rest else "")
        elif op in ("-N", "--new-chain") and len(args) == 1:
            if args[0] in table.chains:
                raise self.fail("Chain already exists.")
            table.chains[args[0]] = Chain()
        elif op in ("-F", "--flush"):
            for c in [self.chain(table, a) for a in args] or table.chains.values():
                c.rules.clear()
        elif op in ("-X", "--delete-chain") and len(args) == 1:
            chain = self.chain(table, args[0])
            if chain.builtin:
                raise self.fail("Cannot delete built-in chain.")
            if chain.rules or table.referrers(args[0]):
                raise Refused(
                    f"{self.tool} v1.8.9 (nf_tables): \nline {self.lineno}: CHAIN_DEL failed"
                    f" (Device or resource busy): chain {args[0]}",
                    4,
                )
            del table.chains[args[0]]
        elif op in ("-P", "--policy") and len(args) == 2:
            chain = self.chain(table, args[0])
            if not chain.builtin:
                raise self.fail("Bad built-in chain name.")
            chain.policy = args[1]
        else:
            raise self.bad(f"Bad argument `{words[0]}'", versioned=False)


class FakeIptables:
    """The ``IptablesSeam`` of a node, both families, in memory (see the module docstring).

    ``addresses`` are what ``interface_addresses`` reports; ``nfacct`` says whether nfacct
    counters can be made (``ensure_nfacct``). Everything received is in ``log``.
    """

    writes: ClassVar[tuple[str, ...]] = ("restore",)

    def __init__(self, addresses: tuple[str, ...] = (), nfacct: bool = True) -> None:
        self.tables: dict[IPFamily, dict[str, Table]] = {f: {} for f in IPFamily}
        self.addresses = addresses
        self.nfacct_supported = nfacct
        #: nfacct counters by name: packets.
        self.nfacct: dict[str, int] = {}
        self.sysctls: dict[str, str] = {}
        #: Every restore input, in order: (family, text, refused).
        self.log: list[tuple[IPFamily, str, bool]] = []

    # --- the seam ---------------------------------------------------------------------------

    def restore_command(self, family: IPFamily) -> str:
        return f"{_tool(family)}-restore"

    def restore(self, family: IPFamily, text: str) -> None:
        """``iptables-restore --noflush``: BackendError with the tool's message if refused."""
        tool = self.restore_command(family)
        try:
            _Restore(tool, family, self.tables[family]).run(text)
        except Refused as err:
            self.log.append((family, text, True))
            raise BackendError(
                f"{tool} --noflush failed (exit {err.status}): {err.stderr}", families=(family,)
            ) from None
        self.log.append((family, text, False))

    def save(self, family: IPFamily, table: str | None = None, counters: bool = False) -> str:
        """iptables-save's output (``-t table``, ``-c``), without its date comments."""
        tables = self.tables[family]
        if table is not None:
            if table not in BUILTIN_CHAINS:
                raise BackendError(
                    f"{_tool(family)}-save -t failed (exit 1): Table `{table}' does not exist"
                )
            # The tool prints a table it is asked for even if nothing made it yet.
            names = [table]
            shown = {table: tables.get(table) or Table.new(table)}
        else:
            names = [t for t in BUILTIN_CHAINS if t in tables]
            shown = tables
        out: list[str] = []
        for name in names:
            t = shown[name]
            order = [c for c in BUILTIN_CHAINS[name] if c in t.chains]
            order += sorted(c for c, chain in t.chains.items() if not chain.builtin)
            out.append(f"# Generated by {_tool(family)}-save v1.8.9 (nf_tables)")
            out.append(f"*{name}")
            for c in order:
                chain = t.chains[c]
                policy = chain.policy if chain.builtin else "-"
                out.append(f":{c} {policy} [0:0]")
            for c in order:
                for r in t.chains[c].rules:
                    count = f"[{r.packets}:{r.bytes}] " if counters else ""
                    out.append(f"{count}-A {c} {r.spec}".rstrip())
            out.append("COMMIT")
            out.append("# Completed")
        return "\n".join(out) + "\n" if out else ""

    def interface_addresses(self) -> tuple[str, ...]:
        return self.addresses

    def sysctl(self, key: str, value: str) -> None:
        self.sysctls[key] = value

    def ensure_nfacct(self, counters: tuple[str, ...]) -> frozenset[str]:
        if not self.nfacct_supported:
            return frozenset()
        for name in counters:
            self.nfacct.setdefault(name, 0)
        return frozenset(counters)

    def read_nfacct(self, name: str) -> int | None:
        return self.nfacct.get(name)

    # --- for tests --------------------------------------------------------------------------

    def inputs(self, family: IPFamily | None = None) -> list[str]:
        """The restore inputs received (of ``family``, or all), refused ones included."""
        return [text for fam, text, _ in self.log if family is None or fam is family]

    def rules(self, family: IPFamily, table: str, chain: str) -> list[str]:
        """The rules of one chain as save prints them (``-A CHAIN ...``); KeyError if absent."""
        return [f"-A {chain} {r.spec}" for r in self.tables[family][table].chains[chain].rules]

    def chains(self, family: IPFamily, table: str) -> set[str]:
        """The chains of a table (none if the table does not exist)."""
        t = self.tables[family].get(table)
        return set(t.chains) if t is not None else set()

    def set_counters(
        self, family: IPFamily, table: str, rule: str, packets: int, bytes: int = 0
    ) -> None:
        """Set the counters of the first rule saved as ``rule`` (``-A CHAIN ...``): what the
        kernel would have counted. KeyError if there is no such rule."""
        chain_name = rule.split()[1]
        spec = rule.split(None, 2)[2] if len(rule.split()) > 2 else ""
        chain = self.tables[family][table].chains[chain_name]
        for r in chain.rules:
            if r.spec.split() == spec.split():
                r.packets, r.bytes = packets, bytes
                return
        raise KeyError(rule)
