"""The NETLINK_NETFILTER socket every netfilter backend talks through, made in the backend's
network namespace (a socket stays in the namespace it was made in)."""

from __future__ import annotations

import socket

from kubeplex.core.dataplane.netns import run_in_netns

__all__ = ["NETLINK_NETFILTER", "open_socket"]

NETLINK_NETFILTER = 12


def open_socket(netns: str | None) -> socket.socket:
    """A NETLINK_NETFILTER socket in ``netns`` (None: this process's namespace), bound to a
    port id the kernel picks."""

    def make() -> socket.socket:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        try:
            sock.bind((0, 0))
        except OSError:
            sock.close()
            raise
        return sock

    return make() if netns is None else run_in_netns(netns, make)
