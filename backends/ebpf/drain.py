"""What the ebpf mode leaves while established connections drain (``cleanup(drain=True)``, a
switch to another mode).

A connected socket keeps the backend address its connect was given: it needs nothing of the
mode. What does need it is the reverse path: a reply to unconnected UDP sent before the switch
(a DNS query, say) that is read after it, and getpeername, show the Service address only
while the recvmsg and getpeername programs and the reverse NAT maps they read are there. So a
drain detaches and unpins everything else at once (connect and sendmsg: new connections and
datagrams meet the new mode's rules) and keeps the reverse path for ``DRAIN_SECONDS`` from the
first drain, which is as long as the netfilter modes' conntrack keeps an idle UDP flow's NAT
(nf_conntrack_udp_timeout_stream); the first cleanup after that removes it. A socket cookie
cannot be told alive from the maps, so the drain is bounded by time, not by the sockets: a
getpeername after it shows the backend.
"""

from __future__ import annotations

import time
from pathlib import Path

from kubeplex.backends.ebpf import layout
from kubeplex.backends.ebpf.loader import DRAINING, Loader, detach

DRAIN_SECONDS = 120.0
#: The programs and maps replies and getpeername need.
REVERSE_PROGRAMS = ("recvmsg4", "recvmsg6", "getpeername4", "getpeername6")
REVERSE_MAPS = (layout.REVNAT4.name, layout.REVNAT6.name)


def keep_reverse_path(
    loader: Loader, seconds: float = DRAIN_SECONDS
) -> tuple[list[str], list[str]]:
    """(removed, kept): everything but the reverse path goes; the reverse path too once
    ``seconds`` passed since the first drain."""
    if not loader.folder.exists():
        return [], []
    marker = loader.folder / DRAINING
    if not marker.exists():
        marker.mkdir()
    if time.time() - marker.stat().st_mtime >= seconds:
        return loader.cleanup(), []
    removed: list[str] = []
    for program in layout.PROGRAMS:
        pin = loader.links / program
        if program not in REVERSE_PROGRAMS and pin.exists():
            detach(pin)
            removed.append(_unpin(pin))
    for m in layout.MAPS:
        pin = loader.folder / m.name
        if m.name not in REVERSE_MAPS and pin.exists():
            removed.append(_unpin(pin))
    return removed, loader.leftovers()


def _unpin(pin: Path) -> str:
    pin.unlink()
    return str(pin)
