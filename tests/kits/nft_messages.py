"""What nft itself sends for a transaction: its ``--debug=mnl`` dump, parsed back into
netlink messages (type and body bytes), to compare with kubeplex's own encoder."""

from __future__ import annotations

import re
import subprocess
from typing import Any

from kubeplex.backends.nftables import netlink

_HEADER_TYPE = re.compile(r"^\| (\d{5}) \| [-RMAE]{4} \|")
_ATTR = re.compile(r"^\|(\d{5})\|([-N])([-B])\|(\d{5})\|")
_DATA = re.compile(r"^\| ([0-9a-f]{2}) ([0-9a-f]{2}) ([0-9a-f]{2}) ([0-9a-f]{2})  \|")
_COLOR = re.compile(r"\x1b\[[0-9;]*m")
BATCH_BEGIN, BATCH_END = 16, 17


def parse_mnl_dump(text: str) -> list[tuple[int, bytes]]:
    """(netlink message type, body after the nfgenmsg header) of every message inside the
    batch (not its begin/end markers, nor the cache requests before it), in order."""
    messages: list[tuple[int, bytearray]] = []
    body: bytearray | None = None
    extra_seen = in_batch = False
    for raw in text.splitlines():
        line = _COLOR.sub("", raw)
        if m := _HEADER_TYPE.match(line):
            kind = int(m.group(1))
            in_batch = (in_batch or kind == BATCH_BEGIN) and kind != BATCH_END
            body = bytearray() if in_batch and kind != BATCH_BEGIN else None
            extra_seen = False
            if body is not None:
                messages.append((kind, body))
        elif body is None:
            continue
        elif m := _ATTR.match(line):
            kind = int(m.group(4)) | (0x8000 if m.group(2) == "N" else 0)
            kind |= 0x4000 if m.group(3) == "B" else 0
            body += int(m.group(1)).to_bytes(2, "little") + kind.to_bytes(2, "little")
        elif m := _DATA.match(line):
            if not extra_seen and "extra header" in line:
                extra_seen = True  # the nfgenmsg (family, version, resource id)
                continue
            body += bytes(int(g, 16) for g in m.groups())
    return [(kind, bytes(b)) for kind, b in messages]


def nft_messages(netns: str, text: str) -> list[tuple[int, bytes]]:
    """Apply ``text`` with nft in ``netns`` and return the messages nft sent."""
    proc = subprocess.run(
        ["ip", "netns", "exec", netns, "nft", "--debug=mnl", "-f", "-"],
        input=text,
        capture_output=True,
        text=True,
        check=True,
    )
    return parse_mnl_dump(proc.stdout + proc.stderr)


def canonical(body: bytes) -> bytes:
    """``body`` with zeros in every attribute's padding (nft leaves whatever memory held)."""
    out = bytearray()
    off = 0
    while off + 4 <= len(body):
        size = int.from_bytes(body[off : off + 2], "little")
        kind = int.from_bytes(body[off + 2 : off + 4], "little")
        value = body[off + 4 : off + size]
        if kind & 0x8000:
            value = canonical(value)
        out += body[off : off + 4] + value + b"\0" * (-size % 4)
        off += (size + 3) & ~3
    return bytes(out)


def assert_encoded_as_nft(messages: list[Any], text: str, netns: str) -> None:
    """``messages`` (netlink.compile_transaction of ``text``) are what nft sends for ``text``:
    byte for byte, but for the padding nft leaves uninitialized and the order of a set's
    elements (nft's --debug=mnl dump, taken applying ``text`` in ``netns``)."""
    theirs = nft_messages(netns, text)
    assert len(messages) == len(theirs)
    mine = [((netlink.NFNL_SUBSYS_NFTABLES << 8) | m.kind, m.body) for m in messages]
    nfts = [(kind, canonical(body)) for kind, body in theirs]
    assert _element_runs_sorted(mine) == _element_runs_sorted(nfts)


def _element_runs_sorted(messages: list[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
    """nft reorders consecutive elements of one set among themselves: compare such runs as
    sorted lists (a set's elements have no order)."""
    out: list[tuple[int, bytes]] = []
    run: list[tuple[int, bytes]] = []
    for kind, body in [*messages, (-1, b"")]:
        if run and (kind != run[0][0] or body[:40] != run[0][1][:40]):
            out += sorted(run) if run[0][0] & 0xFF == 12 else run
            run = []
        run.append((kind, body))
    return out
