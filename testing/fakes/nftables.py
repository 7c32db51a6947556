"""An in-memory nftables, written in ``nft -f`` syntax and listed as nft lists it.

``FakeNftables`` models what ``nft -f`` and the kernel do with a transaction:

* Every ``run`` is one transaction: applied whole, or (at the first refused line) not at all,
  with an nft-like message naming the line (``/dev/stdin:3:27-31: Error: Could not process
  rule: No such file or directory``, the line, and carets under the name).
* ``add``, ``create``, ``delete``, ``destroy`` and ``flush`` of tables, chains (base chains
  with type, hook and priority), sets and maps; ``add``/``insert`` of rules and ``delete rule
  ... handle N``; ``add``, ``create``, ``delete`` and ``destroy`` of elements. ``add`` of an
  existing object is fine (a base chain must keep its type, hook and priority), ``create``
  fails with "File exists"; ``delete`` and ``flush`` of a missing object fail, ``destroy``
  does not (nft 1.0.8 and later). Deleting a chain that a rule or a map element still jumps
  or goes to, or a set that a rule still uses (``@name``), fails with "Device or resource
  busy"; a chain's own rules go with it. Everything is checked in the transaction's order.
* A rule must name an existing chain, and every chain it jumps or goes to (also inside an
  anonymous verdict map) and every ``@set`` it uses must exist. An element's key must have
  as many parts as the set's type, with addresses of the set's family; a map's element
  needs a value, and a verdict that jumps or goes to a chain needs the chain.
* ``list``: ``list tables``, ``list table``, ``list ruleset``, ``list chains``, ``list sets``,
  ``list maps`` (each optionally of one family), ``list chain``, ``list set``, ``list map``,
  in nft's layout (tabs, blank lines between a table's objects, priorities by name, timeouts
  as "3h"); ``terse`` leaves out set elements.

What it cannot model: packets and counters; nft's parser (a rule's words after the chain
name are taken as written, so a misspelt expression is accepted where nft would report a
syntax error); the kernel's checks of what a chain may hold (``dnat`` in a filter chain,
``masquerade`` outside postrouting) and of jump loops; nft's rewriting of a rule when it
lists it (``mark set mark or 0x4000`` is listed as written, where nft prints ``meta mark set
meta mark | 0x00004000``; only " , " in anonymous sets is listed as ", "); the order of set
elements (listed in the order added, one line); ``table { ... }`` block syntax and several
commands on one line.

Usage::

    from kubeplex.testing.fakes import FakeNftables

    nft = FakeNftables()
    nft.run("add table ip t\\nadd chain ip t c\\nadd rule ip t c accept\\n")
    assert "accept" in nft.list("list chain ip t c")
    nft.run("delete chain ip t nothing\\n")  # BackendError: No such file or directory
    assert nft.inputs() == [...]  # every transaction received, refused ones too
    assert nft.applied() == [...]  # those applied
    nft.dump("ip", "t")  # the table as "add" commands, as knftables' fake dumps it

Pass it as ``BackendContext(kernel=FakeNftables())`` to a backend whose seam is ``NftSeam``
(the nftables mode).
"""

from __future__ import annotations

import builtins
import ipaddress
import re
from collections.abc import Callable, Sequence
from typing import ClassVar

from kubeplex.core.model.errors import BackendError
from kubeplex.testing.fakes.nft_model import (
    STD_PRIORITIES,
    Chain,
    Element,
    NftSet,
    Rule,
    Table,
    chain_refs,
    set_refs,
)

ENOENT = "No such file or directory"
EEXIST = "File exists"
EBUSY = "Device or resource busy"
EOPNOTSUPP = "Operation not supported"

FAMILIES = frozenset({"ip", "ip6", "inet", "arp", "bridge", "netdev"})
_COMMAND = re.compile(
    r"^(add|create|insert|delete|destroy|flush)\s+(table|chain|rule|set|map|element)\s+(.*)$"
)
_WORD = re.compile(r"\S+")
_VERDICTS = frozenset({"accept", "drop", "continue", "return", "queue"})
_NAME = re.compile(r"^[A-Za-z_.][A-Za-z0-9_./-]*$|^[A-Za-z0-9][A-Za-z0-9_./-]*$")
#: Rules that add to a set (``update @s { ... }``, ``add @s { ... }``) and the size nft gives
#: such a set if it has none.
_DYNSET = re.compile(r"\b(?:update|add)\s+@([^\s,{}\"]+)")
DYNSET_SIZE = 65535
#: The longest name of a table, chain or set (NFT_NAME_MAXLEN - 1).
NAME_MAX = 255


class Refused(Exception):
    """A refused command: nft's message, pointing at ``what`` in the line."""

    def __init__(self, reason: str, what: str | None = None, kernel: bool = True) -> None:
        super().__init__(reason)
        self.reason = reason
        self.what = what
        self.kernel = kernel


def _split_top(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep`` outside quotes and braces."""
    out: list[str] = []
    depth, quoted, start = 0, False, 0
    for i, ch in enumerate(text):
        if ch == '"':
            quoted = not quoted
        elif not quoted and ch == "{":
            depth += 1
        elif not quoted and ch == "}":
            depth -= 1
        elif not quoted and depth == 0 and text.startswith(sep, i):
            out.append(text[start:i])
            start = i + len(sep)
    out.append(text[start:])
    return [part.strip() for part in out]


def _braced(text: str) -> str:
    """The inside of ``{ ... }`` (the whole ``text``); Refused if it is not one block."""
    text = text.strip()
    if not (text.startswith("{") and text.endswith("}")):
        raise Refused("syntax error, unexpected end of file", kernel=False)
    return text[1:-1].strip()


def _statements(spec: str) -> dict[str, str]:
    """``type filter hook input priority 0 ; comment "x" ;`` -> {"type": ..., "comment": ...}."""
    out: dict[str, str] = {}
    for stmt in _split_top(_braced(spec), ";"):
        if not stmt:
            continue
        word, _, rest = stmt.partition(" ")
        if word == "type" and " hook " in rest:  # one statement: type, hook, priority
            out["type"] = stmt
        else:
            out[word] = rest.strip()
    return out


def _unquote(text: str) -> str:
    text = text.strip()
    return text[1:-1] if len(text) > 1 and text[0] == text[-1] == '"' else text


def _priority(text: str) -> int:
    """``0``, ``-110``, ``dstnat``, ``dstnat - 10``, ``filter + 5`` -> the number."""
    words = text.split()
    try:
        if len(words) == 1:
            return STD_PRIORITIES[words[0]] if words[0] in STD_PRIORITIES else int(words[0])
        if len(words) == 3 and words[1] in "+-":
            offset = int(words[2])
            return STD_PRIORITIES[words[0]] + (offset if words[1] == "+" else -offset)
    except (KeyError, ValueError):
        pass
    raise Refused(f"'{text}' is not a valid priority", text, kernel=False)


def _check_name(name: str) -> str:
    if len(name) > NAME_MAX:
        raise Refused("Numerical result out of range", name)
    if not _NAME.match(name):
        raise Refused(f"syntax error, unexpected string {name!r}", name, kernel=False)
    return name


class _Transaction:
    """One ``nft -f`` input, applied to copies of the tables it touches."""

    def __init__(self, fake: FakeNftables) -> None:
        self.fake = fake
        self.tables = dict(fake.tables)
        self.copied: set[tuple[str, str]] = set()

    # --- lookups ----------------------------------------------------------------------------

    def table(self, family: str, name: str) -> Table:
        key = (family, name)
        t = self.tables.get(key)
        if t is None:
            raise Refused(ENOENT, name, kernel=False)
        if key not in self.copied:
            t = self.tables[key] = t.copy()
            self.copied.add(key)
        return t

    @staticmethod
    def chain(t: Table, name: str, kernel: bool = False) -> Chain:
        c = t.chains.get(name)
        if c is None:
            raise Refused(ENOENT, name, kernel=kernel)
        return c

    @staticmethod
    def set_(t: Table, name: str, kind: str | None, kernel: bool = False) -> NftSet:
        s = t.sets.get(name)
        if s is None or (kind is not None and s.kind != kind):
            raise Refused(ENOENT, name, kernel=kernel)
        return s

    # --- commands ---------------------------------------------------------------------------

    def run(self, verb: str, obj: str, rest: str) -> None:
        words = rest.split(None, 1)
        family = "ip"
        if words and words[0] in FAMILIES:
            family, rest = words[0], words[1] if len(words) > 1 else ""
        tname, _, rest = rest.strip().partition(" ")
        rest = rest.strip()
        if not tname or (obj != "table" and not rest):
            raise Refused("syntax error, unexpected newline", kernel=False)
        handler: Callable[[str, str, str, str], None] = getattr(self, f"do_{obj}")
        handler(verb, family, tname, rest)

    def do_table(self, verb: str, family: str, name: str, rest: str) -> None:
        """``rest``: the table's spec (``{ comment "..." ; }``), if any."""
        key = (family, name)
        exists = key in self.tables
        if verb in ("add", "create"):
            _check_name(name)
            if exists and verb == "create":
                raise Refused(EEXIST, name)
            spec = _statements(rest) if rest else {}
            t = self.table(family, name) if exists else Table(family, name)
            if "comment" in spec:
                t.comment = _unquote(spec["comment"])
            self.tables[key] = t
            self.copied.add(key)
        elif verb in ("delete", "destroy"):
            if not exists:
                if verb == "destroy":
                    return
                raise Refused(ENOENT, name, kernel=False)
            del self.tables[key]
        elif verb == "flush":
            t = self.table(family, name)
            for c in t.chains.values():
                t.flush_chain(c)
        else:
            raise Refused(f"syntax error, unexpected {verb}", verb, kernel=False)

    def do_chain(self, verb: str, family: str, tname: str, rest: str) -> None:
        name, _, spec_text = rest.partition(" ")
        if verb == "destroy" and (family, tname) not in self.tables:
            return
        t = self.table(family, tname)
        existing = t.chains.get(name)
        if verb in ("add", "create"):
            _check_name(name)
            spec = _statements(spec_text) if spec_text.strip() else {}
            base = None
            if "type" in spec:
                words = spec["type"].split()
                if len(words) < 6 or words[2] != "hook" or words[4] != "priority":
                    raise Refused("syntax error, unexpected chain spec", spec["type"], False)
                base = (words[1], words[3], _priority(" ".join(words[5:])))
            if existing is not None:
                if verb == "create":
                    raise Refused(EEXIST, name)
                if base is not None and existing.base != base:
                    raise Refused(EOPNOTSUPP)
                return
            chain = Chain(base=base, policy=spec.get("policy", "accept"))
            if "comment" in spec:
                chain.comment = _unquote(spec["comment"])
            t.chains[name] = chain
        elif verb in ("delete", "destroy"):
            if existing is None:
                if verb == "destroy":
                    return
                raise Refused(ENOENT, name, kernel=False)
            t.flush_chain(existing)  # its own rules go with it
            if t.chain_uses[name] > 0:
                raise Refused(EBUSY, name)
            del t.chains[name]
        elif verb == "flush":
            t.flush_chain(self.chain(t, name, kernel=True))
        else:
            raise Refused(f"syntax error, unexpected {verb}", verb, kernel=False)

    def do_rule(self, verb: str, family: str, tname: str, rest: str) -> None:
        cname, _, text = rest.partition(" ")
        text = text.strip()
        if verb == "destroy" and (family, tname) not in self.tables:
            return
        t = self.table(family, tname)
        if verb in ("delete", "destroy"):
            words = text.split()
            if len(words) != 2 or words[0] != "handle" or not words[1].isdigit():
                raise Refused("syntax error, expecting handle", text or None, kernel=False)
            chain = t.chains.get(cname)
            found = [r for r in chain.rules if r.handle == int(words[1])] if chain else []
            if not found or chain is None:
                if verb == "destroy":
                    return
                raise Refused(ENOENT, words[1])
            t.rule_added(found[0].text, -1)
            chain.rules.remove(found[0])
            return
        if verb not in ("add", "insert"):
            raise Refused(f"syntax error, unexpected {verb}", verb, kernel=False)
        chain = self.chain(t, cname)
        if not text:
            raise Refused("syntax error, unexpected newline", kernel=False)
        for target in chain_refs(text):
            if target not in t.chains:
                raise Refused(ENOENT, target)
        for used in set_refs(text):
            if used not in t.sets:
                raise Refused(ENOENT, f"@{used}", kernel=False)
        for used in _DYNSET.findall(text):
            s = t.sets[used]
            if s.size is None:
                s.size = DYNSET_SIZE  # what nft gives a set that rules add to
                s.size_from_rule = True
        rule = Rule(self.fake.next_handle(), text)
        if verb == "insert":
            chain.rules.insert(0, rule)
        else:
            chain.rules.append(rule)
        t.rule_added(text)

    def do_set(self, verb: str, family: str, tname: str, rest: str) -> None:
        self.container("set", verb, family, tname, rest)

    def do_map(self, verb: str, family: str, tname: str, rest: str) -> None:
        self.container("map", verb, family, tname, rest)

    def container(self, kind: str, verb: str, family: str, tname: str, rest: str) -> None:
        name, _, spec_text = rest.partition(" ")
        if verb == "destroy" and (family, tname) not in self.tables:
            return
        t = self.table(family, tname)
        existing = t.sets.get(name)
        if verb in ("add", "create"):
            _check_name(name)
            new, elements = _new_set(kind, spec_text)
            if existing is not None:
                if verb == "create" or existing.kind != kind or existing.type_text != new.type_text:
                    raise Refused(EEXIST, name)
                target = existing
            else:
                t.sets[name] = target = new
            for key, element in elements:
                self.add_element(t, target, key, element, "add")
        elif verb in ("delete", "destroy"):
            if existing is None or existing.kind != kind:
                if verb == "destroy":
                    return
                raise Refused(ENOENT, name)
            if t.set_uses[name] > 0:
                raise Refused(EBUSY, name)
            t.flush_set(existing)
            del t.sets[name]
        elif verb == "flush":
            t.flush_set(self.set_(t, name, kind, kernel=False))
        else:
            raise Refused(f"syntax error, unexpected {verb}", verb, kernel=False)

    def do_element(self, verb: str, family: str, tname: str, rest: str) -> None:
        name, _, body = rest.partition(" ")
        if verb == "destroy" and (family, tname) not in self.tables:
            return
        t = self.table(family, tname)
        s = self.set_(t, name, None)
        for key, element in (_element(e) for e in _elements(body)):
            if verb in ("add", "create"):
                self.add_element(t, s, key, element, verb)
            elif verb in ("delete", "destroy"):
                old = s.elements.pop(key, None)
                if old is None and verb == "delete":
                    raise Refused(ENOENT, key)
                if old is not None:
                    t.element_added(old, -1)
            else:
                raise Refused(f"syntax error, unexpected {verb}", verb, kernel=False)

    @staticmethod
    def add_element(t: Table, s: NftSet, key: str, element: Element, verb: str) -> None:
        _check_key(s, key)
        if s.kind == "map" and not element.value:
            raise Refused("map element needs a value", key, kernel=False)
        if s.kind == "set" and element.value:
            raise Refused("syntax error, unexpected colon", key, kernel=False)
        if element.value and s.value_type == "verdict":
            words = element.value.split()
            if words[0] in ("jump", "goto"):
                if len(words) != 2 or words[1] not in t.chains:
                    raise Refused(ENOENT, key)
            elif element.value not in _VERDICTS:
                raise Refused(f"invalid verdict {element.value!r}", key, kernel=False)
        old = s.elements.get(key)
        if old is not None:
            if verb == "create" or old.value != element.value:
                raise Refused(EEXIST, key)
            return
        s.elements[key] = element
        t.element_added(element)


def _new_set(kind: str, spec_text: str) -> tuple[NftSet, list[tuple[str, Element]]]:
    """A set or map from its spec, and the elements the spec holds (``elements = { ... }``)."""
    spec = _statements(spec_text) if spec_text.strip() else {}
    if "type" not in spec:
        raise Refused(f"{kind} definition does not specify key", None, kernel=False)
    key_type, _, value_type = spec["type"].partition(" : ")
    if (kind == "map") != bool(value_type):
        raise Refused(f"{kind} definition has the wrong type", spec["type"], kernel=False)
    s = NftSet(kind, key_type.strip(), value_type.strip())
    if "flags" in spec:
        s.flags = tuple(f.strip() for f in spec["flags"].split(","))
    if "timeout" in spec:
        s.timeout = _seconds(spec["timeout"])
    if "size" in spec:
        s.size = int(spec["size"])
    if "comment" in spec:
        s.comment = _unquote(spec["comment"])
    body = spec.get("elements", "").lstrip("= ")
    return s, [_element(e) for e in _elements(body)] if body else []


def _seconds(text: str) -> int:
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    parts = re.findall(r"(\d+)([dhms])", text)
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        raise Refused(f"invalid time {text!r}", text, kernel=False)
    return sum(int(n) * units[u] for n, u in parts)


def _elements(body: str) -> list[str]:
    return [e for e in _split_top(_braced(body), ",") if e]


def _element(text: str) -> tuple[str, Element]:
    """``10.0.0.1 . tcp . 80 comment "x" : goto chain`` -> (key, Element(value, comment))."""
    parts = _split_top(text, " : ")
    head, value = parts[0], " ".join(parts[1:]).strip()
    comment = ""
    m = re.search(r'\s+comment\s+"([^"]*)"\s*$', head)
    if m:
        comment, head = m.group(1), head[: m.start()]
    return " ".join(head.split()), Element(" ".join(value.split()), comment)


def _check_key(s: NftSet, key: str) -> None:
    types = [p.strip() for p in s.key_type.split(" . ")]
    parts = [p.strip() for p in key.split(" . ")]
    if len(types) != len(parts):
        raise Refused(
            f"invalid data type, expected concatenation of ({', '.join(types)})", key, False
        )
    for kind, part in zip(types, parts, strict=True):
        if kind not in ("ipv4_addr", "ipv6_addr"):
            continue
        try:
            addr = ipaddress.ip_network(part, strict=False) if "/" in part else None
            version = addr.version if addr else ipaddress.ip_address(part).version
        except ValueError:
            raise Refused(f"Could not resolve hostname: {part}", part, kernel=False) from None
        if version != (4 if kind == "ipv4_addr" else 6):
            raise Refused(
                "Could not resolve hostname: Address family for hostname not supported",
                part,
                kernel=False,
            )
        if addr is not None and "interval" not in s.flags:
            raise Refused("Set member cannot be prefix, missing interval flag on declaration?",
                          part, kernel=False)  # fmt: skip


def _message(lineno: int, line: str, err: Refused) -> str:
    """nft's report of a refused line: where, why, the line, carets under the culprit."""
    start, end = 1, len(line)
    if err.what and err.what in line:
        start = line.index(err.what) + 1
        end = start + len(err.what) - 1
    why = f"Could not process rule: {err.reason}" if err.kernel else err.reason
    carets = " " * (start - 1) + "^" * (end - start + 1)
    return f"/dev/stdin:{lineno}:{start}-{end}: Error: {why}\n{line}\n{carets}"


def _listed(all_tables: dict[tuple[str, str], Table], words: list[str], terse: bool) -> str:
    """What one list command prints."""
    if len(words) < 2 or words[0] != "list":
        raise Refused("syntax error, not a list command", words[0] if words else None)
    what, args = words[1], words[2:]
    if what in ("tables", "ruleset", "chains", "sets", "maps"):
        family = args[0] if args else None
        tables = [t for t in all_tables.values() if family in (None, t.family)]
        if what == "tables":
            return "".join(f"table {t.family} {t.name}\n" for t in tables)
        if what == "ruleset":
            return "".join(t.listing(terse) for t in tables)
        out = []
        for t in tables:
            if what == "chains":
                lines = [ln for c in t.chains for ln in t.chain_block(c, rules=False)]
            else:
                kind = what[:-1]
                names = [n for n, s in t.sets.items() if s.kind == kind]
                lines = [ln for n in names for ln in t.set_block(n, terse)]
            out.append(t.wrapped(lines))
        return "".join(out)
    family, rest = (args[0], args[1:]) if args and args[0] in FAMILIES else ("ip", args)
    if not rest:
        raise Refused("syntax error, unexpected newline")
    table = all_tables.get((family, rest[0]))
    if table is None:
        raise Refused(ENOENT, rest[0])
    if what == "table":
        return table.listing(terse)
    name = rest[1] if len(rest) > 1 else ""
    if what == "chain" and name in table.chains:
        return table.wrapped(table.chain_block(name, rules=True))
    if what in ("set", "map") and name in table.sets and table.sets[name].kind == what:
        return table.wrapped(table.set_block(name, terse))
    raise Refused(ENOENT, name or what)


class FakeNftables:
    """The ``NftSeam`` of a node, in memory (see the module docstring).

    ``log`` holds every transaction received, in order, with whether it was refused;
    ``listings`` every list command text.
    """

    writes: ClassVar[tuple[str, ...]] = ("run", "run_stages")

    def __init__(self) -> None:
        #: (family, name) -> table, in creation order.
        self.tables: dict[tuple[str, str], Table] = {}
        self.log: list[tuple[str, bool]] = []
        self.listings: list[str] = []
        self._handle = 0

    def next_handle(self) -> int:
        self._handle += 1
        return self._handle

    # --- the seam ---------------------------------------------------------------------------

    def run(self, text: str) -> None:
        """One transaction: every line applied, or none (BackendError with nft's message)."""
        tx = _Transaction(self)
        handle = self._handle
        for lineno, raw in enumerate(text.split("\n"), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            try:
                m = _COMMAND.match(line)
                if m is None:
                    word = line.split()[0]
                    raise Refused(f"syntax error, unexpected {word}", word, kernel=False)
                tx.run(*m.groups())
            except Refused as err:
                self._handle = handle
                self.log.append((text, True))
                raise BackendError(
                    f"nft -f failed (exit 1): {_message(lineno, raw, err)}"
                ) from None
        self.tables = tx.tables
        self.log.append((text, False))

    def run_stages(self, texts: Sequence[str], empty_tables: bool = True) -> None:
        """Transactions in order, stopping at the first refused one."""
        for text in texts:
            self.run(text)

    def list(self, commands: str, terse: bool = False) -> str:
        """nft's output for list commands (one a line); BackendError for a missing object."""
        self.listings.append(commands)
        out: list[str] = []
        for line in commands.splitlines():
            if line.strip():
                try:
                    out.append(_listed(self.tables, line.split(), terse))
                except Refused as err:
                    where = "nft -t" if terse else "nft -f"
                    carets = _message(1, line, err).split("\n", 1)[1]
                    raise BackendError(
                        f"{where} failed (exit 1): Error: {err.reason}\n{carets}"
                    ) from None
        return "".join(out)

    # --- for tests --------------------------------------------------------------------------

    def inputs(self) -> builtins.list[str]:
        """Every transaction received (``run`` and each stage of ``run_stages``), in order,
        refused ones included."""
        return [text for text, _ in self.log]

    def applied(self) -> builtins.list[str]:
        """Every transaction applied, in order (the refused ones left out)."""
        return [text for text, refused in self.log if not refused]

    def table(self, family: str, name: str) -> Table | None:
        return self.tables.get((family, name))

    def dump(self, family: str, name: str) -> str:
        """Table ``family name`` as the ``add`` commands that would make it again, one per
        object, rule and element, in the format of knftables' fake ``Dump`` (what upstream's
        tests compare); "" if there is no such table. Rules and elements in their order; a
        base chain's priority as a number; a set's size only where it was declared."""
        t = self.tables.get((family, name))
        if t is None:
            return ""
        head = f"{family} {name}"
        out = [f"add table {head}{_spec([_comment(t.comment)])}"]
        for cname, c in t.chains.items():
            parts = [_comment(c.comment)]
            if c.base is not None:
                kind, hook, prio = c.base
                policy = f"policy {c.policy}" if c.policy != "accept" else None
                parts = [f"type {kind} hook {hook} priority {prio}", policy, *parts]
            out.append(f"add chain {head} {cname}{_spec(parts)}")
        for sname, s in t.sets.items():
            parts = [
                f"type {s.type_text}",
                f"flags {','.join(s.flags)}" if s.flags else None,
                f"timeout {s.timeout}s" if s.timeout is not None else None,
                f"size {s.size}" if s.size is not None and not s.size_from_rule else None,
                _comment(s.comment),
            ]
            out.append(f"add {s.kind} {head} {sname}{_spec(parts)}")
        for cname, c in t.chains.items():
            out += [f"add rule {head} {cname} {r.text}" for r in c.rules]
        for sname, s in t.sets.items():
            out += [f"add element {head} {sname} {{ {e.text(k)} }}" for k, e in s.elements.items()]
        return "\n".join(out) + "\n"


def _comment(text: str | None) -> str | None:
    return f'comment "{text}"' if text is not None else None


def _spec(parts: Sequence[str | None]) -> str:
    """`` { a ; b ; }`` of the parts given, or "" if none is."""
    given = [p for p in parts if p is not None]
    return f" {{ {' ; '.join(given)} ; }}" if given else ""
