"""The backends installed in the ``kubeplex.backends`` entry-point group, read from package
metadata alone: nothing here imports a backend."""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

GROUP = "kubeplex.backends"
BUILTIN_MODES = ("iptables", "nftables", "ipvs", "kernelspace")


def available() -> dict[str, EntryPoint]:
    """Installed backends by mode name, without importing any of them (one per name: see
    :func:`installed` for every claimant)."""
    return {ep.name: ep for ep in _entry_points()}


def installed(mode: str | None = None) -> list[EntryPoint]:
    """Every installed entry point of the group (of ``mode``), none of them imported."""
    return [ep for ep in _entry_points() if mode is None or ep.name == mode]


def _entry_points() -> list[EntryPoint]:
    # Imported when first asked: importlib.metadata (with the email package) would otherwise
    # be paid at each start, before a daemon's first request to the API server.
    from importlib.metadata import entry_points

    return list(entry_points(group=GROUP))


def known_modes() -> tuple[str, ...]:
    return tuple(sorted(set(BUILTIN_MODES) | set(available())))


class KnownModes(Collection[str]):
    """:func:`known_modes` as a configuration checks its ``mode`` against it: a built-in mode
    is known without reading package metadata, which is read (once) for any other question."""

    def __init__(self) -> None:
        self._all: tuple[str, ...] | None = None

    def _modes(self) -> tuple[str, ...]:
        if self._all is None:
            self._all = known_modes()
        return self._all

    def __contains__(self, mode: object) -> bool:
        return mode in BUILTIN_MODES or mode in self._modes()

    def __iter__(self) -> Iterator[str]:
        return iter(self._modes())

    def __len__(self) -> int:
        return len(self._modes())


def target_of(ep: EntryPoint) -> str:
    """``module:attr`` of an entry point, without extras or spaces."""
    return re.sub(r"\s+", "", ep.value.split("[", 1)[0])


def origin_of(ep: EntryPoint) -> str:
    """The distribution that registered ``ep`` ("name version"), as far as it is known."""
    dist = getattr(ep, "dist", None)
    return f"{dist.name} {dist.version}" if dist is not None else "unknown distribution"
