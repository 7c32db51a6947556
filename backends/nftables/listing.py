"""Reading back what nft lists: object names for a full sync, whole tables for ``inspect``
and for drift (``rule_key``: when a rule as rendered and as nft lists it are the same).

The kernel seam returns nft's own text (``NftSeam.list``); everything that understands it is
here, on the backend's side, so that a fake kernel only has to print what nft prints.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from kubeplex.backends.nftables import names
from kubeplex.core.dataplane.backend import RuleDrift
from kubeplex.core.dataplane.drift import diff_chains

_TABLE = re.compile(r"^table (ip6?) (\S+) \{$")
_TABLE_LINE = re.compile(r"^table (\S+) (\S+)(?: \{)?$")
_OBJECT = re.compile(r"^\s+(chain|set|map) (\S+) \{$")
_DURATION = re.compile(r"(\d+)(ms|d|h|m|s)")
_COUNTER = re.compile(r"\bcounter packets \d+ bytes \d+")
_HANDLE = re.compile(r"\s*# handle \d+$")
_BEFORE_COMMA = re.compile(r"\s+,")
#: An anonymous set of one item, which nft lists without its braces.
_SINGLE = re.compile(r"\{ ([^{},]+?) \}")
_HEX_NUMBER = re.compile(r"\b0x[0-9a-fA-F]+\b")
#: Operators nft lists as symbols, rendered as words (upstream's spelling).
_OPERATORS = {"&": "and", "|": "or", "^": "xor"}
#: A chain's own lines in a listing, not rules: a base chain's hook, the chain's comment.
_CHAIN_PROPERTY = re.compile(r'^(?:type \S+ hook .*;|comment "[^"]*")$')


@dataclass
class TableObjects:
    """Names of the chains, sets and maps of one ``kube-proxy`` table."""

    chains: set[str] = field(default_factory=set)
    sets: set[str] = field(default_factory=set)
    maps: set[str] = field(default_factory=set)


def listing_commands(families: tuple[str, ...]) -> str:
    """What a full sync lists (chain headers without rules, sets without elements: with
    ``terse``, a fraction of ``list table``)."""
    return "".join(f"list chains {fam}\nlist sets {fam}\nlist maps {fam}\n" for fam in families)


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


def kube_proxy_tables(text: str) -> list[str]:
    """``nft list tables`` output -> the families ("ip", "ip6") that have a kube-proxy table."""
    out = []
    for line in text.splitlines():
        m = _TABLE_LINE.match(line.strip())
        if m and m.group(2) == names.TABLE and m.group(1) in ("ip", "ip6"):
            out.append(m.group(1))
    return out


@dataclass
class ListedSet:
    """A set or map of ``nft list table``: its properties and its elements, as nft prints
    them (one string each)."""

    kind: str
    lines: list[str] = field(default_factory=list)
    elements: list[str] = field(default_factory=list)

    @property
    def timeout(self) -> int | None:
        """The set's timeout in seconds (nft prints "3h", "1d2h", "10s", ...)."""
        for line in self.lines:
            if line.startswith("timeout "):
                return parse_duration(line.split()[1])
        return None


@dataclass
class ListedTable:
    """One table of ``nft list table``: chains with their rules, sets and maps."""

    chains: dict[str, list[str]] = field(default_factory=dict)
    sets: dict[str, ListedSet] = field(default_factory=dict)


def parse_duration(text: str) -> int | None:
    """nft's time format ("3h", "1d2h3m4s", "500ms") -> whole seconds."""
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    scale = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    return int(sum(int(n) * scale[u] for n, u in parts))


def _joined(text: str) -> Iterator[str]:
    """Stripped lines, with nft's wrapped element lists ("a,\\n\\t\\t b") joined."""
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if pending:
            line = f"{pending} {line}"
            pending = ""
        if line.endswith(","):
            pending = line
            continue
        yield line
    if pending:
        yield pending


def split_elements(body: str) -> list[str]:
    """The elements of ``elements = { a, b }`` (commas inside quotes or braces kept)."""
    out: list[str] = []
    depth, quoted, start = 0, False, 0
    for i, ch in enumerate(body):
        if ch == '"':
            quoted = not quoted
        elif not quoted and ch == "{":
            depth += 1
        elif not quoted and ch == "}":
            depth -= 1
        elif not quoted and depth == 0 and ch == ",":
            out.append(body[start:i].strip())
            start = i + 1
    last = body[start:].strip()
    if last:
        out.append(last)
    return out


def parse_table(text: str) -> ListedTable:
    """``nft list table FAMILY NAME`` output -> its chains (rules) and sets (elements)."""
    table = ListedTable()
    rules: list[str] | None = None
    current: ListedSet | None = None
    for line in _joined(text):
        if m := re.match(r"^(chain|set|map) (\S+) \{$", line):
            kind, name = m.groups()
            if kind == "chain":
                rules, current = table.chains.setdefault(name, []), None
            else:
                current, rules = table.sets.setdefault(name, ListedSet(kind)), None
        elif line == "}":
            rules = current = None
        elif not line or line.startswith("table "):
            continue
        elif rules is not None:
            if not _CHAIN_PROPERTY.match(line):
                rules.append(line)
        elif current is not None:
            if line.startswith("elements = {") and line.endswith("}"):
                body = line.removeprefix("elements = {").removesuffix("}")
                current.elements.extend(split_elements(body))
            else:
                current.lines.append(line)
    return table


def rule_key(rule: str) -> str:
    """A rule as nft lists it and as it is rendered, alike: counter values, handles, the
    spacing nft changes (``a , b`` is listed ``a, b``) and the braces of a one-item set
    (``{ 10.0.0.0/8 }`` is listed ``10.0.0.0/8``) left out; numbers in decimal, operators
    as words (``meta mark & 0x4000`` is ``mark and 16384``)."""
    text = _HANDLE.sub("", _COUNTER.sub("counter", rule))
    text = _SINGLE.sub(r"\1", _BEFORE_COMMA.sub(",", text))
    text = _HEX_NUMBER.sub(lambda m: str(int(m.group(0), 16)), text)
    words = [_OPERATORS.get(w, w) for w in text.split()]
    # nft lists the mark as "meta mark"; upstream writes "mark".
    return " ".join(
        w for i, w in enumerate(words) if not (w == "meta" and words[i + 1 : i + 2] == ["mark"])
    )


def rendered_chains(text: str, table: str) -> dict[str, list[str]]:
    """The chains a rendered transaction of ``table`` ("ip kube-proxy") fills: each chain it
    flushes (empty) or adds rules to -> those rules, in order."""
    flush, add = f"flush chain {table} ", f"add rule {table} "
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.startswith(flush):
            out.setdefault(line[len(flush) :].strip(), [])
        elif line.startswith(add):
            chain, _, rule = line[len(add) :].partition(" ")
            out.setdefault(chain, []).append(rule)
    return out


def chain_drift(
    expected: Mapping[str, Sequence[str]], held: Mapping[str, Sequence[str]]
) -> list[RuleDrift]:
    """Where the ``expected`` chains (chain -> rules as rendered) differ in the kernel's
    ``held`` ones (chain -> rules as nft lists them; a chain missing there has none)."""
    return diff_chains(expected, {c: held.get(c, ()) for c in expected}, rule_key)
