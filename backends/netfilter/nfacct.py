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

from kubeplex.core.dataplane import netlink
from kubeplex.core.dataplane.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_REQUEST

__all__ = ["Nfacct", "NfacctError"]

NFNL_SUBSYS_ACCT = 7
NFNL_MSG_ACCT_NEW = 0
NFNL_MSG_ACCT_GET = 1
NFACCT_NAME = 1
NFACCT_PKTS = 2
#: The longest name with its NUL (linux/netfilter/nfnetlink_acct.h).
NFACCT_NAME_MAX = 32


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
        code, replies = self._request(NFNL_MSG_ACCT_GET, 0, name)
        if code == -errno.ENOENT:
            return None
        if code != 0 or not replies:
            raise NfacctError(-code or errno.EPROTO, f"nfacct get {name}: {_reason(code)}")
        return _packets(replies[0])

    def ensure(self, name: str) -> None:
        """Creates counter ``name`` unless it exists (then it is left as it is, counts kept)."""
        code, _ = self._request(NFNL_MSG_ACCT_NEW, NLM_F_CREATE | NLM_F_ACK, name)
        if code not in (0, -errno.EBUSY):
            raise NfacctError(-code, f"nfacct add {name}: {_reason(code)}")

    def _request(self, kind: int, flags: int, name: str) -> tuple[int, list[bytes]]:
        """Sends one request; (its error code, 0 for none; its replies, whole)."""
        raw = name.encode()
        if not raw or len(raw) >= NFACCT_NAME_MAX or b"\0" in raw:
            raise ValueError(f"nfacct counter name {name!r}: 1-{NFACCT_NAME_MAX - 1} bytes")
        attrs = netlink.attr(NFACCT_NAME, raw + b"\0")
        with self._lock:
            try:
                sock = self._socket()
                self._seq += 1
                seq = self._seq
                msg_type = (NFNL_SUBSYS_ACCT << 8) | kind
                flags |= NLM_F_REQUEST
                sock.send(netlink.nfnl_message(msg_type, flags, seq, socket.AF_UNSPEC, attrs))
                return netlink.answers(sock, seq, dump=False)
            except OSError as err:  # (a timeout too): the next request opens a new socket
                self._drop()
                raise NfacctError(err.errno or errno.EIO, f"nfacct {name}: {err}") from err

    def _socket(self) -> socket.socket:
        if self._sock is None:
            sock = netlink.open_socket(netlink.NETLINK_NETFILTER, self.netns)
            sock.settimeout(5.0)
            self._sock = sock
        return self._sock

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _packets(reply: bytes) -> int:
    """NFACCT_PKTS of a counter message (its attributes follow the nfgenmsg)."""
    for kind, start, stop in netlink.attributes(reply, netlink.NFNL_HEADER.size, len(reply)):
        if kind == NFACCT_PKTS and stop - start >= 8:
            return int(struct.unpack_from(">Q", reply, start)[0])
    raise NfacctError(errno.EPROTO, "nfacct: a counter message without its packets")


def _reason(code: int) -> str:
    return "no answer" if code == 0 else f"{errno.errorcode.get(-code, -code)} ({-code})"
