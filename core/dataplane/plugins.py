"""Finding and trusting dataplane backends.

Backends register in the ``kubeplex.backends`` entry-point group. kubeplex runs as root with
CAP_NET_ADMIN, so being installed is not enough: a backend is loaded only if the trust list
(``plugins.toml``) lists its mode with the exact entry point (``module:attr``) that registered
it. Any other entry point, an unlisted mode or a second package claiming a listed mode, is
refused **without being imported**: listing and refusing use entry-point metadata alone.

The trust list also declares what each backend needs on a node (platform, executables, kernel
modules, ``/proc`` paths, minimal kernel version) and what it can do (capabilities), so
``kubeplex backends`` can say all of it without importing anything it does not trust.

Which list is in effect, first found wins: ``--plugins FILE`` (:func:`use_trust_file`), the
``KUBEPLEX_PLUGINS`` environment variable, ``/etc/kubeplex/plugins.toml``, and the packaged
default ``kubeplex/core/dataplane/plugins.toml``. A list replaces the default, it does not add
to it.

This module holds the list in effect, the loader (the only user of stevedore) and the survey;
the list's format is in ``trust``, the file a command line chose in ``trustfile``, the node
checks in ``requirements`` and the metadata of installed entry points in ``entrypoints``,
whose names are importable from here as well.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint
from importlib.resources import files
from pathlib import Path
from types import MappingProxyType
from typing import Any

from stevedore import DriverManager

from kubeplex.core.dataplane.backend import Backend, BackendContext
from kubeplex.core.dataplane.entrypoints import BUILTIN_MODES as BUILTIN_MODES
from kubeplex.core.dataplane.entrypoints import GROUP as GROUP
from kubeplex.core.dataplane.entrypoints import available as available
from kubeplex.core.dataplane.entrypoints import installed as installed
from kubeplex.core.dataplane.entrypoints import known_modes as known_modes
from kubeplex.core.dataplane.entrypoints import origin_of as origin_of
from kubeplex.core.dataplane.entrypoints import target_of as target_of
from kubeplex.core.dataplane.requirements import kernel_module_available as kernel_module_available
from kubeplex.core.dataplane.requirements import missing_on_node as missing_on_node
from kubeplex.core.dataplane.requirements import this_platform as this_platform
from kubeplex.core.dataplane.trust import KNOWN_CAPABILITIES as KNOWN_CAPABILITIES
from kubeplex.core.dataplane.trust import PLATFORMS as PLATFORMS
from kubeplex.core.dataplane.trust import SCHEMA_VERSION as SCHEMA_VERSION
from kubeplex.core.dataplane.trust import Requirements as Requirements
from kubeplex.core.dataplane.trust import TrustedBackend as TrustedBackend
from kubeplex.core.dataplane.trust import TrustList as TrustList
from kubeplex.core.dataplane.trust import parse_trust_list as parse_trust_list
from kubeplex.core.dataplane.trustfile import ENV_VAR as ENV_VAR
from kubeplex.core.dataplane.trustfile import SYSTEM_TRUST_FILE as SYSTEM_TRUST_FILE
from kubeplex.core.dataplane.trustfile import selected
from kubeplex.core.dataplane.trustfile import trusting as trusting
from kubeplex.core.dataplane.trustfile import use_trust_file as use_trust_file
from kubeplex.core.model.errors import FieldError, InvalidObject, KubeplexError

#: The packaged default, inside the ``kubeplex.core`` package.
PACKAGED_NAME = "plugins.toml"


class BackendRefused(KubeplexError):
    """An installed backend that the trust list does not allow (it was not imported)."""


# ------------------------------------------------------------------------- which list is used


def packaged_trust_file() -> str:
    """Where the packaged default lives (inside the installed ``kubeplex.core`` package)."""
    return str(files("kubeplex.core.dataplane") / PACKAGED_NAME)


def trust_file() -> tuple[str, str]:
    """The trust list in effect: (path, origin)."""
    chosen = selected()
    if chosen is not None:
        return str(chosen), "--plugins"
    env = os.environ.get(ENV_VAR, "")
    if env:
        return env, f"${ENV_VAR}"
    if SYSTEM_TRUST_FILE.is_file():
        return str(SYSTEM_TRUST_FILE), "operator's file"
    return packaged_trust_file(), "packaged default"


def load_trust_list(path: str | os.PathLike[str] | None = None) -> TrustList:
    """Read the trust list: ``path`` if given, else the one in effect (:func:`trust_file`)."""
    if path is not None:
        where, origin = str(path), "given"
    else:
        where, origin = trust_file()
    if origin == "packaged default":
        try:
            text = (files("kubeplex.core.dataplane") / PACKAGED_NAME).read_text(encoding="utf-8")
        except OSError as err:
            raise InvalidObject(
                f"trust list {where} ({origin})",
                [FieldError("", f"missing from the installed package ({err.strerror})")],
            ) from err
        return parse_trust_list(text, where, origin)
    file = Path(where)
    try:
        info = file.stat()
        text = file.read_text(encoding="utf-8")
    except OSError as err:
        raise InvalidObject(
            f"trust list {where} ({origin})", [FieldError("", f"cannot read: {err.strerror}")]
        ) from err
    if sys.platform != "win32" and info.st_mode & stat.S_IWOTH:
        raise InvalidObject(
            f"trust list {where} ({origin})",
            [FieldError("", "writable by every user; a trust list must not be (chmod o-w)")],
        )
    return parse_trust_list(text, where, origin)


# ------------------------------------------------------------------------- the list, asked


def missing_requirements(
    mode: str, backend: Backend | None = None, trust: TrustList | None = None
) -> list[str]:
    """What this node lacks for ``mode``: the trust list's declaration, then the backend's own
    check (if loaded), without repeats."""
    trust = trust if trust is not None else load_trust_list()
    entry = trust.entry(mode)
    found = missing_on_node(entry) if entry is not None else []
    if backend is not None:
        found += backend.missing_requirements()
    return list(dict.fromkeys(found))


def backend_options(mode: str, trust: TrustList | None = None) -> Mapping[str, Any]:
    """The ``[backends.MODE.options]`` table of the trust list in effect (empty if none):
    backend-specific settings that have no place in KubeProxyConfiguration."""
    trust = trust if trust is not None else load_trust_list()
    entry = trust.entry(mode)
    return entry.options if entry is not None else MappingProxyType({})


# ------------------------------------------------------------------------------ the loader


def allow_hint(mode: str, target: str, trust: TrustList) -> str:
    """How to allow an installed backend: the file to edit and the entry to add."""
    if trust.is_packaged_default:
        where = (
            f"copy {trust.where} to {SYSTEM_TRUST_FILE} (read instead of the packaged default "
            f"when present; or pass a file with --plugins FILE or {ENV_VAR}=FILE) and add"
        )
    else:
        where = f"add to {trust.where}"
    return (
        f"To allow it, {where}:\n\n"
        f"[backends.{mode}]\n"
        f'entry-point = "{target}"\n'
        f'platform = "{this_platform()}"\n'
        'capabilities = []  # what it supports, e.g. "session-affinity", "ipv6"\n'
    )


def select_entry_point(mode: str, trust: TrustList) -> EntryPoint:
    """The one entry point of ``mode`` the trust list allows; nothing is imported."""
    claimants = installed(mode)
    entry = trust.entry(mode)
    listed_in = f"{trust.where} ({trust.origin})"
    if entry is None:
        if not claimants:
            names = ", ".join(sorted(available())) or "none"
            raise KubeplexError(
                f"mode {mode!r}: no backend installed for it (installed: {names}), and the "
                f"trust list {listed_in} does not list it"
            )
        ep = claimants[0]
        others = "".join(
            f"; also claimed by {target_of(o)} from {origin_of(o)}" for o in claimants[1:]
        )
        raise BackendRefused(
            f"backend {mode!r} is installed ({target_of(ep)} from {origin_of(ep)}{others}) but "
            f"not listed in the trust list {listed_in}; kubeplex runs as root and loads only "
            f"the backends listed there, so it was not imported. "
            + allow_hint(mode, target_of(ep), trust)
        )
    for ep in claimants:
        if target_of(ep) == entry.entry_point:
            return ep
    if not claimants:
        names = ", ".join(sorted(available())) or "none"
        raise KubeplexError(
            f"mode {mode!r}: listed in {listed_in} as {entry.entry_point}, but no backend is "
            f"installed for it (installed: {names})"
        )
    found = ", ".join(f"{target_of(ep)} from {origin_of(ep)}" for ep in claimants)
    raise BackendRefused(
        f"backend {mode!r}: the installed entry point ({found}) is not the one listed in "
        f"{listed_in} ({entry.entry_point}); refused, and not imported. If you trust it, change "
        f"entry-point of [backends.{mode}] in that file."
    )


class _TrustedDriver(DriverManager):  # type: ignore[type-arg]
    """stevedore's driver loader, shown only the one entry point the trust list allows.

    A plain DriverManager imports every installed package that claims the mode's name before
    choosing; this one never sees the others.
    """

    def __init__(self, ep: EntryPoint) -> None:
        self._trusted = ep
        super().__init__(GROUP, ep.name, invoke_on_load=False, on_load_failure_callback=_reraise)

    def list_entry_points(self) -> list[EntryPoint]:
        return [self._trusted]


def _reraise(_manager: object, _ep: EntryPoint, err: BaseException) -> None:
    raise err


def load_backend_class(mode: str, trust: TrustList | None = None) -> type[Backend]:
    """Import the trusted backend class of ``mode`` (and nothing else), through stevedore."""
    trust = trust if trust is not None else load_trust_list()
    ep = select_entry_point(mode, trust)
    try:
        cls = _TrustedDriver(ep).driver
    except Exception as err:  # a plugin's import error, whatever it is
        raise KubeplexError(
            f"backend {mode!r} ({target_of(ep)} from {origin_of(ep)}) failed to import: {err!r}"
        ) from err
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise KubeplexError(
            f"backend {mode!r}: entry point {target_of(ep)} is not a kubeplex Backend class"
        )
    return cls


def load_backend(mode: str, ctx: BackendContext, trust: TrustList | None = None) -> Backend:
    """Construct the backend of ``mode`` if the trust list allows it.

    Raises :class:`BackendRefused` for an unlisted mode or an entry point other than the one
    listed (neither is imported), ``KubeplexError`` if the backend fails to import or start.
    Requirements are not checked here (``render`` works anywhere): see
    :func:`missing_requirements`.
    """
    cls = load_backend_class(mode, trust)
    try:
        return cls(ctx)
    except KubeplexError:
        raise
    except Exception as err:
        raise KubeplexError(f"backend {mode!r} failed to start: {err!r}") from err


# ---------------------------------------------------------------------------------- a survey


@dataclass(frozen=True)
class BackendStatus:
    """One line of ``kubeplex backends``."""

    mode: str
    #: "ok", "requirements missing", "refused", "broken" or "not installed".
    status: str
    detail: str = ""
    entry_point: str = ""
    distribution: str = ""
    platforms: tuple[str, ...] = ()
    #: Declared in the trust list (None: unknown, the backend is not listed).
    capabilities: frozenset[str] | None = None
    description: str = ""
    #: Other installed claimants of the mode, never imported.
    ignored: tuple[str, ...] = ()
    #: What the constructed backend says of itself (``Backend.describe``).
    about: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def survey(
    trust: TrustList | None = None,
    context: Callable[[str], BackendContext] | None = None,
) -> list[BackendStatus]:
    """The status of every installed or listed backend, by mode.

    Listed backends are imported (they are trusted) to prove they load and, with ``context``,
    constructed to ask their own ``missing_requirements``; unlisted ones never are.
    """
    trust = trust if trust is not None else load_trust_list()
    modes = sorted({ep.name for ep in installed()} | set(trust.backends))
    return [_status(mode, trust, context) for mode in modes]


def _status(
    mode: str, trust: TrustList, context: Callable[[str], BackendContext] | None
) -> BackendStatus:
    entry = trust.entry(mode)
    claimants = installed(mode)
    base: dict[str, Any] = {}
    if entry is not None:
        base = {
            "entry_point": entry.entry_point,
            "platforms": entry.platforms,
            "capabilities": entry.capabilities,
            "description": entry.description,
        }
    try:
        ep = select_entry_point(mode, trust)
    except BackendRefused as err:
        first = claimants[0]
        base.update(entry_point=target_of(first), distribution=origin_of(first))
        why = "not in the trust list" if entry is None else "entry point differs from the list"
        return BackendStatus(mode, "refused", f"{why}: {err}", **base)
    except KubeplexError as err:
        return BackendStatus(mode, "not installed", str(err), **base)
    base["distribution"] = origin_of(ep)
    ignored = tuple(
        f"{target_of(o)} from {origin_of(o)}" for o in claimants if target_of(o) != target_of(ep)
    )
    try:
        cls = load_backend_class(mode, trust)
    except KubeplexError as err:
        return BackendStatus(mode, "broken", str(err), ignored=ignored, **base)
    backend: Backend | None = None
    if context is not None:
        try:
            backend = cls(context(mode))
        except Exception as err:
            return BackendStatus(
                mode, "broken", f"failed to start: {err!r}", ignored=ignored, **base
            )
    notes = missing_requirements(mode, backend, trust)
    status = "requirements missing" if notes else "ok"
    if backend is not None and backend.capabilities != base["capabilities"]:
        declared = ", ".join(sorted(base["capabilities"])) or "none"
        own = ", ".join(sorted(backend.capabilities)) or "none"
        notes.append(f"capabilities differ: trust list says {declared}, the backend says {own}")
    about = tuple(backend.describe()) if backend is not None else ()
    return BackendStatus(mode, status, "; ".join(notes), ignored=ignored, about=about, **base)


def capability_names(caps: Iterable[str] | None) -> str:
    if caps is None:
        return "?"
    return ", ".join(sorted(caps)) or "-"
