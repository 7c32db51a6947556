"""Packet marks as upstream kube-proxy spells them in rules."""

from __future__ import annotations


def masquerade_mark(bit: int) -> str:
    """``fmt.Sprintf("%#08x", 1<<bit)``: Go pads the digits (not the "0x") to 8, so 1<<14 is
    ``0x00004000`` where Python's ``f"{v:#08x}"`` gives ``0x004000``."""
    return f"0x{1 << bit:08x}"
