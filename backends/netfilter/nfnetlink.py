"""The NETLINK_NETFILTER socket every netfilter backend talks through, made in the backend's
network namespace (a socket stays in the namespace it was made in)."""

from __future__ import annotations

import os
import socket
import threading

__all__ = ["NETLINK_NETFILTER", "open_socket"]

NETLINK_NETFILTER = 12

_CLONE_NEWNET = 0x40000000


def open_socket(netns: str | None) -> socket.socket:
    """A NETLINK_NETFILTER socket in ``netns`` (None: this process's namespace)."""
    if netns is None:
        return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    result: list[socket.socket | BaseException] = []

    def opener() -> None:
        # setns() changes the calling thread only: this thread is thrown away afterwards.
        try:
            import ctypes  # (only for a namespace: 1.5 ms at a node's start otherwise)

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
