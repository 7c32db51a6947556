"""The backends installed in the ``kubeplex.backends`` entry-point group, read from package
metadata alone: nothing here imports a backend."""

from __future__ import annotations

import re
from importlib.metadata import EntryPoint, entry_points

GROUP = "kubeplex.backends"
BUILTIN_MODES = ("iptables", "nftables", "ipvs", "kernelspace")


def available() -> dict[str, EntryPoint]:
    """Installed backends by mode name, without importing any of them (one per name: see
    :func:`installed` for every claimant)."""
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def installed(mode: str | None = None) -> list[EntryPoint]:
    """Every installed entry point of the group (of ``mode``), none of them imported."""
    return [ep for ep in entry_points(group=GROUP) if mode is None or ep.name == mode]


def known_modes() -> tuple[str, ...]:
    return tuple(sorted(set(BUILTIN_MODES) | set(available())))


def target_of(ep: EntryPoint) -> str:
    """``module:attr`` of an entry point, without extras or spaces."""
    return re.sub(r"\s+", "", ep.value.split("[", 1)[0])


def origin_of(ep: EntryPoint) -> str:
    """The distribution that registered ``ep`` ("name version"), as far as it is known."""
    dist = getattr(ep, "dist", None)
    return f"{dist.name} {dist.version}" if dist is not None else "unknown distribution"
