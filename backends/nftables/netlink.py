"""Partial syncs straight to nf_tables over netlink, without nft's cache fetch.

``nft`` (1.0.x) reads the kernel's chains, sets, objects and flowtables back before it applies
an ``add rule``, ``add element`` or ``delete``: one netlink dump of every chain of the netns.
The kernel answers that dump in 32 KiB pieces, each found by walking the chain list from its
start again, so it costs O(chains^2): about 0.6 s at 10,000 Services (110,000 chains), for a
one-endpoint change whose commit takes a fraction of that. (nft 1.1.1 no longer fetches the
chains, but still every set of the table, anonymous ones included.)

This module compiles the commands a *partial* sync writes (chains, their rules, affinity sets,
elements of the fixed maps and deletions) into the very netlink messages nft 1.0.x sends for
them, and sends them as one batch: committed atomically or not at all, like ``nft -f``. The
kernel ends up with the same objects, so ``nft list`` shows exactly what nft would have written
(the encodings were compared with nft 1.0.6's own messages attribute by attribute; the tests
compare the listings of tables written both ways). A line outside that grammar raises
``Unsupported``, and the caller hands the whole transaction to ``nft -f``.
"""

from __future__ import annotations

import ctypes
import errno
import ipaddress
import os
import re
import socket
import struct
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

# --- constants (linux/netfilter/nfnetlink.h, nf_tables.h; libnftnl's udata) ---------------------

NETLINK_NETFILTER = 12
NFNL_SUBSYS_NFTABLES = 10
NFNL_MSG_BATCH_BEGIN = 16
NFNL_MSG_BATCH_END = 17
NLM_F_REQUEST = 0x1
NLM_F_CREATE = 0x400
NLM_F_APPEND = 0x800
NLMSG_ERROR = 2
NLA_F_NESTED = 0x8000

MSG_NEWCHAIN, MSG_DELCHAIN = 3, 5
MSG_NEWRULE, MSG_DELRULE = 6, 8
MSG_NEWSET, MSG_DELSET = 9, 11
MSG_NEWSETELEM, MSG_DELSETELEM = 12, 14

FAMILIES = {"ip": 2, "ip6": 10}
PROTOCOLS = {"tcp": 6, "udp": 17, "sctp": 132}

NFT_JUMP, NFT_GOTO = -3, -4
VERDICTS = {"drop": 0, "accept": 1, "return": -5}
NFT_DATA_VERDICT = 0xFFFFFF00
NFT_SET_ANONYMOUS, NFT_SET_CONSTANT, NFT_SET_MAP = 0x1, 0x2, 0x8
NFT_SET_TIMEOUT, NFT_SET_EVAL = 0x10, 0x20
TYPE_INTEGER, TYPE_IPADDR, TYPE_IP6ADDR = 4, 7, 8
NFT_META_IIFNAME, NFT_META_L4PROTO = 6, 16
NFT_FIB_RESULT_ADDRTYPE, NFTA_FIB_F_SADDR, RTN_LOCAL = 3, 1, 2
NFT_NG_RANDOM = 1
NFT_NAT_DNAT, NF_NAT_RANGE_PROTO_SPECIFIED = 1, 2
NFT_DYNSET_OP_UPDATE = 1
#: libnftnl udata: comments of rules and elements; byte orders of a set's key and data.
UDATA_COMMENT = 0
UDATA_SET_KEYBYTEORDER, UDATA_SET_DATABYTEORDER = 0, 1
UDATA_SET_KEY_TYPEOF, UDATA_SET_DATA_TYPEOF = 4, 6
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


def _attr(kind: int, value: bytes) -> bytes:
    size = 4 + len(value)
    return struct.pack("=HH", size, kind) + value + b"\0" * (-size % 4)


def _nest(kind: int, *parts: bytes) -> bytes:
    return _attr(kind | NLA_F_NESTED, b"".join(parts))


def _str(kind: int, text: str) -> bytes:
    return _attr(kind, text.encode() + b"\0")


def _u32(kind: int, value: int) -> bytes:
    return _attr(kind, struct.pack(">I", value & 0xFFFFFFFF))


def _u64(kind: int, value: int) -> bytes:
    return _attr(kind, struct.pack(">Q", value))


def _host32(value: int) -> bytes:
    return struct.pack("=I", value)


def _value(kind: int, data: bytes) -> bytes:
    """NFTA_*_DATA / key: an nft_data holding a value."""
    return _nest(kind, _attr(1, data))


def _verdict(kind: int, code: int, chain: str = "") -> bytes:
    inner = _u32(1, code) + (_str(2, chain) if chain else b"")
    return _nest(kind, _nest(2, inner))


def _expr(name: str, *parts: bytes) -> bytes:
    return _nest(1, _str(1, name), _nest(2, *parts))


def _udata(kind: int, payload: bytes) -> bytes:
    return bytes([kind, len(payload)]) + payload


def _comment_udata(text: str) -> bytes:
    data = text.encode() + b"\0"
    if len(data) > 255:
        raise Unsupported("comment too long")
    return _udata(UDATA_COMMENT, data)


# --- expressions (as nft 1.0.x linearizes them) ---------------------------------------------------


def _payload(offset: int, length: int) -> bytes:
    return _expr("payload", _u32(1, 1), _u32(2, 1), _u32(3, offset), _u32(4, length))


def _cmp(op: int, data: bytes) -> bytes:
    return _expr("cmp", _u32(1, 1), _u32(2, op), _value(3, data))


def _immediate_verdict(code: int, chain: str = "") -> bytes:
    return _expr("immediate", _u32(1, 0), _verdict(2, code, chain))


def _addr_match(family: int, which: str, negate: bool, text: str) -> list[bytes]:
    """``ip saddr [!=] 10.0.0.0/8``: byte-aligned prefixes load only their bytes."""
    saddr, daddr, size = _ADDR[family]
    offset = saddr if which == "saddr" else daddr
    try:
        net = ipaddress.ip_network(text, strict=False)
    except ValueError as err:
        raise Unsupported(f"not an address: {text}") from err
    if (net.version == 4) != (family == 2) or ("/" not in text and net.prefixlen != size * 8):
        raise Unsupported(f"address {text} of the other family")
    op = 1 if negate else 0
    prefix = net.prefixlen
    packed = net.network_address.packed
    if "/" not in text:
        packed = ipaddress.ip_address(text).packed
        prefix = size * 8
    if prefix == 0:
        raise Unsupported("a /0 prefix")
    if prefix % 8 == 0:
        length = prefix // 8
        return [_payload(offset, length), _cmp(op, packed[:length])]
    mask = net.netmask.packed
    bitwise = _expr(
        "bitwise",
        _u32(1, 1),
        _u32(2, 1),
        _u32(3, size),
        _value(4, mask),
        _value(5, b"\0" * size),
    )
    return [_payload(offset, size), bitwise, _cmp(op, packed)]


def _meta(key: int) -> bytes:
    return _expr("meta", _u32(2, key), _u32(1, 1))


def _iifname(negate: bool, pattern: str) -> list[bytes]:
    wildcard = pattern.endswith("*")
    data = pattern[:-1].encode() if wildcard else pattern.encode().ljust(16, b"\0")
    if not data or len(data) > 16:
        raise Unsupported(f"interface {pattern!r}")
    return [_meta(NFT_META_IIFNAME), _cmp(1 if negate else 0, data)]


# --- commands -------------------------------------------------------------------------------------


@dataclass
class Message:
    kind: int
    flags: int
    family: int
    body: bytes
    #: The command it came from (for error messages).
    line: str = ""


@dataclass
class _Batch:
    messages: list[Message] = field(default_factory=list)
    next_id: int = 1
    #: Sets created in this batch: name -> ID (rules and elements refer to them by both).
    set_ids: dict[tuple[int, str], int] = field(default_factory=dict)

    def add(self, kind: int, flags: int, family: int, line: str, *attrs: bytes) -> None:
        self.messages.append(Message(kind, flags, family, b"".join(attrs), line))

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1


_HEAD = re.compile(
    r"^(add|delete|flush) (chain|rule|set|map|element) (ip6?) (\S+) (\S+)(?: (.*))?$"
)
_SET_SPEC = re.compile(
    r"^\{ type (ipv4_addr|ipv6_addr) ; flags dynamic,timeout ; timeout (\d+)s ; \}$"
)
_COMMENT = re.compile(r'^(.*?) comment "([^"\\]*)"$')
_ELEMENT = re.compile(r'^\{ (.+?)(?: comment "([^"\\]*)")?(?: : (.+))? \}$')
_NUMGEN = re.compile(r"^numgen random mod (\d+) vmap \{ (.+) \}$")
_DNAT = re.compile(r"^dnat to (?:\[([0-9a-fA-F:.]+)\]|([0-9.]+)):(\d+)$")


def compile_transaction(text: str) -> list[Message]:
    """The messages of ``text`` (lines as the renderer writes them), or ``Unsupported``."""
    batch = _Batch()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            _command(batch, line)
    return batch.messages


def _command(batch: _Batch, line: str) -> None:
    m = _HEAD.match(line)
    if m is None:
        raise Unsupported(line)
    verb, kind, fam, table, name, rest = m.groups()
    family = FAMILIES[fam]
    t = _str(1, table)
    if kind == "chain":
        if rest:
            raise Unsupported(line)  # base chains, chain comments: nft's business
        if verb == "add":
            batch.add(MSG_NEWCHAIN, NLM_F_REQUEST | NLM_F_CREATE, family, line, t, _str(3, name))
        elif verb == "flush":
            batch.add(MSG_DELRULE, NLM_F_REQUEST, family, line, t, _str(2, name))
        else:
            batch.add(MSG_DELCHAIN, NLM_F_REQUEST, family, line, t, _str(3, name))
    elif kind in ("set", "map"):
        if verb == "delete" and not rest:
            batch.add(MSG_DELSET, NLM_F_REQUEST, family, line, t, _str(2, name))
        elif verb == "add" and kind == "set" and rest and (s := _SET_SPEC.match(rest)):
            _affinity_set(batch, family, line, table, name, s.group(1), int(s.group(2)))
        else:
            raise Unsupported(line)
    elif kind == "rule":
        if verb != "add" or not rest:
            raise Unsupported(line)
        _rule(batch, family, line, table, name, rest)
    else:
        if not rest:
            raise Unsupported(line)
        _element(batch, verb, family, line, table, name, rest)


def _affinity_set(
    batch: _Batch, family: int, line: str, table: str, name: str, addr: str, timeout: int
) -> None:
    v6 = addr == "ipv6_addr"
    set_id = batch.new_id()
    batch.set_ids[(family, name)] = set_id
    batch.add(
        MSG_NEWSET,
        NLM_F_REQUEST | NLM_F_CREATE,
        family,
        line,
        _str(1, table),
        _str(2, name),
        _u32(3, NFT_SET_TIMEOUT | NFT_SET_EVAL),
        _u32(4, TYPE_IP6ADDR if v6 else TYPE_IPADDR),
        _u32(5, 16 if v6 else 4),
        _u32(10, set_id),
        _u64(11, timeout * 1000),
        _attr(13, _udata(UDATA_SET_KEYBYTEORDER, _host32(BYTEORDER_BIG))),
    )


def _set_ref(batch: _Batch, family: int, name: str) -> bytes:
    """A named set, by name (and by ID when this batch creates it, as nft does)."""
    found = batch.set_ids.get((family, name))
    return _str(1, name) + (_u32(4, found) if found is not None else b"")


def _verdict_words(words: list[str]) -> tuple[int, str]:
    if len(words) == 2 and words[0] in ("jump", "goto"):
        return (NFT_JUMP if words[0] == "jump" else NFT_GOTO), words[1]
    if len(words) == 1 and words[0] in VERDICTS:
        return VERDICTS[words[0]], ""
    raise Unsupported(" ".join(words))


def _rule(batch: _Batch, family: int, line: str, table: str, chain: str, text: str) -> None:
    udata = b""
    if c := _COMMENT.match(text):
        text, comment = c.groups()
        udata = _comment_udata(comment)
    exprs: list[bytes] = []
    fam = "ip6" if family == 10 else "ip"
    words = text.split(" ")
    if n := _NUMGEN.match(text):
        exprs += _numgen_vmap(batch, family, line, table, int(n.group(1)), n.group(2))
        words = []
    while words:
        w = words[0]
        if w == fam and len(words) >= 3 and words[1] in ("saddr", "daddr"):
            if words[2].startswith("@") and words[1] == "saddr":
                exprs.append(_payload(_ADDR[family][0], _ADDR[family][2]))
                exprs.append(_expr("lookup", _u32(2, 1), _set_ref(batch, family, words[2][1:])))
                words = words[3:]
                continue
            negate = words[2] == "!="
            value = words[3] if negate else words[2]
            exprs += _addr_match(family, words[1], negate, value)
            words = words[4:] if negate else words[3:]
        elif w == "iifname" and len(words) >= 2:
            negate = words[1] == "!="
            quoted = words[2] if negate else words[1]
            if not (len(quoted) > 2 and quoted[0] == quoted[-1] == '"'):
                raise Unsupported(line)
            exprs += _iifname(negate, quoted[1:-1])
            words = words[3:] if negate else words[2:]
        elif words[:4] == ["fib", "saddr", "type", "local"]:
            exprs.append(
                _expr(
                    "fib",
                    _u32(3, NFTA_FIB_F_SADDR),
                    _u32(2, NFT_FIB_RESULT_ADDRTYPE),
                    _u32(1, 1),
                )
            )
            exprs.append(_cmp(0, _host32(RTN_LOCAL)))
            words = words[4:]
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
        elif words[:2] == ["meta", "l4proto"] and len(words) == 6 and words[3] == "dnat":
            proto = PROTOCOLS.get(words[2])
            d = _DNAT.match(" ".join(words[3:]))
            if proto is None or d is None:
                raise Unsupported(line)
            exprs += _dnat(family, proto, d.group(1) or d.group(2), int(d.group(3)))
            words = []
        else:
            code, target = _verdict_words(words)
            exprs.append(_immediate_verdict(code, target))
            words = []
    if not exprs:
        raise Unsupported(line)
    batch.add(
        MSG_NEWRULE,
        NLM_F_REQUEST | NLM_F_CREATE | NLM_F_APPEND,
        family,
        line,
        _str(1, table),
        _str(2, chain),
        _nest(4, *exprs),
        _attr(7, udata) if udata else b"",
    )


def _dynset_ref(batch: _Batch, family: int, name: str) -> list[bytes]:
    found = batch.set_ids.get((family, name))
    return [_str(1, name)] + ([_u32(2, found)] if found is not None else [])


def _dnat(family: int, proto: int, addr: str, port: int) -> list[bytes]:
    try:
        packed = ipaddress.ip_address(addr).packed
    except ValueError as err:
        raise Unsupported(addr) from err
    if len(packed) != _ADDR[family][2] or not 0 <= port < 65536:
        raise Unsupported(addr)
    return [
        _meta(NFT_META_L4PROTO),
        _cmp(0, bytes([proto])),
        _expr("immediate", _u32(1, 1), _value(2, packed)),
        _expr("immediate", _u32(1, 2), _value(2, struct.pack(">H", port))),
        _expr(
            "nat",
            _u32(1, NFT_NAT_DNAT),
            _u32(2, family),
            _u32(3, 1),
            _u32(5, 2),
            _u32(7, NF_NAT_RANGE_PROTO_SPECIFIED),
        ),
    ]


#: What nft 1.0.x writes as the userdata of a ``numgen ... vmap`` map: the key's byte order
#: (host), the data's, and "typeof numgen" (expression 1, no attributes) for key and data.
_NUMGEN_MAP_UDATA = (
    _udata(UDATA_SET_KEYBYTEORDER, _host32(BYTEORDER_HOST))
    + _udata(UDATA_SET_DATABYTEORDER, _host32(0))
    + _udata(UDATA_SET_KEY_TYPEOF, _udata(0, _host32(1)) + _udata(1, b""))
    + _udata(UDATA_SET_DATA_TYPEOF, _host32(0))
)


def _numgen_vmap(
    batch: _Batch, family: int, line: str, table: str, modulus: int, body: str
) -> list[bytes]:
    entries = body.split(" , ")
    if modulus < 1 or len(entries) != modulus:
        raise Unsupported(line)
    elements = []
    for i, entry in enumerate(entries):
        key, sep, verdict = entry.partition(" : ")
        if not sep or key != str(i):
            raise Unsupported(line)
        code, chain = _verdict_words(verdict.split(" "))
        elements.append(_nest(i + 1, _value(1, _host32(i)), _verdict(2, code, chain)))
    set_id = batch.new_id()
    t = _str(1, table)
    name = _str(2, "__map%d")
    batch.add(
        MSG_NEWSET,
        NLM_F_REQUEST | NLM_F_CREATE,
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
        _nest(9, _u32(1, modulus)),
        _attr(13, _NUMGEN_MAP_UDATA),
    )
    batch.add(
        MSG_NEWSETELEM,
        NLM_F_REQUEST | NLM_F_CREATE,
        family,
        line,
        t,
        name,
        _u32(4, set_id),
        _nest(3, *elements),
    )
    return [
        _expr("numgen", _u32(1, 1), _u32(2, modulus), _u32(3, NFT_NG_RANDOM), _u32(4, 0)),
        _expr("lookup", _u32(2, 1), _u32(3, 0), _str(1, "__map%d"), _u32(4, set_id)),
    ]


def _element_key(family: int, container: str, key: str) -> bytes:
    parts = CONTAINER_KEYS.get(container)
    words = key.split(" . ")
    if parts is None or len(words) != len(parts):
        raise Unsupported(f"element {key!r} of {container}")
    out = b""
    for part, word in zip(parts, words, strict=True):
        if part == "addr":
            try:
                packed = ipaddress.ip_address(word).packed
            except ValueError as err:
                raise Unsupported(word) from err
            if len(packed) != _ADDR[family][2]:
                raise Unsupported(word)
            out += packed
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
            inner += _attr(6, _comment_udata(comment))
        kind, flags = MSG_NEWSETELEM, NLM_F_REQUEST | NLM_F_CREATE
    else:
        if comment or verdict:
            raise Unsupported(line)
        kind, flags = MSG_DELSETELEM, NLM_F_REQUEST
    batch.add(
        kind,
        flags,
        family,
        line,
        _str(1, table),
        _str(2, container),
        _nest(3, _nest(1, inner)),
    )


# --- the socket -----------------------------------------------------------------------------------


def _nlmsg(kind: int, flags: int, seq: int, family: int, res_id: int, body: bytes) -> bytes:
    payload = struct.pack("=BBH", family, 0, socket.htons(res_id)) + body
    size = 16 + len(payload)
    return struct.pack("=IHHII", size, kind, flags, seq, 0) + payload + b"\0" * (-size % 4)


def encode_batch(messages: Iterable[Message], first_seq: int = 1) -> tuple[bytes, dict[int, str]]:
    """The batch as sent (begin, messages, end), and each message's command by sequence."""
    seq = first_seq
    out = [_nlmsg(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, seq, 0, NFNL_SUBSYS_NFTABLES, b"")]
    lines = {}
    for msg in messages:
        seq += 1
        lines[seq] = msg.line
        kind = (NFNL_SUBSYS_NFTABLES << 8) | msg.kind
        out.append(_nlmsg(kind, msg.flags, seq, msg.family, 0, msg.body))
    seq += 1
    out.append(_nlmsg(NFNL_MSG_BATCH_END, NLM_F_REQUEST, seq, 0, NFNL_SUBSYS_NFTABLES, b""))
    return b"".join(out), lines


class NetlinkError(Exception):
    """The kernel refused the batch (nothing of it was applied)."""


_CLONE_NEWNET = 0x40000000
_SO_SNDBUFFORCE = 32


def _open_socket(netns: str | None) -> socket.socket:
    """A NETLINK_NETFILTER socket in ``netns`` (a socket stays in the netns it was made in)."""
    if netns is None:
        return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    result: list[socket.socket | BaseException] = []

    def opener() -> None:
        # setns() changes the calling thread only: this thread is thrown away afterwards.
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(f"/run/netns/{netns}", os.O_RDONLY | os.O_CLOEXEC)
            try:
                if libc.setns(fd, _CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns {netns}: {os.strerror(err)}")
            finally:
                os.close(fd)
            result.append(socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER))
        except BaseException as err:  # handed to the caller's thread
            result.append(err)

    thread = threading.Thread(target=opener, name=f"netns-{netns}", daemon=True)
    thread.start()
    thread.join()
    found = result[0]
    if isinstance(found, BaseException):
        raise found
    return found


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
            sock = _open_socket(self.netns)
            sock.bind((0, 0))
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
        self._drain(sock)
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
        for seq, code in self._drain(sock):
            if code != 0 and (first <= seq <= self._seq or seq == -1):
                what = lines.get(seq, "the batch")
                errors.append(f"{os.strerror(-code)}: {what}")
        if errors:
            raise NetlinkError("; ".join(errors[:5]))

    @staticmethod
    def _drain(sock: socket.socket) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        while True:
            try:
                data = sock.recv(1 << 16, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return out
            except OSError as err:
                if err.errno != errno.ENOBUFS:
                    raise
                # Replies were lost: there were replies, so the batch failed.
                out.append((-1, -errno.ENOBUFS))
                continue
            off = 0
            while off + 16 <= len(data):
                size, kind, _flags, seq, _pid = struct.unpack_from("=IHHII", data, off)
                if kind == NLMSG_ERROR and size >= 20:
                    (code,) = struct.unpack_from("=i", data, off + 16)
                    out.append((seq, code))
                off += max((size + 3) & ~3, 16)


__all__ = [
    "Message",
    "NetlinkError",
    "NftNetlink",
    "Unsupported",
    "compile_transaction",
    "encode_batch",
]
