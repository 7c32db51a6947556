"""The conntrack table over ctnetlink: one dump per protocol, deletions in pipelined batches.

pyroute2's Conntrack builds an object tree for every message and waits for the answer to
each request before it sends the next: for tens of thousands of stale entries that was
nearly all of a cleanup (bench/conntrack_cleanup.py compares the ways with ``conntrack -D``).
Here the few attributes a cleanup reads are decoded straight from the dump (the usual shape
of an entry's tuples with one unpack), and the deletions are sent ``BATCH`` to a write: the
kernel answers
only the ones that fail, and the last one of each batch, which asks for an acknowledgement,
says that all before it were handled (a netlink socket handles a write's messages in order).
Each deletion names the entry's ``CTA_ID`` as well as its tuple, as upstream's do (they
send the dumped entry back): an entry that expired and came back as a new flow with the same
tuple is refused with ``ENOENT`` instead of deleted.
"""

from __future__ import annotations

import errno
import ipaddress
import operator
import os
import socket
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kubeplex.core.dataplane import netlink
from kubeplex.core.dataplane.netlink import (
    HEADER,
    NFNL_HEADER,
    NLA,
    NLA_F_NESTED,
    NLA_TYPE_MASK,
    NLM_F_ACK,
    NLM_F_CREATE,
    NLM_F_DUMP,
    NLM_F_EXCL,
    NLM_F_REQUEST,
    NLMSG_DONE,
    NLMSG_ERROR,
    attr,
    nested,
    nfnl_message,
)
from kubeplex.core.dataplane.netns import NETNS_DIR
from kubeplex.core.model.types import IPFamily

__all__ = [
    "BATCH",
    "ConntrackError",
    "Flow",
    "NetlinkConntrack",
    "delete_message",
    "dump_message",
    "new_message",
    "parse_dump",
]

AF: dict[IPFamily, int] = {IPFamily.IPv4: socket.AF_INET, IPFamily.IPv6: socket.AF_INET6}
#: Deletions per write: the failures a batch can draw (each an skb of under 1 KiB) must fit
#: the socket's default receive buffer (208 KiB), or the kernel drops answers.
BATCH = 128

# linux/netfilter/nfnetlink_conntrack.h
_CT_NEW = 1 << 8 | 0  # NFNL_SUBSYS_CTNETLINK << 8 | IPCTNL_MSG_CT_NEW (a dump's entries too)
_CT_GET = 1 << 8 | 1
_CT_DELETE = 1 << 8 | 2
_CTA_TUPLE_ORIG, _CTA_TUPLE_REPLY, _CTA_TIMEOUT, _CTA_ID, _CTA_ZONE = 1, 2, 7, 12, 18
_CTA_FILTER = 25
_CTA_TUPLE_IP, _CTA_TUPLE_PROTO = 1, 2
_CTA_IP_V4_SRC, _CTA_IP_V4_DST, _CTA_IP_V6_SRC, _CTA_IP_V6_DST = 1, 2, 3, 4
_CTA_PROTO_NUM, _CTA_PROTO_SRC_PORT, _CTA_PROTO_DST_PORT = 1, 2, 3
_CTA_FILTER_ORIG_FLAGS = 1
_CTA_FILTER_FLAG_PROTO_NUM = 1 << 3

_BE16 = struct.Struct(">H")
_BE32 = struct.Struct(">I")
#: nfgenmsg, before a message's attributes.
_NFGEN_SIZE = NFNL_HEADER.size - HEADER.size


@dataclass(frozen=True, slots=True)
class Flow:
    """One conntrack entry: the original and the reply tuple (ports None for portless);
    ``ct_id`` is the kernel's id of the entry (None: delete whichever has the tuple)."""

    proto: int
    orig_src: str
    orig_dst: str
    orig_sport: int | None
    orig_dport: int | None
    reply_src: str
    reply_dst: str
    reply_sport: int | None
    reply_dport: int | None
    zone: int | None = None
    ct_id: int | None = None


class ConntrackError(OSError):
    """The kernel refused a conntrack request (or answered in a way we do not read)."""


# ------------------------------------------------------------------------------- encoding


def _tuple(
    family: int, src: str, dst: str, proto: int, sport: int | None, dport: int | None
) -> bytes:
    v4 = family == socket.AF_INET
    ip = nested(
        _CTA_TUPLE_IP,
        attr(_CTA_IP_V4_SRC if v4 else _CTA_IP_V6_SRC, socket.inet_pton(family, src)),
        attr(_CTA_IP_V4_DST if v4 else _CTA_IP_V6_DST, socket.inet_pton(family, dst)),
    )
    ports = b""
    if sport is not None:
        ports += attr(_CTA_PROTO_SRC_PORT, _BE16.pack(sport))
    if dport is not None:
        ports += attr(_CTA_PROTO_DST_PORT, _BE16.pack(dport))
    return ip + nested(_CTA_TUPLE_PROTO, attr(_CTA_PROTO_NUM, bytes((proto,))), ports)


def _orig(flow: Flow) -> tuple[str, str, int, int | None, int | None]:
    return flow.orig_src, flow.orig_dst, flow.proto, flow.orig_sport, flow.orig_dport


class _Layout:
    """The usual shape of a flow's two tuples in one family: addresses, protocol and both
    ports, as ``ctnetlink_dump_tuples`` writes them first in every dumped entry. A tuple
    pair of that shape is read, and a deletion by tuple and id written, with one (un)pack;
    anything else (a zone in a tuple, no ports) takes the attribute-by-attribute way."""

    def __init__(self, family: int) -> None:
        size = 4 if family == socket.AF_INET else 16
        src, dst = (
            (_CTA_IP_V4_SRC, _CTA_IP_V4_DST) if size == 4 else (_CTA_IP_V6_SRC, _CTA_IP_V6_DST)
        )
        ip_len, proto_len = 4 + 2 * (4 + size), 4 + 3 * 8
        self.tuple_len = 4 + ip_len + proto_len
        #: One tuple: its attribute header, the addresses', the protocol's and ports'. The
        #: ports are in network order (socket.ntohs/htons).
        one = f"HH HH HH{size}s HH{size}s HH HHB3x HHH2x HHH2x"
        self.pair = struct.Struct("=" + one + one)
        self.heads = operator.itemgetter(*_HEADS, *(21 + i for i in _HEADS))
        nest = NLA_F_NESTED
        common = (ip_len, _CTA_TUPLE_IP | nest, 4 + size, src, 4 + size, dst, proto_len,
                  _CTA_TUPLE_PROTO | nest, 5, _CTA_PROTO_NUM, 6, _CTA_PROTO_SRC_PORT, 6,
                  _CTA_PROTO_DST_PORT)  # fmt: skip
        self.tuple_heads = (self.tuple_len, _CTA_TUPLE_ORIG | nest, *common)
        #: What ``heads`` gives for a pair of this shape.
        self.expected = (*self.tuple_heads, self.tuple_len, _CTA_TUPLE_REPLY | nest, *common)
        self.delete = struct.Struct(NFNL_HEADER.format + one + "HHI")

    def decode(
        self, buf: bytes, pos: int, names: dict[bytes, str], zone: int | None, ct_id: int | None
    ) -> Flow | None:
        """The flow whose tuples start at ``pos``, None if they are not of this shape."""
        f = self.pair.unpack_from(buf, pos)
        if self.heads(f) != self.expected:
            return None
        return Flow(
            f[14],
            names.get(f[6]) or _name(names, f[6]),
            names.get(f[9]) or _name(names, f[9]),
            socket.ntohs(f[17]),
            socket.ntohs(f[20]),
            names.get(f[27]) or _name(names, f[27]),
            names.get(f[30]) or _name(names, f[30]),
            socket.ntohs(f[38]),
            socket.ntohs(f[41]),
            zone,
            ct_id,
        )

    def encode_delete(
        self, seq: int, flags: int, family: int, flow: Flow, sport: int, dport: int, ct_id: int
    ) -> bytes:
        """The deletion of a flow with ports (``sport``, ``dport``) and an id, in no zone."""
        h = self.tuple_heads
        return self.delete.pack(
            self.delete.size, _CT_DELETE, flags, seq, 0, family, 0, 0,
            h[0], h[1], h[2], h[3], h[4], h[5], socket.inet_pton(family, flow.orig_src),
            h[6], h[7], socket.inet_pton(family, flow.orig_dst), h[8], h[9], h[10], h[11],
            flow.proto, h[12], h[13], socket.htons(sport), h[14], h[15], socket.htons(dport),
            8, _CTA_ID, socket.htonl(ct_id),
        )  # fmt: skip


#: The header fields of a tuple in ``_Layout.pair`` (the others: addresses, protocol, ports).
_HEADS = (0, 1, 2, 3, 4, 5, 7, 8, 10, 11, 12, 13, 15, 16, 18, 19)
_LAYOUTS: dict[int, _Layout] = {af: _Layout(af) for af in (socket.AF_INET, socket.AF_INET6)}


def _name(names: dict[bytes, str], raw: bytes) -> str:
    """The model's spelling of a packed address (IPv6 compressed), kept in ``names``."""
    name = names[raw] = str(ipaddress.ip_address(raw))
    return name


def delete_message(seq: int, family: int, flow: Flow, *, ack: bool) -> bytes:
    """IPCTNL_MSG_CT_DELETE of one entry, by its original tuple, zone and id."""
    flags = NLM_F_REQUEST | (NLM_F_ACK if ack else 0)
    sport, dport, ct_id = flow.orig_sport, flow.orig_dport, flow.ct_id
    if not flow.zone and sport is not None and dport is not None and ct_id is not None:
        return _LAYOUTS[family].encode_delete(seq, flags, family, flow, sport, dport, ct_id)
    attrs = nested(_CTA_TUPLE_ORIG, _tuple(family, *_orig(flow)))
    if flow.zone:
        attrs += attr(_CTA_ZONE, _BE16.pack(flow.zone))
    if flow.ct_id is not None:
        attrs += attr(_CTA_ID, _BE32.pack(flow.ct_id))
    return nfnl_message(_CT_DELETE, flags, seq, family, attrs)


def new_message(seq: int, family: int, flow: Flow, timeout: int, *, ack: bool) -> bytes:
    """IPCTNL_MSG_CT_NEW of one entry with both its tuples (the reply says where it was
    NATed to), as ``conntrack -I`` makes it."""
    reply = (flow.reply_src, flow.reply_dst, flow.proto, flow.reply_sport, flow.reply_dport)
    attrs = (
        nested(_CTA_TUPLE_ORIG, _tuple(family, *_orig(flow)))
        + nested(_CTA_TUPLE_REPLY, _tuple(family, *reply))
        + attr(_CTA_TIMEOUT, _BE32.pack(timeout))
    )
    if flow.zone:
        attrs += attr(_CTA_ZONE, _BE16.pack(flow.zone))
    flags = NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL | (NLM_F_ACK if ack else 0)
    return nfnl_message(_CT_NEW, flags, seq, family, attrs)


def dump_message(seq: int, family: int, proto: int | None) -> bytes:
    """IPCTNL_MSG_CT_GET dump of one family, filtered by the kernel on ``proto`` if given
    (CTA_FILTER, Linux >= 5.8)."""
    attrs = b""
    if proto is not None:
        attrs = nested(
            _CTA_TUPLE_ORIG, nested(_CTA_TUPLE_PROTO, attr(_CTA_PROTO_NUM, bytes((proto,))))
        ) + nested(
            _CTA_FILTER,
            attr(_CTA_FILTER_ORIG_FLAGS, struct.pack("=I", _CTA_FILTER_FLAG_PROTO_NUM)),
        )
    return nfnl_message(_CT_GET, NLM_F_REQUEST | NLM_F_DUMP, seq, family, attrs)


# ------------------------------------------------------------------------------- decoding

#: A tuple as decoded: (src, dst, proto, sport, dport); None where the kernel sent nothing.
_Tuple = tuple[str | None, str | None, int | None, int | None, int | None]


def _decode_tuple(buf: bytes, pos: int, end: int, names: dict[bytes, str]) -> _Tuple:
    src = dst = None
    proto = sport = dport = None
    for kind, start, stop in netlink.attributes(buf, pos, end):
        if kind == _CTA_TUPLE_IP:
            for ikind, istart, istop in netlink.attributes(buf, start, stop):
                raw = buf[istart:istop]
                if len(raw) not in (4, 16):
                    continue
                if ikind in (_CTA_IP_V4_SRC, _CTA_IP_V6_SRC):
                    src = names.get(raw) or _name(names, raw)
                elif ikind in (_CTA_IP_V4_DST, _CTA_IP_V6_DST):
                    dst = names.get(raw) or _name(names, raw)
        elif kind == _CTA_TUPLE_PROTO:
            for ikind, istart, istop in netlink.attributes(buf, start, stop):
                if ikind == _CTA_PROTO_NUM and istop > istart:
                    proto = buf[istart]
                elif ikind == _CTA_PROTO_SRC_PORT and istop - istart >= 2:
                    sport = _BE16.unpack_from(buf, istart)[0]
                elif ikind == _CTA_PROTO_DST_PORT and istop - istart >= 2:
                    dport = _BE16.unpack_from(buf, istart)[0]
    return src, dst, proto, sport, dport


def _decode_entry(buf: bytes, pos: int, end: int, names: dict[bytes, str]) -> Flow | None:
    layout = _LAYOUTS.get(buf[pos])  # (nfgenmsg's family)
    pos += _NFGEN_SIZE
    if layout is not None and pos + layout.pair.size <= end:
        zone, ct_id = _zone_and_id(buf, pos + layout.pair.size, end)
        flow = layout.decode(buf, pos, names, zone, ct_id)
        if flow is not None:
            return flow
    zone, ct_id = _zone_and_id(buf, pos, end)
    orig = reply = None
    for kind, start, stop in netlink.attributes(buf, pos, end):
        if kind == _CTA_TUPLE_ORIG:
            orig = _decode_tuple(buf, start, stop, names)
        elif kind == _CTA_TUPLE_REPLY:
            reply = _decode_tuple(buf, start, stop, names)
    if orig is None or reply is None:
        return None
    (osrc, odst, proto, osport, odport), (rsrc, rdst, _, rsport, rdport) = orig, reply
    if osrc is None or odst is None or rsrc is None or rdst is None or proto is None:
        return None  # an entry without the parts a Service flow has
    return Flow(proto, osrc, odst, osport, odport, rsrc, rdst, rsport, rdport, zone, ct_id)


def _zone_and_id(buf: bytes, pos: int, end: int) -> tuple[int | None, int | None]:
    """An entry's CTA_ZONE and CTA_ID among its attributes from ``pos`` (the zone comes
    before the id, the id before what a cleanup does not read). Read for every entry, so
    without ``netlink.attributes``, whose generator would cost a third of a listing."""
    zone = None
    while pos + 4 <= end:
        size, kind = NLA.unpack_from(buf, pos)
        if size < 4:
            break
        kind &= NLA_TYPE_MASK
        if kind == _CTA_ID and size >= 8:
            return zone, _BE32.unpack_from(buf, pos + 4)[0]
        if kind == _CTA_ZONE and size >= 6:
            zone = _BE16.unpack_from(buf, pos + 4)[0]
        pos += (size + 3) & ~3
    return zone, None


def parse_dump(data: bytes, seq: int, flows: list[Flow], names: dict[bytes, str]) -> bool:
    """Add the entries of one read of dump ``seq`` to ``flows``; True once the dump ended.
    ``names`` caches the spelling of addresses across reads (a table repeats few)."""
    pos = 0
    while pos + 16 <= len(data):
        size, kind, _flags, got, _pid = HEADER.unpack_from(data, pos)
        if size < 16:
            raise ConntrackError(errno.EPROTO, "conntrack dump: a message shorter than its header")
        end = pos + size
        if got == seq:
            if kind == NLMSG_DONE:
                return True
            if kind == NLMSG_ERROR:
                code = netlink.error_code(data, pos)
                if code:
                    raise ConntrackError(-code, f"conntrack dump: {os.strerror(-code)}")
                return True
            if kind == _CT_NEW:
                flow = _decode_entry(data, pos + 16, end, names)
                if flow is not None:
                    flows.append(flow)
        pos += (size + 3) & ~3
    return False


# ---------------------------------------------------------------------------------- the table


class NetlinkConntrack:
    """The conntrack table of one family over ctnetlink, in ``netns`` if given."""

    #: A dump read and a batch's answers come within this, or the kernel is not answering.
    TIMEOUT = 30.0

    def __init__(self, family: IPFamily, netns: str | None = None) -> None:
        if netns is not None:
            path = netns if "/" in netns else os.path.join(NETNS_DIR, netns)
            if not os.path.exists(path):
                raise FileNotFoundError(f"no network namespace {netns!r}")
        self.family = family
        self.netns = netns
        self._af = AF[family]
        # Failures come back with the failed request's header only, not all of it.
        self._sock = netlink.open_socket(netlink.NETLINK_NETFILTER, netns, cap_ack=True)
        self._sock.settimeout(self.TIMEOUT)
        self._seq = 0
        self._buf = bytearray(1 << 18)

    def _next_seq(self, count: int = 1) -> int:
        first = self._seq + 1
        self._seq += count
        return first

    def flows(self, proto: int) -> list[Flow]:
        """The entries of protocol ``proto``, one dump."""
        try:
            flows = self._dump(proto)
        except ConntrackError as err:
            if err.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                raise
            flows = self._dump(None)  # a kernel without dump filters (before 5.8)
        return [f for f in flows if f.proto == proto]

    def _dump(self, proto: int | None) -> list[Flow]:
        seq = self._next_seq()
        self._sock.send(dump_message(seq, self._af, proto))
        flows: list[Flow] = []
        names: dict[bytes, str] = {}
        view = memoryview(self._buf)
        while True:
            n = self._sock.recv_into(self._buf)
            if parse_dump(bytes(view[:n]), seq, flows, names):
                return flows

    def delete(self, flows: Sequence[Flow]) -> int:
        """Delete ``flows``; how many were deleted (an entry gone already is not counted)."""
        return self._batched(
            flows, errno.ENOENT, lambda seq, flow, ack: delete_message(seq, self._af, flow, ack=ack)
        )

    def add(self, flows: Sequence[Flow], timeout: int) -> int:
        """Create ``flows`` as ``conntrack -I`` does (tests and benchmarks fill tables so);
        how many were created (one that exists already is not counted)."""
        return self._batched(
            flows,
            errno.EEXIST,
            lambda seq, flow, ack: new_message(seq, self._af, flow, timeout, ack=ack),
        )

    def _batched(
        self, flows: Sequence[Flow], expected: int, encode: Callable[[int, Flow, bool], bytes]
    ) -> int:
        """Send one request per flow, ``BATCH`` to a write; how many succeeded (failures with
        errno ``expected`` are not counted, any other stops with an error)."""
        done = 0
        for start in range(0, len(flows), BATCH):
            batch = flows[start : start + BATCH]
            first = self._next_seq(len(batch))
            last = first + len(batch) - 1
            self._sock.send(
                b"".join(encode(first + i, flow, first + i == last) for i, flow in enumerate(batch))
            )
            done += len(batch) - self._failures(first, last, expected)
        return done

    def _failures(self, first: int, last: int, expected: int) -> int:
        """Read a batch's answers up to the last one's; how many failed with ``expected``."""
        codes = netlink.acks(self._sock, first, last, self._buf)
        for code in codes.values():
            if code and code != -expected:
                raise ConntrackError(-code, f"conntrack request: {os.strerror(-code)}")
        return sum(code == -expected for code in codes.values())

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> NetlinkConntrack:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
