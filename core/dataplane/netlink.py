"""Netlink messages as the kernel reads and writes them, for every encoder of kubeplex.

Each encoder (the nftables mode's transactions, the ipvs mode's IPVS, address and ipset
requests, nfacct counters, the conntrack table) packs its own payloads with ``struct``:
pyroute2's generic encoder builds an object tree per message, which costs a multiple for the
messages a sync sends by the thousand. What they share is here, once: the message header,
attributes, nfnetlink's header and batches, reading the answers to requests (a dump's
messages, acknowledgements, refusals) and the socket, opened in a network namespace.

In the dataplane layer so that the backends and the daemon (conntrack) may both use it.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import struct
from collections.abc import Iterator

from kubeplex.core.dataplane.netns import run_in_netns

__all__ = [
    "ERRNO",
    "HEADER",
    "NFNL_HEADER",
    "NLA",
    "PAD",
    "NetlinkBuffer",
    "acks",
    "answers",
    "attr",
    "attributes",
    "batch_begin",
    "batch_end",
    "error_code",
    "message",
    "messages",
    "nested",
    "nfnl_message",
    "open_socket",
    "queued_errors",
    "string_attr",
]

# linux/netlink.h, linux/netfilter/nfnetlink.h
NETLINK_ROUTE, NETLINK_NETFILTER, NETLINK_GENERIC = 0, 12, 16
NLM_F_REQUEST, NLM_F_MULTI, NLM_F_ACK = 0x1, 0x2, 0x4
NLM_F_DUMP, NLM_F_EXCL, NLM_F_CREATE, NLM_F_APPEND = 0x300, 0x200, 0x400, 0x800
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLA_F_NESTED, NLA_F_NET_BYTEORDER = 0x8000, 0x4000
NLA_TYPE_MASK = 0x3FFF
SOL_NETLINK, NETLINK_CAP_ACK = 270, 10
NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END = 16, 17

#: nlmsghdr: length, type, flags, sequence number, port id.
HEADER = struct.Struct("=IHHII")
#: nlmsghdr followed by nfgenmsg (family, version, resource id in network order).
NFNL_HEADER = struct.Struct("=IHHIIBBH")
#: nlattr: length, type.
NLA = struct.Struct("=HH")
#: An error message's code (0: an acknowledgement), right after its header.
ERRNO = struct.Struct("=i")
#: What brings a length to the next multiple of 4, by the length's last two bits.
PAD = (b"", b"\0\0\0", b"\0\0", b"\0")

#: A buffer to read into, or what was read.
NetlinkBuffer = bytes | bytearray | memoryview


# --- encoding -----------------------------------------------------------------------------


_nla = NLA.pack  # (bound once: attributes are packed by the ten thousand)


def attr(kind: int, payload: bytes) -> bytes:
    """One attribute, padded to 4 bytes (its length says the unpadded size)."""
    size = 4 + len(payload)
    return _nla(size, kind) + payload + PAD[size & 3]


def nested(kind: int, *parts: bytes) -> bytes:
    """An attribute holding attributes."""
    return attr(kind | NLA_F_NESTED, b"".join(parts))


def message(msg_type: int, flags: int, seq: int, payload: bytes) -> bytes:
    """A whole message: the header (port id 0: the kernel's) and the payload, padded."""
    size = HEADER.size + len(payload)
    return HEADER.pack(size, msg_type, flags, seq, 0) + payload + PAD[size & 3]


def nfnl_message(
    msg_type: int, flags: int, seq: int, family: int, payload: bytes, res_id: int = 0
) -> bytes:
    """A netfilter message: the header, nfgenmsg (NFNETLINK_V0) and the payload."""
    size = NFNL_HEADER.size + len(payload)
    head = NFNL_HEADER.pack(size, msg_type, flags, seq, 0, family, 0, socket.htons(res_id))
    return head + payload + PAD[size & 3]


def batch_begin(seq: int, res_id: int) -> bytes:
    """What opens an nfnetlink batch for subsystem ``res_id``: the kernel applies the
    messages up to ``batch_end`` as one transaction, all or nothing."""
    return nfnl_message(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, seq, 0, b"", res_id)


def batch_end(seq: int, res_id: int) -> bytes:
    """What closes (and commits) an nfnetlink batch."""
    return nfnl_message(NFNL_MSG_BATCH_END, NLM_F_REQUEST, seq, 0, b"", res_id)


# --- decoding -----------------------------------------------------------------------------


def messages(
    data: NetlinkBuffer, end: int | None = None
) -> Iterator[tuple[int, int, int, int, int]]:
    """(type, flags, sequence number, offset, length) of each message of one read (up to
    ``end``); a length shorter than a header ends the walk."""
    stop = len(data) if end is None else end
    off = 0
    while off + 16 <= stop:
        size, kind, flags, seq, _pid = HEADER.unpack_from(data, off)
        if size < 16:
            return
        yield kind, flags, seq, off, size
        off += (size + 3) & ~3


def error_code(data: NetlinkBuffer, offset: int) -> int:
    """The code of the error message at ``offset``: 0 for an acknowledgement, else -errno."""
    return int(ERRNO.unpack_from(data, offset + HEADER.size)[0])


def attributes(data: NetlinkBuffer, pos: int, end: int) -> Iterator[tuple[int, int, int]]:
    """(type without its flags, payload start, payload end) of each attribute from ``pos``
    to ``end``; a malformed one ends the walk."""
    while pos + 4 <= end:
        size, kind = NLA.unpack_from(data, pos)
        if size < 4 or pos + size > end:
            return
        yield kind & NLA_TYPE_MASK, pos + 4, pos + size
        pos += (size + 3) & ~3


def string_attr(data: bytes, wanted: int, pos: int = 0) -> str | None:
    """The NUL-terminated string attribute ``wanted`` among the attributes from ``pos``."""
    for kind, start, stop in attributes(data, pos, len(data)):
        if kind == wanted:
            return data[start:stop].split(b"\0", 1)[0].decode("utf-8", "replace")
    return None


# --- requests and their answers -----------------------------------------------------------


def answers(
    sock: socket.socket, seq: int, *, dump: bool = True, size: int = 1 << 16
) -> tuple[int, list[bytes]]:
    """What the kernel answers to request ``seq``: (the code of the error message that ended
    them, 0 for none or an acknowledgement; every other answer, whole). They end with a
    dump's NLMSG_DONE, an error message, an answer not flagged NLM_F_MULTI, or, for a
    request that is no ``dump``, the read that brought its answer (nfnetlink_acct flags a
    get's one answer NLM_F_MULTI). Answers to other requests (an earlier one's, late) are
    skipped."""
    out: list[bytes] = []
    while True:
        data = sock.recv(size)
        for kind, flags, got, off, length in messages(data):
            if got != seq:
                continue
            if kind == NLMSG_DONE:
                return 0, out
            if kind == NLMSG_ERROR:
                return error_code(data, off), out
            out.append(data[off : off + length])
            if not flags & NLM_F_MULTI:
                return 0, out
        if out and not dump:
            return 0, out


def acks(sock: socket.socket, first: int, last: int, buf: bytearray) -> dict[int, int]:
    """The error codes (0: acknowledged) of the answers to requests ``first`` to ``last``,
    read into ``buf`` until ``last``'s: the kernel handles a socket's requests in order, so
    its answer comes after every other one. A request that asked for no acknowledgement and
    succeeded has none."""
    codes: dict[int, int] = {}
    while True:
        n = sock.recv_into(buf)
        for kind, _flags, seq, off, length in messages(buf, n):
            if kind != NLMSG_ERROR or not first <= seq <= last or length < 20:
                continue
            codes[seq] = error_code(buf, off)
            if seq == last:
                return codes


def queued_errors(sock: socket.socket) -> list[tuple[int, int]]:
    """(sequence number, code) of every error message waiting on ``sock``, without waiting
    for more (on a socket without a timeout: Python waits a timeout out). Answers lost to a
    full receive buffer (ENOBUFS) are one (-1, -ENOBUFS)."""
    out: list[tuple[int, int]] = []
    while True:
        try:
            data = sock.recv(1 << 16, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return out
        except OSError as err:
            if err.errno != errno.ENOBUFS:
                raise
            out.append((-1, -errno.ENOBUFS))
            continue
        for kind, _flags, seq, off, length in messages(data):
            if kind == NLMSG_ERROR and length >= 20:
                out.append((seq, error_code(data, off)))


# --- the socket ---------------------------------------------------------------------------


def open_socket(
    proto: int, netns: str | None = None, *, cap_ack: bool = False, buffers: int = 0
) -> socket.socket:
    """A netlink socket of ``proto`` in ``netns`` (None: this process's namespace; a socket
    stays in the namespace it was made in), bound to a port id the kernel picks.
    ``cap_ack``: refusals come back with the refused request's header only, not all of it
    (where the kernel offers it). ``buffers``: its send and receive buffers' size."""

    def make() -> socket.socket:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, proto)
        try:
            if buffers:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffers)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffers)
            if cap_ack:
                with contextlib.suppress(OSError):
                    sock.setsockopt(SOL_NETLINK, NETLINK_CAP_ACK, 1)
            sock.bind((0, 0))
        except OSError:
            sock.close()
            raise
        return sock

    return make() if netns is None else run_in_netns(netns, make)
