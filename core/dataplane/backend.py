"""The contract between the core and a dataplane plugin.

A backend is two steps:

* ``render(state)`` — pure: from the graph (and, for a partial sync, the change set) to the
  rules as a printable value. No system calls, no root: golden-testable anywhere. A backend may
  keep a cache of what it rendered before, to re-render only changed services.
* ``apply(rendered)`` — thin: hands the value to the kernel (iptables-restore, ``nft -f``,
  netlink). It raises ``BackendError`` if the kernel refused; the previous rules must then still
  be in place, and the backend's next render must be a full one.

Backends never learn where objects came from (API server or manifests), and they are found
through the ``kubeplex.backends`` entry-point group, so the core imports none of them.
"""

from __future__ import annotations

import shutil
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from kubeplex.core.config.kubeproxy import KubeProxyConfiguration
from kubeplex.core.model.graph import ProxyState
from kubeplex.core.model.types import IPFamily


@dataclass(frozen=True)
class BackendContext:
    """What a backend is constructed with."""

    config: KubeProxyConfiguration
    node_name: str
    families: tuple[IPFamily, ...] = (IPFamily.IPv4, IPFamily.IPv6)
    #: Run every command inside this network namespace (``ip netns exec``); None: the host's.
    netns: str | None = None


class Rendered(ABC):
    """A backend's rendered rules. ``str()`` is exactly what would be handed to the kernel."""

    @property
    def full(self) -> bool:
        """True if this render rewrites everything, False for a partial (changed services)."""
        return True

    @abstractmethod
    def __str__(self) -> str: ...


@dataclass(frozen=True)
class SyncResult:
    full: bool
    #: Backend-specific counts for metrics and logs (rules written, chains deleted, ...).
    counts: dict[str, int] = field(default_factory=dict)
    #: Services the sync left out, by name ("namespace/name:port"), with the reason: their
    #: rules could not be rendered or the kernel refused them. Everything else was
    #: programmed; their previous rules stay, and the backend retries them on the next sync.
    failed: dict[str, str] = field(default_factory=dict)


class Backend(ABC):
    """Base class of every dataplane plugin."""

    #: The ``mode`` value that selects this backend.
    mode: str = ""
    #: Capabilities, e.g. {"localhost-nodeports", "session-affinity", "sctp", "ipv6"}.
    capabilities: frozenset[str] = frozenset()
    #: Executables this backend needs on the node.
    required_tools: tuple[str, ...] = ()

    def __init__(self, ctx: BackendContext) -> None:
        self.ctx = ctx

    def missing_requirements(self) -> list[str]:
        """What this node lacks for the backend to run (empty: ready)."""
        return [
            f"executable {t!r} not found in PATH"
            for t in self.required_tools
            if not shutil.which(t)
        ]

    def prepare(self) -> None:  # noqa: B027 - optional hook
        """One-time node setup before the first apply (not called by ``kubeplex render``)."""

    @abstractmethod
    def render(self, state: ProxyState) -> Rendered:
        """Rules for ``state``: everything if any change set is full, else the changed services."""

    @abstractmethod
    def apply(self, rendered: Rendered) -> SyncResult:
        """Program the kernel; raise BackendError (leaving the old rules) if it fails."""

    def sync(self, state: ProxyState) -> SyncResult:
        """Render and apply. A backend may override it to isolate failing services: program
        the others and name the failing ones in ``SyncResult.failed``, instead of raising."""
        return self.apply(self.render(state))

    def invalidate(self) -> None:  # noqa: B027 - optional hook
        """Forget render caches: the next render is full (called after a failed apply)."""

    @abstractmethod
    def cleanup(self) -> None:
        """Remove every artifact this backend ever programmed (``kubeplex cleanup``)."""

    def describe(self) -> Sequence[str]:
        """Extra lines for ``kubeplex backends`` (which lists the capabilities already)."""
        return []


class FamilyRenderer(Protocol):
    """What PerFamily needs of a backend's per-family renderer."""

    settings: Any
    #: Set to make the next render a full one.
    force_full: bool


R = TypeVar("R", bound=FamilyRenderer)


class PerFamily(Generic[R]):
    """A backend's renderers, one per IP family, each with the settings it was made for.

    When a family's settings change (a node address, a config value the rules use), the
    renderer takes them and its next render is full: every cached rule may depend on them.
    """

    def __init__(self, make: Callable[[Any], R]) -> None:
        self._make = make
        self._renderers: dict[IPFamily, R] = {}

    def with_settings(self, family: IPFamily, settings: Any) -> R:
        r = self._renderers.get(family)
        if r is None:
            r = self._renderers[family] = self._make(settings)
        elif r.settings != settings:
            r.settings = settings
            r.force_full = True
        return r

    def __getitem__(self, family: IPFamily) -> R:
        return self._renderers[family]

    def __iter__(self) -> Iterator[R]:
        return iter(list(self._renderers.values()))

    def clear(self) -> None:
        """Forget every renderer (after a cleanup: nothing of ours is left to build on)."""
        self._renderers.clear()
