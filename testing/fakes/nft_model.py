"""The objects of the in-memory nftables (``FakeNftables``) and how nft lists them.

Tables, chains, rules (their text, as written), sets and maps with their elements, and the
references that make the kernel refuse to delete a chain or set still in use: a ``jump`` or
``goto`` in a rule or in a verdict map's element, an ``@set`` in a rule.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

#: A quoted string (its contents are never names of chains or sets).
_QUOTED = re.compile(r'"[^"]*"')
_CHAIN_REF = re.compile(r"\b(?:jump|goto)\s+([^\s,{}\"]+)")
_SET_REF = re.compile(r"@([^\s,{}\"]+)")
_LIST_COMMA = re.compile(r"\s+,\s+")

#: nft's standard priority names (inet families) and the hooks where it prints them.
STD_PRIORITIES: dict[str, int] = {
    "raw": -300,
    "mangle": -150,
    "dstnat": -100,
    "filter": 0,
    "security": 50,
    "srcnat": 100,
}
_HOOK_ONLY = {"dstnat": "prerouting", "srcnat": "postrouting"}


def chain_refs(text: str) -> list[str]:
    """Chains a rule or a verdict jumps or goes to."""
    return _CHAIN_REF.findall(_QUOTED.sub('""', text))


def set_refs(text: str) -> list[str]:
    """Named sets and maps a rule uses (``@name``)."""
    return _SET_REF.findall(_QUOTED.sub('""', text))


def priority_text(priority: int, hook: str) -> str:
    """A base chain's priority as nft prints it: a standard name within 10 of it (where the
    hook allows that name), else the number."""
    for name, value in STD_PRIORITIES.items():
        if _HOOK_ONLY.get(name, hook) != hook or abs(priority - value) > 10:
            continue
        offset = priority - value
        if offset == 0:
            return name
        return f"{name} {'+' if offset > 0 else '-'} {abs(offset)}"
    return str(priority)


def duration_text(seconds: int) -> str:
    """nft's time format: 10800 -> "3h", 86401 -> "1d1s", 0 -> "0s"."""
    out = ""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            out += f"{seconds // size}{unit}"
            seconds %= size
    return out or "0s"


@dataclass
class Rule:
    handle: int
    text: str


@dataclass
class Chain:
    #: Base chains: (type, hook, priority); None for a regular chain.
    base: tuple[str, str, int] | None = None
    policy: str = "accept"
    comment: str | None = None
    rules: list[Rule] = field(default_factory=list)

    def copy(self) -> Chain:
        return Chain(self.base, self.policy, self.comment, list(self.rules))

    def header(self) -> list[str]:
        out = [f'comment "{self.comment}"'] if self.comment is not None else []
        if self.base is not None:
            kind, hook, prio = self.base
            out.append(
                f"type {kind} hook {hook} priority {priority_text(prio, hook)};"
                f" policy {self.policy};"
            )
        return out


@dataclass
class Element:
    value: str = ""
    comment: str = ""

    def text(self, key: str) -> str:
        note = f' comment "{self.comment}"' if self.comment else ""
        return f"{key}{note}{f' : {self.value}' if self.value else ''}"


@dataclass
class NftSet:
    """A named set (``kind`` "set") or map ("map")."""

    kind: str
    #: The key type ("ipv4_addr . inet_proto . inet_service"), and a map's value type.
    key_type: str
    value_type: str = ""
    flags: tuple[str, ...] = ()
    timeout: int | None = None
    size: int | None = None
    comment: str | None = None
    elements: dict[str, Element] = field(default_factory=dict)
    #: The size is the one nft gives a set that rules add to, not a declared one.
    size_from_rule: bool = False

    def copy(self) -> NftSet:
        return NftSet(
            self.kind,
            self.key_type,
            self.value_type,
            self.flags,
            self.timeout,
            self.size,
            self.comment,
            dict(self.elements),
            self.size_from_rule,
        )

    @property
    def type_text(self) -> str:
        return f"{self.key_type} : {self.value_type}" if self.value_type else self.key_type

    def lines(self, terse: bool) -> list[str]:
        out = [f"type {self.type_text}"]
        if self.size is not None:
            out.append(f"size {self.size}")
        if self.flags:
            out.append(f"flags {','.join(self.flags)}")
        if self.timeout is not None:
            out.append(f"timeout {duration_text(self.timeout)}")
        if self.comment is not None:
            out.append(f'comment "{self.comment}"')
        if self.elements and not terse:
            items = ", ".join(e.text(k) for k, e in self.elements.items())
            out.append(f"elements = {{ {items} }}")
        return out


@dataclass
class Table:
    family: str
    name: str
    comment: str | None = None
    chains: dict[str, Chain] = field(default_factory=dict)
    sets: dict[str, NftSet] = field(default_factory=dict)
    #: References to each chain (from rules of other chains and from map elements).
    chain_uses: Counter[str] = field(default_factory=Counter)
    #: References to each set or map (from rules).
    set_uses: Counter[str] = field(default_factory=Counter)

    def copy(self) -> Table:
        return Table(
            self.family,
            self.name,
            self.comment,
            {n: c.copy() for n, c in self.chains.items()},
            {n: s.copy() for n, s in self.sets.items()},
            Counter(self.chain_uses),
            Counter(self.set_uses),
        )

    # --- references -------------------------------------------------------------------------

    def rule_added(self, text: str, sign: int = 1) -> None:
        for c in chain_refs(text):
            self.chain_uses[c] += sign
        for s in set_refs(text):
            self.set_uses[s] += sign

    def element_added(self, element: Element, sign: int = 1) -> None:
        for c in chain_refs(element.value):
            self.chain_uses[c] += sign

    def flush_chain(self, chain: Chain) -> None:
        for r in chain.rules:
            self.rule_added(r.text, -1)
        chain.rules.clear()

    def flush_set(self, s: NftSet) -> None:
        for e in s.elements.values():
            self.element_added(e, -1)
        s.elements.clear()

    # --- listing ----------------------------------------------------------------------------

    def chain_block(self, name: str, rules: bool) -> list[str]:
        c = self.chains[name]
        body = c.header() + ([_LIST_COMMA.sub(", ", r.text) for r in c.rules] if rules else [])
        return [f"\tchain {name} {{", *(f"\t\t{line}" for line in body), "\t}"]

    def set_block(self, name: str, terse: bool) -> list[str]:
        s = self.sets[name]
        return [f"\t{s.kind} {name} {{", *(f"\t\t{line}" for line in s.lines(terse)), "\t}"]

    def listing(self, terse: bool) -> str:
        """``nft list table``: the comment, sets and maps, then chains; blank lines between."""
        blocks = [self.set_block(n, terse) for n in self.sets]
        blocks += [self.chain_block(n, rules=True) for n in self.chains]
        out = [f"table {self.family} {self.name} {{"]
        if self.comment is not None:
            out.append(f'\tcomment "{self.comment}"')
        for i, block in enumerate(blocks):
            if i:
                out.append("")
            out.extend(block)
        out.append("}")
        return "\n".join(out) + "\n"

    def wrapped(self, lines: list[str]) -> str:
        """Object lines inside this table's braces, as ``list chains`` and the like print."""
        return "\n".join([f"table {self.family} {self.name} {{", *lines, "}"]) + "\n"
