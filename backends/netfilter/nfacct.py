"""nfacct counters over netlink (nfnetlink_acct), as upstream's nfacct package reads them.

The ``nfacct`` tool costs a process per counter and question: at an iptables-mode start in a
fresh namespace six of them (look, add, look again, for each of two counters), all before the
first sync, and two at each scrape of /metrics. Here each is one request on a socket kept
open: ``NFNL_MSG_ACCT_NEW`` (creating; ``EBUSY`` when the counter exists, which is no error) and
``NFNL_MSG_ACCT_GET`` (its packets, or ``ENOENT``).
"""

from __future__ import annotations

import errno
import socket
import struct
import threading

from kubeplex.backends.netfilter.nfnetlink import open_socket

__all__ = ["Nfacct", "NfacctError"]

NFNL_SUBSYS_ACCT = 7
NFNL_MSG_ACCT_NEW = 0
NFNL_MSG_ACCT_GET = 1
NFACCT_NAME = 1
NFACCT_PKTS = 2
#: The longest name with its NUL (linux/netfilter/nfnetlink_acct.h).
NFACCT_NAME_MAX = 32

_NLM_F_REQUEST = 0x1
_NLM_F_ACK = 0x4
_NLM_F_CREATE = 0x400
_NLMSG_ERROR = 2
_HEADER = struct.Struct("=IHHII")


class NfacctError(OSError):
    """The kernel answered with an error other than the expected ones (or not at all)."""


class Nfacct:
    """The nfacct counters of network namespace ``netns`` (None: this process's)."""

    def __init__(self, netns: str | None = None) -> None:
        self.netns = netns
        self._sock: socket.socket | None = None
        self._seq = 0
        self._lock = threading.Lock()  # a scrape and a sync may ask at once

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None

    def packets(self, name: str) -> int | None:
        """The packets counted by ``name``; None if there is no such counter."""
        code, payloads = self._request(NFNL_MSG_ACCT_GET, 0, name)
        if code == -errno.ENOENT:
            return None
        if code != 0 or not payloads:
            raise NfacctError(-code or errno.EPROTO, f"nfacct get {name}: {_reason(code)}")
        return _packets(payloads[0])

    def ensure(self, name: str) -> None:
        """Creates counter ``name`` unless it exists (then it is left as it is, counts kept)."""
        code, _ = self._request(NFNL_MSG_ACCT_NEW, _NLM_F_CREATE | _NLM_F_ACK, name)
        if code not in (0, -errno.EBUSY):
            raise NfacctError(-code, f"nfacct add {name}: {_reason(code)}")

    def _request(self, kind: int, flags: int, name: str) -> tuple[int, list[bytes]]:
        """Sends one request; (its error code, 0 for none; the payloads of its replies)."""
        raw = name.encode()
        if not raw or len(raw) >= NFACCT_NAME_MAX or b"\0" in raw:
            raise ValueError(f"nfacct counter name {name!r}: 1-{NFACCT_NAME_MAX - 1} bytes")
        attr = raw + b"\0"
        body = struct.pack("=BBH", socket.AF_UNSPEC, 0, 0)  # nfgenmsg: family, version, res_id
        body += struct.pack("=HH", 4 + len(attr), NFACCT_NAME) + attr + b"\0" * (-len(attr) % 4)
        with self._lock:
            try:
                sock = self._socket()
                self._seq += 1
                seq = self._seq
                header = _HEADER.pack(
                    16 + len(body), (NFNL_SUBSYS_ACCT << 8) | kind, _NLM_F_REQUEST | flags, seq, 0
                )
                sock.send(header + body)
                return _replies(sock, seq, wants_ack=bool(flags & _NLM_F_ACK))
            except OSError as err:  # (a timeout too): the next request opens a new socket
                self._drop()
                raise NfacctError(err.errno or errno.EIO, f"nfacct {name}: {err}") from err

    def _socket(self) -> socket.socket:
        if self._sock is None:
            sock = open_socket(self.netns)
            sock.settimeout(5.0)
            self._sock = sock
        return self._sock

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _replies(sock: socket.socket, seq: int, wants_ack: bool) -> tuple[int, list[bytes]]:
    """Reads the answers to request ``seq``: a GET's counter message (then its end, an error
    message with code 0, only if asked), or the error message a refusal or ACK is."""
    payloads: list[bytes] = []
    while True:
        data = sock.recv(1 << 16)
        off = 0
        while off + 16 <= len(data):
            size, kind, _flags, got, _pid = _HEADER.unpack_from(data, off)
            payload = data[off + 16 : off + size]
            off += max((size + 3) & ~3, 16)
            if got != seq:
                continue  # (an earlier request's late answer)
            if kind == _NLMSG_ERROR:
                (code,) = struct.unpack_from("=i", payload)
                return code, payloads
            payloads.append(payload)
        if payloads and not wants_ack:
            return 0, payloads


def _packets(payload: bytes) -> int:
    """NFACCT_PKTS of a counter message (after its nfgenmsg)."""
    off = 4
    while off + 4 <= len(payload):
        length, kind = struct.unpack_from("=HH", payload, off)
        if length < 4:
            break
        if kind & 0x3FFF == NFACCT_PKTS and length >= 12:
            return int(struct.unpack_from(">Q", payload, off + 4)[0])
        off += (length + 3) & ~3
    raise NfacctError(errno.EPROTO, "nfacct: a counter message without its packets")


def _reason(code: int) -> str:
    return "no answer" if code == 0 else f"{errno.errorcode.get(-code, -code)} ({-code})"
