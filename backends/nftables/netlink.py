"""nftables transactions straight to nf_tables over netlink, without nft.

nft costs every transaction two things kubeplex can do without. Its parser and evaluator take
a third of a first sync (0.3 s of 0.8 s at 1,000 Services). And nft 1.0.x reads the kernel's
chains, sets, objects and flowtables back before it applies an ``add rule``, ``add element`` or
``delete``: one netlink dump of every chain of the netns, answered in 32 KiB pieces, each found
by walking the chain list from its start again, so O(chains^2): about 0.6 s at 10,000 Services
(110,000 chains), for a one-endpoint change whose commit takes a fraction of that. (nft 1.1.1
no longer fetches the chains, but still every set of the table, anonymous ones included.)

This module compiles the commands the renderer writes (the table, base chains, the fixed sets
and maps, every rule of the fixed chains and of services, affinity sets, elements, flushes and
deletions) into the very netlink messages nft 1.0.x sends for them, and sends them as one batch:
committed atomically or not at all, like ``nft -f``. The kernel ends up with the same objects,
so ``nft list`` shows exactly what nft would have written: the tests compare every message of
the full-sync goldens with nft 1.0.6's own (its ``--debug=mnl`` dump), byte for byte, and the
listings of tables written both ways. A line outside that grammar (a set of several source
ranges, which nft merges and sorts as intervals) raises ``Unsupported``, and the caller hands
the whole transaction to ``nft -f``.
"""

from __future__ import annotations

import errno
import functools
import ipaddress
import os
import re
import socket
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from kubeplex.core.dataplane import netlink as nl
from kubeplex.core.dataplane.netlink import (
    NFNL_HEADER,
    NLA_F_NESTED,
    NLM_F_APPEND,
    NLM_F_CREATE,
    NLM_F_DUMP,
    NLM_F_REQUEST,
    PAD,
    attr,
    nested,
)

# --- constants (linux/netfilter/nf_tables.h; libnftnl's udata) ----------------------------------
# (netlink's own, and the message framing, are kubeplex.core.dataplane.netlink's)

NFNL_SUBSYS_NFTABLES = 10

MSG_NEWTABLE, MSG_GETTABLE = 0, 1
NFTA_TABLE_NAME = 1
MSG_NEWCHAIN, MSG_DELCHAIN = 3, 5
MSG_NEWRULE, MSG_GETRULE, MSG_DELRULE = 6, 7, 8
NFTA_RULE_TABLE, NFTA_RULE_CHAIN = 1, 2
MSG_NEWSET, MSG_GETSET, MSG_DELSET = 9, 10, 11
NFTA_SET_TABLE, NFTA_SET_NAME = 1, 2
MSG_NEWSETELEM, MSG_DELSETELEM = 12, 14
MSG_NEWGEN, MSG_GETGEN = 15, 16
NFTA_GEN_ID = 1

FAMILIES = {"ip": 2, "ip6": 10}
#: Every nf_tables family by number, named as nft prints them.
FAMILY_NAMES = {1: "inet", 2: "ip", 3: "arp", 5: "netdev", 7: "bridge", 10: "ip6"}
PROTOCOLS = {"tcp": 6, "udp": 17, "sctp": 132}

NFT_JUMP, NFT_GOTO = -3, -4
VERDICTS = {"drop": 0, "accept": 1, "return": -5}
NFT_DATA_VERDICT = 0xFFFFFF00
NFT_SET_ANONYMOUS, NFT_SET_CONSTANT, NFT_SET_MAP = 0x1, 0x2, 0x8
NFT_SET_TIMEOUT, NFT_SET_EVAL = 0x10, 0x20
TYPE_INTEGER, TYPE_IPADDR, TYPE_IP6ADDR = 4, 7, 8
NFT_META_MARK, NFT_META_IIFNAME, NFT_META_L4PROTO = 3, 6, 16
NFT_REG32_00 = 8
NFT_CT_STATE, NFT_CT_STATE_BIT_NEW = 0, 8
NFT_FIB_RESULT_ADDRTYPE, NFTA_FIB_F_SADDR, NFTA_FIB_F_DADDR, RTN_LOCAL = 3, 1, 2, 2
NFT_REJECT_ICMP_UNREACH, ICMP_PORT_UNREACH, ICMPV6_PORT_UNREACH = 0, 3, 4
NF_NAT_RANGE_PROTO_RANDOM_FULLY = 0x10
NFT_NG_RANDOM = 1
NFT_NAT_DNAT, NF_NAT_RANGE_PROTO_SPECIFIED = 1, 2
NFT_DYNSET_OP_UPDATE = 1
#: libnftnl udata: comments of rules and elements; byte orders of a set's key and data.
UDATA_COMMENT = 0
UDATA_SET_KEYBYTEORDER, UDATA_SET_DATABYTEORDER = 0, 1
UDATA_SET_KEY_TYPEOF, UDATA_SET_DATA_TYPEOF, UDATA_SET_COMMENT = 4, 6, 7
BYTEORDER_HOST, BYTEORDER_BIG = 1, 2

#: Per-family offsets of saddr/daddr in the network header, and the address length.
_ADDR = {2: (12, 16, 4), 10: (8, 24, 16)}
#: The keys of the fixed sets and maps (setup_lines): which parts, in order.
CONTAINER_KEYS = {
    "cluster-ips": ("addr",),
    "nodeport-ips": ("addr",),
    "service-ips": ("addr", "proto", "port"),
    "firewall-ips": ("addr", "proto", "port"),
    "no-endpoint-services": ("addr", "proto", "port"),
    "service-nodeports": ("proto", "port"),
    "no-endpoint-nodeports": ("proto", "port"),
}


class Unsupported(Exception):
    """A command outside the grammar this module encodes: use ``nft -f`` instead."""


# --- attribute encoding -------------------------------------------------------------------------
# A first sync writes tens of thousands of commands: the helpers below are memoized where their
# arguments repeat (constants, registers, fixed chains), and the expressions that carry one
# variable value (an address, a port) are built as a cached frame around it.

_nla = nl.NLA.pack  # (bound once: most attributes are packed here)


@functools.lru_cache(maxsize=4096)
def _str(kind: int, text: str) -> bytes:
    return attr(kind, text.encode() + b"\0")


def _name(kind: int, text: str) -> bytes:
    """A string attribute that rarely repeats (chain names): not worth a cache entry."""
    value = text.encode() + b"\0"
    size = 4 + len(value)
    return _nla(size, kind) + value + PAD[size & 3]


@functools.lru_cache(maxsize=4096)
def _u32(kind: int, value: int) -> bytes:
    return attr(kind, struct.pack(">I", value & 0xFFFFFFFF))


def _u64(kind: int, value: int) -> bytes:
    return attr(kind, struct.pack(">Q", value))


def _host32(value: int) -> bytes:
    return struct.pack("=I", value & 0xFFFFFFFF)


def _value(kind: int, data: bytes) -> bytes:
    """NFTA_*_DATA / key: an nft_data holding a value."""
    return nested(kind, attr(1, data))


@functools.lru_cache(maxsize=4096)
def _verdict(kind: int, code: int, chain: str = "") -> bytes:
    inner = _u32(1, code) + (_str(2, chain) if chain else b"")
    return nested(kind, nested(2, inner))


def _expr(name: str, *parts: bytes) -> bytes:
    return nested(1, _str(1, name), nested(2, *parts))


def _udata(kind: int, payload: bytes) -> bytes:
    return bytes([kind, len(payload)]) + payload


def _comment_udata(text: str) -> bytes:
    data = text.encode() + b"\0"
    if len(data) > 255:
        raise Unsupported("comment too long")
    return _udata(UDATA_COMMENT, data)


def _framed(build: Callable[[bytes], bytes], size: int) -> tuple[bytes, bytes]:
    """(before, after) the value of ``build(value)`` when the value is its last attribute: the
    lengths of every enclosing attribute depend only on ``size``."""
    whole = build(b"\0" * size)
    after = PAD[(4 + size) & 3]
    cut = len(whole) - len(after) - size
    return whole[:cut], after


# --- expressions (as nft 1.0.x linearizes them) ---------------------------------------------------


@functools.lru_cache(maxsize=256)
def _payload(offset: int, length: int, dreg: int = 1, base: int = 1) -> bytes:
    """Load ``length`` bytes at ``offset`` of the network (base 1) or transport (2) header."""
    return _expr("payload", _u32(1, dreg), _u32(2, base), _u32(3, offset), _u32(4, length))


@functools.lru_cache(maxsize=64)
def _cmp_frame(op: int, size: int) -> tuple[bytes, bytes]:
    return _framed(lambda data: _expr("cmp", _u32(1, 1), _u32(2, op), _value(3, data)), size)


def _cmp(op: int, data: bytes) -> bytes:
    before, after = _cmp_frame(op, len(data))
    return before + data + after


@functools.lru_cache(maxsize=64)
def _immediate_frame(dreg: int, size: int) -> tuple[bytes, bytes]:
    return _framed(lambda data: _expr("immediate", _u32(1, dreg), _value(2, data)), size)


def _immediate_data(dreg: int, data: bytes) -> bytes:
    before, after = _immediate_frame(dreg, len(data))
    return before + data + after


@functools.lru_cache(maxsize=4096)
def _immediate_verdict(code: int, chain: str = "") -> bytes:
    return _expr("immediate", _u32(1, 0), _verdict(2, code, chain))


@functools.lru_cache(maxsize=64)
def _meta(key: int, dreg: int = 1) -> bytes:
    return _expr("meta", _u32(2, key), _u32(1, dreg))


def _pack_addr(family: int, text: str) -> bytes:
    try:
        return socket.inet_pton(family, text)
    except (OSError, UnicodeError, ValueError) as err:
        raise Unsupported(f"not an address of family {family}: {text!r}") from err


def _addr_match(family: int, which: str, negate: bool, text: str) -> list[bytes]:
    """``ip saddr [!=] 10.0.0.0/8``: byte-aligned prefixes load only their bytes."""
    saddr, daddr, size = _ADDR[family]
    offset = saddr if which == "saddr" else daddr
    op = 1 if negate else 0
    if "/" not in text:
        return [_payload(offset, size), _cmp(op, _pack_addr(family, text))]
    return list(_prefix_match(family, offset, size, op, text))


@functools.lru_cache(maxsize=1024)
def _prefix_match(family: int, offset: int, size: int, op: int, text: str) -> tuple[bytes, ...]:
    try:
        net = ipaddress.ip_network(text, strict=False)
    except ValueError as err:
        raise Unsupported(f"not an address: {text}") from err
    if (net.version == 4) != (family == 2):
        raise Unsupported(f"address {text} of the other family")
    prefix = net.prefixlen
    packed = net.network_address.packed
    if prefix == 0:
        raise Unsupported("a /0 prefix")
    if prefix % 8 == 0:
        length = prefix // 8
        return (_payload(offset, length), _cmp(op, packed[:length]))
    mask = net.netmask.packed
    bitwise = _expr(
        "bitwise",
        _u32(1, 1),
        _u32(2, 1),
        _u32(3, size),
        _value(4, mask),
        _value(5, b"\0" * size),
    )
    return (_payload(offset, size), bitwise, _cmp(op, packed))


def _iifname(negate: bool, pattern: str) -> list[bytes]:
    wildcard = pattern.endswith("*")
    data = pattern[:-1].encode() if wildcard else pattern.encode().ljust(16, b"\0")
    if not data or len(data) > 16:
        raise Unsupported(f"interface {pattern!r}")
    return [_meta(NFT_META_IIFNAME), _cmp(1 if negate else 0, data)]


def _dport_match(proto: str, port: str, line: str) -> list[bytes]:
    """``tcp dport 80``: nft's l4proto dependency, then the port."""
    if not port.isdigit() or int(port) > 65535:
        raise Unsupported(line)
    return [
        _meta(NFT_META_L4PROTO),
        _cmp(0, bytes([PROTOCOLS[proto]])),
        _payload(2, 2, 1, 2),
        _cmp(0, int(port).to_bytes(2, "big")),
    ]


def _fib_local(flag: int) -> list[bytes]:
    """``fib saddr|daddr type local``."""
    return [
        _expr("fib", _u32(3, flag), _u32(2, NFT_FIB_RESULT_ADDRTYPE), _u32(1, 1)),
        _cmp(0, _host32(RTN_LOCAL)),
    ]


#: ``ct state new`` (as nft writes a flag test: mask the bit, compare with zero).
_CT_STATE_NEW = (
    _expr("ct", _u32(2, NFT_CT_STATE), _u32(1, 1))
    + _expr(
        "bitwise",
        _u32(1, 1),
        _u32(2, 1),
        _u32(3, 4),
        _value(4, _host32(NFT_CT_STATE_BIT_NEW)),
        _value(5, _host32(0)),
    )
    + _cmp(1, _host32(0))
)


def _mark_bitwise(mask: int, xor: int) -> bytes:
    return _meta(NFT_META_MARK) + _expr(
        "bitwise",
        _u32(1, 1),
        _u32(2, 1),
        _u32(6, 0),
        _u32(3, 4),
        _value(4, _host32(mask)),
        _value(5, _host32(xor)),
    )


def _mark(words: list[str]) -> tuple[list[bytes], list[str]]:
    """``mark set mark or|xor M`` and ``mark and M == 0``: expressions and the words left."""
    if words[1:4] == ["set", "mark", "or"] and len(words) >= 5:
        bit = _hex(words[4])
        set_mark = _expr("meta", _u32(2, NFT_META_MARK), _u32(3, 1))
        return [_mark_bitwise(~bit, bit), set_mark], words[5:]
    if words[1:4] == ["set", "mark", "xor"] and len(words) >= 5:
        bit = _hex(words[4])
        set_mark = _expr("meta", _u32(2, NFT_META_MARK), _u32(3, 1))
        return [_mark_bitwise(0xFFFFFFFF, bit), set_mark], words[5:]
    if words[1] == "and" and len(words) >= 5 and words[3:5] == ["==", "0"]:
        return [_mark_bitwise(_hex(words[2]), 0), _cmp(0, _host32(0))], words[5:]
    raise Unsupported(" ".join(words))


def _hex(word: str) -> int:
    if not word.startswith("0x"):
        raise Unsupported(word)
    try:
        return int(word, 16)
    except ValueError as err:
        raise Unsupported(word) from err


def _register(slot: int) -> int:
    """The register of a concatenation's 32-bit slot: NFT_REG_n at 16-byte boundaries,
    NFT_REG32_nn elsewhere (as nft allocates them)."""
    return 1 + slot // 4 if slot % 4 == 0 else NFT_REG32_00 + slot


def _concat_lookup(
    batch: _Batch, family: int, with_addr: bool, words: list[str], line: str
) -> list[bytes]:
    """``[ip daddr .] meta l4proto . th dport vmap @map``."""
    if len(words) != 2 or words[0] != "vmap" or not words[1].startswith("@"):
        raise Unsupported(line)
    out: list[bytes] = []
    slot = 0
    if with_addr:
        _, daddr, size = _ADDR[family]
        out.append(_payload(daddr, size))
        slot = size // 4
    out.append(_meta(NFT_META_L4PROTO, _register(slot)))
    out.append(_payload(2, 2, _register(slot + 1), 2))
    out.append(_expr("lookup", _u32(2, 1), _u32(3, 0), _set_ref(batch, family, words[1][1:])))
    return out


# --- commands -------------------------------------------------------------------------------------


@dataclass(slots=True)
class Message:
    kind: int
    flags: int
    family: int
    body: bytes
    #: The command it came from (for error messages).
    line: str = ""


@dataclass
class _Batch:
    """Messages, and the IDs of the sets created, numbered as nft numbers them: named sets
    first (nft gives them IDs as it evaluates the commands), then anonymous ones."""

    named_sets: int = 0
    messages: list[Message] = field(default_factory=list)
    next_id: int = 1
    next_anonymous_id: int = 0
    #: Sets created in this batch: name -> ID (rules and elements refer to them by both).
    set_ids: dict[tuple[int, str], int] = field(default_factory=dict)
    #: Per family, the number the next anonymous map is named after; None: "__map%d", for
    #: the kernel to number.
    anonymous_names: dict[int, int] | None = None

    def add(self, kind: int, flags: int, family: int, line: str, *attrs: bytes) -> None:
        self.messages.append(Message(kind, flags, family, b"".join(attrs), line))

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def new_anonymous_id(self) -> int:
        self.next_anonymous_id += 1
        return self.named_sets + self.next_anonymous_id


_COMMENT_SPEC = re.compile(r'^\{ comment "([^"\\]*)" ; \}$')
_BASE_CHAIN_SPEC = re.compile(r"^\{ type (filter|nat) hook (\w+) priority (-?\d+) ; \}$")
_SET_SPEC = re.compile(
    r"^\{ type (ipv4_addr|ipv6_addr) ; flags dynamic,timeout ; timeout (\d+)s ; \}$"
)
_NAMED_SET_SPEC = re.compile(
    r'^\{ type ([a-z0-9_ .]+?)(?: : (verdict))? ; comment "([^"\\]*)" ; \}$'
)
_COMMENT = re.compile(r'^(.*?) comment "([^"\\]*)"$')
_ELEMENT = re.compile(r'^\{ (.+?)(?: comment "([^"\\]*)")?(?: : (.+))? \}$')
_NUMGEN = re.compile(r"^numgen random mod (\d+) vmap \{ (.+) \}$")

HOOKS = {"prerouting": 0, "input": 1, "forward": 2, "output": 3, "postrouting": 4}
#: nft's data types (key types of sets and maps) and their sizes in the key.
DATA_TYPES = {
    "ipv4_addr": (7, 4),
    "ipv6_addr": (8, 16),
    "inet_proto": (12, 4),
    "inet_service": (13, 4),
}
#: What nft 1.0.x writes as the userdata of a named verdict map with a concatenated key
#: (copied from its messages; only nft reads it back, to print the map).
_VMAP_UDATA = bytes.fromhex("000400000000010400000000030800040d0000000100060400000000")
_NEW = NLM_F_REQUEST | NLM_F_CREATE


def compile_transaction(text: str, anonymous_names: dict[int, int] | None = None) -> list[Message]:
    """The messages of ``text`` (lines as the renderer writes them), or ``Unsupported``.

    ``anonymous_names``: name the anonymous maps ``__map0``, ``__map1``... from these numbers
    (per family; updated), as the kernel would in a table that has no other anonymous sets,
    instead of leaving the numbering to the kernel, which scans every set of the table with
    sscanf() for each one: most of a 10,000-Service first sync. Only for the first load of a
    table created empty, or from above every number the table holds (the kernel numbers later
    ones around these names).
    """
    named = ("\n" + text).count("\nadd set ") + ("\n" + text).count("\nadd map ")
    batch = _Batch(named, anonymous_names=anonymous_names)
    line = ""
    try:
        for line in text.splitlines():
            if line and not line.startswith("#"):
                _command(batch, line)
    except struct.error as err:
        # An attribute longer than its 16-bit length field allows: nft's business, then.
        raise Unsupported(f"too long to encode ({err}): {line[:200]}") from err
    return batch.messages


def _command(batch: _Batch, line: str) -> None:
    head = line.split(" ", 5)
    if len(head) < 4 or head[0] not in ("add", "delete", "flush"):
        raise Unsupported(line)
    verb, kind, fam = head[0], head[1], head[2]
    family = FAMILIES.get(fam)
    if family is None:
        raise Unsupported(line)
    if kind == "table":
        _table(batch, family, line, verb, head[3], line.split(" ", 4)[4:])
        return
    if len(head) < 5:
        raise Unsupported(line)
    table, name = head[3], head[4]
    rest = head[5] if len(head) == 6 else ""
    t = _str(1, table)
    if kind == "chain":
        if verb == "add":
            batch.add(MSG_NEWCHAIN, _NEW, family, line, t, _name(3, name), *_chain_spec(rest))
        elif rest:
            raise Unsupported(line)
        elif verb == "flush":
            batch.add(MSG_DELRULE, NLM_F_REQUEST, family, line, t, _name(2, name))
        else:
            batch.add(MSG_DELCHAIN, NLM_F_REQUEST, family, line, t, _name(3, name))
    elif kind in ("set", "map"):
        if verb == "delete" and not rest:
            batch.add(MSG_DELSET, NLM_F_REQUEST, family, line, t, _str(2, name))
        elif verb == "flush" and not rest:
            batch.add(MSG_DELSETELEM, NLM_F_REQUEST, family, line, _str(2, name), t)
        elif verb == "add" and kind == "set" and rest and (s := _SET_SPEC.match(rest)):
            _affinity_set(batch, family, line, table, name, s.group(1), int(s.group(2)))
        elif verb == "add" and rest and (s := _NAMED_SET_SPEC.match(rest)):
            _named_set(batch, family, line, table, name, kind, *s.groups())
        else:
            raise Unsupported(line)
    elif kind == "rule":
        if verb != "add" or not rest:
            raise Unsupported(line)
        if not _endpoint_rule(batch, family, line, t, name, rest):
            _rule(batch, family, line, t, name, rest)
    elif kind == "element":
        if not rest:
            raise Unsupported(line)
        _element(batch, verb, family, line, table, name, rest)
    else:
        raise Unsupported(line)


def _table(batch: _Batch, family: int, line: str, verb: str, name: str, rest: list[str]) -> None:
    spec = _COMMENT_SPEC.match(rest[0]) if rest else None
    if verb != "add" or (rest and spec is None):
        raise Unsupported(line)
    udata = attr(6, _comment_udata(spec.group(1))) if spec else b""
    batch.add(MSG_NEWTABLE, _NEW, family, line, _str(1, name), _u32(2, 0), udata)


def _chain_spec(rest: str) -> list[bytes]:
    """The attributes after the name of an ``add chain``: a base chain's type and hook, or a
    comment."""
    if not rest:
        return []
    if base := _BASE_CHAIN_SPEC.match(rest):
        kind, hook, priority = base.groups()
        if hook not in HOOKS:
            raise Unsupported(rest)
        return [_str(7, kind), nested(4, _u32(1, HOOKS[hook]), _u32(2, int(priority)))]
    if comment := _COMMENT_SPEC.match(rest):
        return [attr(12, _comment_udata(comment.group(1)))]
    raise Unsupported(rest)


def _named_set(
    batch: _Batch,
    family: int,
    line: str,
    table: str,
    name: str,
    kind: str,
    key: str,
    verdict: str | None,
    comment: str,
) -> None:
    """``add set|map ... { type K [: verdict] ; comment "..." ; }`` (the fixed sets and maps)."""
    parts = key.split(" . ")
    if any(p not in DATA_TYPES for p in parts) or (kind == "map") != (verdict is not None):
        raise Unsupported(line)
    key_type = 0
    for part in parts:
        key_type = (key_type << 6) | DATA_TYPES[part][0]
    key_len = sum(DATA_TYPES[p][1] for p in parts)
    if verdict:
        flags, data = NFT_SET_MAP, [_u32(6, NFT_DATA_VERDICT), _u32(7, 0)]
        udata = _VMAP_UDATA
    elif len(parts) == 1 and parts[0] in ("ipv4_addr", "ipv6_addr"):
        flags, data = 0, []
        udata = _udata(UDATA_SET_KEYBYTEORDER, _host32(BYTEORDER_BIG))
    else:
        raise Unsupported(line)
    comment_udata = _udata(UDATA_SET_COMMENT, comment.encode() + b"\0")
    head = [_u32(3, flags), _u32(4, key_type), _u32(5, key_len), *data]
    _new_set(batch, family, line, table, name, head, [attr(13, udata + comment_udata)])


def _affinity_set(
    batch: _Batch, family: int, line: str, table: str, name: str, addr: str, timeout: int
) -> None:
    v6 = addr == "ipv6_addr"
    head = [
        _u32(3, NFT_SET_TIMEOUT | NFT_SET_EVAL),
        _u32(4, TYPE_IP6ADDR if v6 else TYPE_IPADDR),
        _u32(5, 16 if v6 else 4),
    ]
    tail = [
        _u64(11, timeout * 1000),
        attr(13, _udata(UDATA_SET_KEYBYTEORDER, _host32(BYTEORDER_BIG))),
    ]
    _new_set(batch, family, line, table, name, head, tail)


def _new_set(
    batch: _Batch,
    family: int,
    line: str,
    table: str,
    name: str,
    head: list[bytes],
    tail: list[bytes],
) -> None:
    """A named set: its attributes around the ID it gets in this batch (as nft orders them)."""
    set_id = batch.new_id()
    batch.set_ids[(family, name)] = set_id
    t, n = _str(1, table), _name(2, name)
    batch.add(MSG_NEWSET, _NEW, family, line, t, n, *head, _u32(10, set_id), *tail)


def _set_ref(batch: _Batch, family: int, name: str) -> bytes:
    """A named set, by name (and by ID when this batch creates it, as nft does)."""
    found = batch.set_ids.get((family, name))
    return _name(1, name) + (_u32(4, found) if found is not None else b"")


def _verdict_words(words: list[str]) -> tuple[int, str]:
    if len(words) == 2 and words[0] in ("jump", "goto"):
        return (NFT_JUMP if words[0] == "jump" else NFT_GOTO), words[1]
    if len(words) == 1 and words[0] in VERDICTS:
        return VERDICTS[words[0]], ""
    raise Unsupported(" ".join(words))


def _rule(batch: _Batch, family: int, line: str, t: bytes, chain: str, text: str) -> None:
    udata = b""
    if ' comment "' in text:
        c = _COMMENT.match(text)
        if c is None:
            raise Unsupported(line)
        text, comment = c.groups()
        udata = attr(7, _comment_udata(comment))
    exprs: list[bytes] = []
    fam = "ip6" if family == 10 else "ip"
    words = text.split(" ")
    if words[0] == "numgen" and (n := _NUMGEN.match(text)):
        exprs += _numgen_vmap(batch, family, line, t, int(n.group(1)), n.group(2))
        words = []
    while words:
        w = words[0]
        if w == fam and len(words) >= 3 and words[1] in ("saddr", "daddr"):
            which = words[1]
            if words[2].startswith("@"):
                offset = _ADDR[family][0 if which == "saddr" else 1]
                exprs.append(_payload(offset, _ADDR[family][2]))
                exprs.append(_expr("lookup", _u32(2, 1), _set_ref(batch, family, words[2][1:])))
                words = words[3:]
                continue
            if words[2:4] == [".", "meta"] and words[4:8] == ["l4proto", ".", "th", "dport"]:
                exprs += _concat_lookup(batch, family, True, words[8:], line)
                words = []
                continue
            negate = words[2] == "!="
            value = words[3] if negate else words[2]
            taken = 4 if negate else 3
            if value == "{":
                # A one-element set: nft writes it as a plain match.
                if len(words) < taken + 2 or words[taken + 1] != "}":
                    raise Unsupported(line)
                value = words[taken]
                taken += 2
            exprs += _addr_match(family, which, negate, value)
            words = words[taken:]
        elif w in PROTOCOLS and len(words) >= 3 and words[1] == "dport":
            exprs += _dport_match(w, words[2], line)
            words = words[3:]
        elif w == "meta" and words[1:5] == ["l4proto", ".", "th", "dport"]:
            exprs += _concat_lookup(batch, family, False, words[5:], line)
            words = []
        elif w == "iifname" and len(words) >= 2:
            negate = words[1] == "!="
            quoted = words[2] if negate else words[1]
            if not (len(quoted) > 2 and quoted[0] == quoted[-1] == '"'):
                raise Unsupported(line)
            exprs += _iifname(negate, quoted[1:-1])
            words = words[3:] if negate else words[2:]
        elif w == "fib" and words[2:4] == ["type", "local"] and words[1] in ("saddr", "daddr"):
            exprs += _fib_local(NFTA_FIB_F_SADDR if words[1] == "saddr" else NFTA_FIB_F_DADDR)
            words = words[4:]
        elif w == "ct" and words[1:3] == ["state", "new"]:
            exprs.append(_CT_STATE_NEW)
            words = words[3:]
        elif w == "mark" and len(words) >= 2:
            found, words = _mark(words)
            exprs += found
        elif w == "update" and words[2:] == ["{", fam, "saddr", "}"] and words[1][:1] == "@":
            exprs.append(_payload(_ADDR[family][0], _ADDR[family][2]))
            exprs.append(
                _expr(
                    "dynset",
                    _u32(4, 1),
                    _u32(3, NFT_DYNSET_OP_UPDATE),
                    *_dynset_ref(batch, family, words[1][1:]),
                )
            )
            words = []
        elif w == "meta" and len(words) == 6 and words[1] == "l4proto" and words[3] == "dnat":
            proto = PROTOCOLS.get(words[2])
            if proto is None or words[4] != "to":
                raise Unsupported(line)
            exprs += _dnat(family, proto, words[5])
            words = []
        elif w == "masquerade" and words[1:] == ["fully-random"]:
            exprs.append(_expr("masq", _u32(1, NF_NAT_RANGE_PROTO_RANDOM_FULLY)))
            words = []
        elif w == "reject" and len(words) == 1:
            code = ICMPV6_PORT_UNREACH if family == 10 else ICMP_PORT_UNREACH
            exprs.append(_expr("reject", _u32(1, NFT_REJECT_ICMP_UNREACH), attr(2, bytes([code]))))
            words = []
        else:
            code, target = _verdict_words(words)
            exprs.append(_immediate_verdict(code, target))
            words = []
    if not exprs:
        raise Unsupported(line)
    batch.add(
        MSG_NEWRULE, _NEW | NLM_F_APPEND, family, line, t, _name(2, chain), nested(4, *exprs), udata
    )


def _endpoint_rule(batch: _Batch, family: int, line: str, t: bytes, chain: str, rule: str) -> bool:
    """The two rules of every endpoint chain, most of a first sync's lines, without the general
    parser: ``ip saddr A jump C`` and ``meta l4proto P dnat to A:P``. False: anything else."""
    words = rule.split(" ")
    if len(words) == 5 and words[1] == "saddr" and words[3] == "jump":
        if words[0] != ("ip6" if family == 10 else "ip") or "/" in words[2]:
            return False
        saddr, _, size = _ADDR[family]
        exprs = (
            _payload(saddr, size)
            + _cmp(0, _pack_addr(family, words[2]))
            + _immediate_verdict(NFT_JUMP, words[4])
        )
    elif len(words) == 6 and words[0] == "meta" and words[3] == "dnat" and words[4] == "to":
        proto = PROTOCOLS.get(words[2])
        if proto is None or words[1] != "l4proto":
            return False
        exprs = b"".join(_dnat(family, proto, words[5]))
    else:
        return False
    body = t + _name(2, chain) + attr(4 | NLA_F_NESTED, exprs)
    batch.messages.append(Message(MSG_NEWRULE, _NEW | NLM_F_APPEND, family, body, line))
    return True


def _dynset_ref(batch: _Batch, family: int, name: str) -> list[bytes]:
    found = batch.set_ids.get((family, name))
    return [_name(1, name)] + ([_u32(2, found)] if found is not None else [])


@functools.lru_cache(maxsize=16)
def _dnat_parts(family: int, proto: int) -> tuple[bytes, bytes]:
    """The constant expressions of ``meta l4proto P dnat to A:P``: before the address, after
    the port."""
    before = _meta(NFT_META_L4PROTO) + _cmp(0, bytes([proto]))
    after = _expr(
        "nat",
        _u32(1, NFT_NAT_DNAT),
        _u32(2, family),
        _u32(3, 1),
        _u32(5, 2),
        _u32(7, NF_NAT_RANGE_PROTO_SPECIFIED),
    )
    return before, after


def _dnat(family: int, proto: int, target: str) -> list[bytes]:
    addr, sep, port_text = target.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise Unsupported(target)
    if family == 10:
        if not (addr.startswith("[") and addr.endswith("]")):
            raise Unsupported(target)
        addr = addr[1:-1]
    before, after = _dnat_parts(family, proto)
    packed = _pack_addr(family, addr)
    port = int(port_text).to_bytes(2, "big")
    return [before, _immediate_data(1, packed), _immediate_data(2, port), after]


#: What nft 1.0.x writes as the userdata of a ``numgen ... vmap`` map: the key's byte order
#: (host), the data's, and "typeof numgen" (expression 1, no attributes) for key and data.
_NUMGEN_MAP_UDATA = (
    _udata(UDATA_SET_KEYBYTEORDER, _host32(BYTEORDER_HOST))
    + _udata(UDATA_SET_DATABYTEORDER, _host32(0))
    + _udata(UDATA_SET_KEY_TYPEOF, _udata(0, _host32(1)) + _udata(1, b""))
    + _udata(UDATA_SET_DATA_TYPEOF, _host32(0))
)


#: The most an attribute can hold: its length field (header included) has 16 bits.
NLA_MAX_LEN = 0xFFFF


def _element_chunks(elements: list[bytes]) -> Iterator[list[bytes]]:
    """A set's elements (each one's attributes) as the nested NFTA_LIST_ELEMs of one or more
    NFTA_SET_ELEM_LIST_ELEMENTS attributes, one NEWSETELEM message each, split as nft 1.0.x
    splits them: an element that would make the list longer than NLA_MAX_LEN starts the next
    message, and its number, already taken, is skipped (the numbering goes on across them)."""
    chunk: list[bytes] = []
    size = 4  # the list attribute's header
    number = 0
    for element in elements:
        number += 1
        if chunk and size + 4 + len(element) > NLA_MAX_LEN:
            yield chunk
            chunk, size = [], 4
            number += 1
        chunk.append(attr(number | NLA_F_NESTED, element))
        size += 4 + len(element)
    if chunk:
        yield chunk


@functools.lru_cache(maxsize=1024)
def _numgen_key(i: int) -> bytes:
    return _value(1, _host32(i))


def _numgen_vmap(
    batch: _Batch, family: int, line: str, t: bytes, modulus: int, body: str
) -> list[bytes]:
    entries = body.split(" , ")
    if modulus < 1 or len(entries) != modulus:
        raise Unsupported(line)
    elements = []
    for i, entry in enumerate(entries):
        key, sep, verdict = entry.partition(" : ")
        if not sep or key != str(i):
            raise Unsupported(line)
        jump, _, chain = verdict.partition(" ")
        if jump == "goto" and chain and " " not in chain:
            # A goto per endpoint: the verdict built in place (no cache would ever hit).
            target = _u32(1, NFT_GOTO) + _name(2, chain)
            data = attr(2 | NLA_F_NESTED, attr(2 | NLA_F_NESTED, target))
        else:
            code, target_chain = _verdict_words(verdict.split(" "))
            data = _verdict(2, code, target_chain)
        elements.append(_numgen_key(i) + data)
    set_id = batch.new_anonymous_id()
    if batch.anonymous_names is None:
        text = "__map%d"
    else:
        number = batch.anonymous_names.get(family, 0)
        batch.anonymous_names[family] = number + 1
        text = f"__map{number}"
    name = _name(2, text)
    batch.add(
        MSG_NEWSET,
        _NEW,
        family,
        line,
        t,
        name,
        _u32(3, NFT_SET_ANONYMOUS | NFT_SET_CONSTANT | NFT_SET_MAP),
        _u32(4, TYPE_INTEGER),
        _u32(5, 4),
        _u32(6, NFT_DATA_VERDICT),
        _u32(7, 0),
        _u32(10, set_id),
        nested(9, _u32(1, modulus)),
        attr(13, _NUMGEN_MAP_UDATA),
    )
    for chunk in _element_chunks(elements):
        batch.add(MSG_NEWSETELEM, _NEW, family, line, t, name, _u32(4, set_id), nested(3, *chunk))
    return [
        _expr("numgen", _u32(1, 1), _u32(2, modulus), _u32(3, NFT_NG_RANDOM), _u32(4, 0)),
        _expr("lookup", _u32(2, 1), _u32(3, 0), _name(1, text), _u32(4, set_id)),
    ]


def _element_key(family: int, container: str, key: str) -> bytes:
    parts = CONTAINER_KEYS.get(container)
    words = key.split(" . ")
    if parts is None or len(words) != len(parts):
        raise Unsupported(f"element {key!r} of {container}")
    out = b""
    for part, word in zip(parts, words, strict=True):
        if part == "addr":
            out += _pack_addr(family, word)
        elif part == "proto":
            if word not in PROTOCOLS:
                raise Unsupported(word)
            out += bytes([PROTOCOLS[word], 0, 0, 0])
        else:
            if not word.isdigit() or int(word) > 65535:
                raise Unsupported(word)
            out += struct.pack(">H", int(word)) + b"\0\0"
    return out


def _element(
    batch: _Batch, verb: str, family: int, line: str, table: str, container: str, rest: str
) -> None:
    m = _ELEMENT.match(rest)
    if m is None or verb == "flush":
        raise Unsupported(line)
    key, comment, verdict = m.groups()
    inner = _value(1, _element_key(family, container, key))
    if verb == "add":
        if verdict:
            code, chain = _verdict_words(verdict.split(" "))
            inner += _verdict(2, code, chain)
        if comment:
            inner += attr(6, _comment_udata(comment))
        kind, flags = MSG_NEWSETELEM, _NEW
    else:
        if comment or verdict:
            raise Unsupported(line)
        kind, flags = MSG_DELSETELEM, NLM_F_REQUEST
    set_id = batch.set_ids.get((family, container))
    batch.add(
        kind,
        flags,
        family,
        line,
        _str(1, table),
        _str(2, container),
        _u32(4, set_id) if set_id is not None else b"",
        nested(3, nested(1, inner)),
    )


def encode_batch(messages: Iterable[Message], first_seq: int = 1) -> tuple[bytes, dict[int, str]]:
    """The batch as sent (begin, messages, end), and each message's command by sequence."""
    seq = first_seq
    out = [nl.batch_begin(seq, NFNL_SUBSYS_NFTABLES)]
    lines = {}
    base = NFNL_SUBSYS_NFTABLES << 8
    header = NFNL_HEADER.pack
    for msg in messages:
        seq += 1
        lines[seq] = msg.line
        size = 20 + len(msg.body)
        out.append(header(size, base | msg.kind, msg.flags, seq, 0, msg.family, 0, 0))
        out.append(msg.body)
        out.append(PAD[size & 3])
    seq += 1
    out.append(nl.batch_end(seq, NFNL_SUBSYS_NFTABLES))
    return b"".join(out), lines


class NetlinkError(Exception):
    """The kernel refused the batch (nothing of it was applied)."""


# --- the socket -----------------------------------------------------------------------------------


_SO_SNDBUFFORCE = 32


class NftNetlink:
    """One NETLINK_NETFILTER socket (in the backend's netns), kept open between syncs."""

    def __init__(self, netns: str | None) -> None:
        self.netns = netns
        self._sock: socket.socket | None = None
        self._seq = 0
        self._sndbuf = 0

    def connect(self) -> None:
        """Open the socket now (OSError if it cannot be had: no netns, no permission)."""
        self._socket()

    def _socket(self) -> socket.socket:
        if self._sock is None:
            sock = nl.open_socket(nl.NETLINK_NETFILTER, self.netns)
            self._sndbuf = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) // 2
            self._sock = sock
        return self._sock

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def apply(self, messages: list[Message]) -> None:
        """Send ``messages`` as one batch; NetlinkError (nothing applied) if the kernel refused."""
        sock = self._socket()
        # Replies from an earlier batch (there should be none) must not be taken for this one's.
        nl.queued_errors(sock)
        first = self._seq + 1
        data, lines = encode_batch(messages, first)
        self._seq = first + len(messages) + 1
        if len(data) + 1024 > self._sndbuf:
            # One datagram: the socket's send buffer must hold the whole batch (as nft does).
            self._sndbuf = len(data) + 65536
            try:
                sock.setsockopt(socket.SOL_SOCKET, _SO_SNDBUFFORCE, self._sndbuf)
            except OSError:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._sndbuf)
        try:
            sock.send(data)
        except OSError as err:
            self.close()
            raise NetlinkError(f"sending the batch failed: {err}") from err
        # The kernel processes (and commits or aborts) the batch inside sendmsg(): any error is
        # queued by now. No reply means everything was applied (nft reads the same way).
        errors = []
        for seq, code in nl.queued_errors(sock):
            if code != 0 and (first <= seq <= self._seq or seq == -1):
                what = lines.get(seq, "the batch")
                errors.append(f"{os.strerror(-code)}: {what}")
        if errors:
            raise NetlinkError("; ".join(errors[:5]))

    def tables(self) -> list[tuple[str, str]]:
        """Every table of the netns, (family, name) in the kernel's order: what ``nft list
        tables`` prints, from one dump (nft builds its whole cache first, 0.3 s with 1,000
        Services' rules loaded). NetlinkError if the kernel refuses the dump."""
        out: list[tuple[str, str]] = []
        for message in self._dump(MSG_GETTABLE, MSG_NEWTABLE, 0, b"", "the tables"):  # 0: all
            name = nl.string_attr(message, NFTA_TABLE_NAME, 4)
            if name is not None:
                out.append((FAMILY_NAMES.get(message[0], str(message[0])), name))
        return out

    def set_names(self, family: str, table: str) -> list[str]:
        """The names of every set and map of ``table`` (anonymous ones included), from one
        dump (none if there is no such table); NetlinkError if the kernel refuses it."""
        request = _str(NFTA_SET_TABLE, table)
        out = []
        messages = self._dump(MSG_GETSET, MSG_NEWSET, FAMILIES[family], request, table, True)
        for message in messages:
            name = nl.string_attr(message, NFTA_SET_NAME, 4)
            if name is not None:
                out.append(name)
        return out

    def rules(self, family: str, table: str, chain: str | None = None) -> dict[str, list[bytes]]:
        """Every rule of ``table`` (or of its ``chain`` alone), by chain, in order: each rule
        undecoded, as the kernel encodes it after its table and chain (handle, position,
        expressions, comment). From one dump; none where the table or chain does not exist.
        NetlinkError if the kernel refuses the dump. Read here, not through ``_dump``: a
        table of 1,000 Services holds 20,000 rules, and only their chain's name is read."""
        request = _str(NFTA_RULE_TABLE, table)
        if chain is not None:
            request += _str(NFTA_RULE_CHAIN, chain)
        sock = self._socket()
        nl.queued_errors(sock)
        self._seq += 1
        seq = self._seq
        base = NFNL_SUBSYS_NFTABLES << 8
        dump = NLM_F_REQUEST | NLM_F_DUMP
        sock.send(nl.nfnl_message(base | MSG_GETRULE, dump, seq, FAMILIES[family], request))
        wanted = base | MSG_NEWRULE
        length = nl.NLA.unpack_from
        out: dict[bytes, list[bytes]] = {}
        name, rules = b"", []
        while True:
            data = sock.recv(1 << 16)
            for kind, _flags, got, off, size in nl.messages(data):
                if got != seq:
                    continue
                if kind == wanted:
                    # nfgenmsg, then the table's attribute and the chain's (the kernel's order)
                    pos = off + nl.NFNL_HEADER.size
                    pos += (length(data, pos)[0] + 3) & ~3
                    chain_len, chain_kind = length(data, pos)
                    if chain_kind != NFTA_RULE_CHAIN:
                        raise NetlinkError(f"listing the rules of {table}: no chain first")
                    found = data[pos + 4 : pos + chain_len - 1]
                    if found != name:
                        name, rules = found, out.setdefault(found, [])
                    rules.append(data[pos + ((chain_len + 3) & ~3) : off + size])
                elif kind == nl.NLMSG_DONE:
                    return {n.decode("utf-8", "replace"): r for n, r in out.items()}
                elif kind == nl.NLMSG_ERROR:
                    code = nl.error_code(data, off)
                    if code and code != -errno.ENOENT:
                        raise NetlinkError(
                            f"listing the rules of {table} failed: {os.strerror(-code)}"
                        )
                    return {n.decode("utf-8", "replace"): r for n, r in out.items()}

    def generation(self) -> int:
        """The ruleset generation of the socket's netns: nf_tables bumps it at every committed
        transaction, of any table and any writer. NetlinkError if the kernel refuses."""
        sock = self._socket()
        nl.queued_errors(sock)
        self._seq += 1
        seq = self._seq
        kind = (NFNL_SUBSYS_NFTABLES << 8) | MSG_GETGEN
        sock.send(nl.nfnl_message(kind, nl.NLM_F_REQUEST, seq, 0, b""))
        code, answers = nl.answers(sock, seq, dump=False)
        if code:
            raise NetlinkError(f"reading the ruleset generation failed: {os.strerror(-code)}")
        wanted = (NFNL_SUBSYS_NFTABLES << 8) | MSG_NEWGEN
        for answer in answers:
            if nl.HEADER.unpack_from(answer)[1] != wanted:
                continue
            for found, start, stop in nl.attributes(answer, nl.NFNL_HEADER.size, len(answer)):
                if found == NFTA_GEN_ID and stop - start == 4:
                    return int.from_bytes(answer[start:stop], "big")
        raise NetlinkError("the kernel's answer holds no ruleset generation")

    def _dump(
        self, ask: int, answer: int, family: int, body: bytes, what: str, missing_ok: bool = False
    ) -> list[bytes]:
        """The ``answer`` messages (nfgenmsg and attributes) of a dump request ``ask``;
        ``missing_ok``: none where what it names does not exist."""
        sock = self._socket()
        nl.queued_errors(sock)
        self._seq += 1
        seq = self._seq
        kind = (NFNL_SUBSYS_NFTABLES << 8) | ask
        sock.send(nl.nfnl_message(kind, NLM_F_REQUEST | NLM_F_DUMP, seq, family, body))
        code, answers = nl.answers(sock, seq)
        if code and not (missing_ok and code == -errno.ENOENT):
            raise NetlinkError(f"listing {what} failed: {os.strerror(-code)}")
        wanted = (NFNL_SUBSYS_NFTABLES << 8) | answer
        return [
            m[nl.HEADER.size :]
            for m in answers
            if len(m) >= NFNL_HEADER.size and nl.HEADER.unpack_from(m)[1] == wanted
        ]


__all__ = [
    "Message",
    "NetlinkError",
    "NftNetlink",
    "Unsupported",
    "compile_transaction",
    "encode_batch",
]
