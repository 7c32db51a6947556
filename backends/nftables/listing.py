"""Reading back what nft lists: object names for a full sync, whole tables for ``inspect``.

The kernel seam returns nft's own text (``NftSeam.list``); everything that understands it is
here, on the backend's side, so that a fake kernel only has to print what nft prints.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from kubeplex.backends.nftables import names

_TABLE = re.compile(r"^table (ip6?) (\S+) \{$")
_TABLE_LINE = re.compile(r"^table (\S+) (\S+)(?: \{)?$")
_OBJECT = re.compile(r"^\s+(chain|set|map) (\S+) \{$")
_DURATION = re.compile(r"(\d+)(ms|d|h|m|s)")


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
            rules.append(line)
        elif current is not None:
            if line.startswith("elements = {") and line.endswith("}"):
                body = line.removeprefix("elements = {").removesuffix("}")
                current.elements.extend(split_elements(body))
            else:
                current.lines.append(line)
    return table
