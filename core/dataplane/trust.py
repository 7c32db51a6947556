"""The trust list's format: a ``plugins.toml``, parsed and validated, every problem named.

Which list is in effect, and what it lets load, is :mod:`kubeplex.core.dataplane.plugins`.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from kubeplex.core.model.errors import FieldError, InvalidObject

SCHEMA_VERSION = 1

PLATFORMS = ("linux", "windows")
#: Capabilities kubeplex and its test kit know the meaning of (docs/backends.md). A backend
#: may declare others; these are the ones the core and the conformance kit act on.
KNOWN_CAPABILITIES = frozenset(
    {
        "binds-service-ips",
        "dsr",
        "ipv6",
        "load-balancer-source-ranges",
        "local-policy-fallback",
        "localhost-nodeports",
        "reject-unused-clusterip-ports",
        "render-only",
        "sctp",
        "session-affinity",
        "socket-load-balancing",
    }
)

_MODE_RE = re.compile(r"[a-z0-9][a-z0-9._-]*")
_TARGET_RE = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*")
_CAPABILITY_RE = re.compile(r"[a-z0-9][a-z0-9-]*")
_VERSION_RE = re.compile(r"\d+(\.\d+){0,2}")
_MODULE_RE = re.compile(r"[A-Za-z0-9_-]+")

_ENTRY_KEYS = ("entry-point", "platform", "description", "capabilities", "requires", "options")
_REQUIRES_KEYS = ("executables", "kernel-modules", "paths", "min-kernel")


@dataclass(frozen=True)
class Requirements:
    """What a backend needs on the node it programs (``[backends.MODE.requires]``)."""

    executables: tuple[str, ...] = ()
    kernel_modules: tuple[str, ...] = ()
    #: Files or folders that must exist, e.g. ``/proc/sys/net/ipv4/conf/all/route_localnet``.
    paths: tuple[str, ...] = ()
    #: Minimal kernel release, e.g. "5.13" ("" = any).
    min_kernel: str = ""


@dataclass(frozen=True)
class TrustedBackend:
    """One ``[backends.MODE]`` entry of the trust list."""

    mode: str
    #: The only entry point (``module:attr``) that may provide this mode.
    entry_point: str
    platforms: tuple[str, ...]
    capabilities: frozenset[str] = frozenset()
    requires: Requirements = Requirements()
    description: str = ""
    #: Backend-specific settings (``[backends.MODE.options]``), see :func:`backend_options`.
    options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class TrustList:
    """A parsed ``plugins.toml``; ``where`` is its path, ``origin`` why it is the one used."""

    where: str
    origin: str
    backends: Mapping[str, TrustedBackend]

    def entry(self, mode: str) -> TrustedBackend | None:
        return self.backends.get(mode)

    @property
    def is_packaged_default(self) -> bool:
        return self.origin == "packaged default"


def parse_trust_list(text: str, where: str, origin: str = "") -> TrustList:
    """Parse and validate a trust list; every problem is reported, naming the key."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise InvalidObject(where, [FieldError("", f"not valid TOML: {err}")]) from err
    errs: list[FieldError] = []
    for key in doc:
        if key not in ("version", "backends"):
            errs.append(FieldError(key, "unknown key (known: version, backends)"))
    version = doc.get("version", SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
        errs.append(FieldError("version", f"must be {SCHEMA_VERSION}, got {version!r}"))
    table = doc.get("backends", {})
    backends: dict[str, TrustedBackend] = {}
    if not isinstance(table, dict):
        errs.append(FieldError("backends", "must be a table ([backends.MODE] sections)"))
        table = {}
    for mode, raw in table.items():
        entry = _parse_entry(mode, raw, errs)
        if entry is not None:
            backends[mode] = entry
    if errs:
        raise InvalidObject(where, errs)
    return TrustList(where, origin, MappingProxyType(backends))


def _strings(value: object, path: str, errs: list[FieldError]) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) and v for v in value):
        return tuple(value)
    errs.append(FieldError(path, f"must be a list of non-empty strings, got {value!r}"))
    return ()


def _parse_entry(mode: str, raw: object, errs: list[FieldError]) -> TrustedBackend | None:
    at = f"backends.{mode}"
    if not _MODE_RE.fullmatch(mode):
        errs.append(FieldError(at, "a mode name is lower-case letters, digits, '.', '-', '_'"))
        return None
    if not isinstance(raw, dict):
        errs.append(FieldError(at, "must be a table"))
        return None
    before = len(errs)
    for key in raw:
        if key not in _ENTRY_KEYS:
            errs.append(FieldError(f"{at}.{key}", f"unknown key (known: {', '.join(_ENTRY_KEYS)})"))
    target = raw.get("entry-point")
    if not isinstance(target, str) or not _TARGET_RE.fullmatch(target.strip()):
        errs.append(FieldError(f"{at}.entry-point", f'required, as "module:attr", got {target!r}'))
        target = ""
    if "platform" not in raw:
        errs.append(FieldError(f"{at}.platform", f"required: one of {', '.join(PLATFORMS)}"))
    platforms = _strings(raw.get("platform", "linux"), f"{at}.platform", errs)
    for p in platforms:
        if p not in PLATFORMS:
            errs.append(FieldError(f"{at}.platform", f"{p!r}: not one of {', '.join(PLATFORMS)}"))
    caps = _strings(raw.get("capabilities", []), f"{at}.capabilities", errs)
    for cap in caps:
        if not _CAPABILITY_RE.fullmatch(cap):
            errs.append(FieldError(f"{at}.capabilities", f"{cap!r}: lower-case words with '-'"))
    description = raw.get("description", "")
    if not isinstance(description, str):
        errs.append(FieldError(f"{at}.description", "must be a string"))
        description = ""
    options = raw.get("options", {})
    if not isinstance(options, dict):
        errs.append(FieldError(f"{at}.options", "must be a table"))
        options = {}
    requires = _parse_requires(raw.get("requires", {}), f"{at}.requires", errs)
    if len(errs) > before:
        return None
    return TrustedBackend(
        mode=mode,
        entry_point=target.strip(),
        platforms=platforms,
        capabilities=frozenset(caps),
        requires=requires,
        description=description,
        options=MappingProxyType(dict(options)),
    )


def _parse_requires(raw: object, at: str, errs: list[FieldError]) -> Requirements:
    if not isinstance(raw, dict):
        errs.append(FieldError(at, "must be a table"))
        return Requirements()
    for key in raw:
        if key not in _REQUIRES_KEYS:
            errs.append(
                FieldError(f"{at}.{key}", f"unknown key (known: {', '.join(_REQUIRES_KEYS)})")
            )
    executables = _strings(raw.get("executables", []), f"{at}.executables", errs)
    modules = _strings(raw.get("kernel-modules", []), f"{at}.kernel-modules", errs)
    for m in modules:
        if not _MODULE_RE.fullmatch(m):
            errs.append(FieldError(f"{at}.kernel-modules", f"{m!r}: not a module name"))
    paths = _strings(raw.get("paths", []), f"{at}.paths", errs)
    for p in paths:
        if not p.startswith("/"):
            errs.append(FieldError(f"{at}.paths", f"{p!r}: must be an absolute path"))
    min_kernel = raw.get("min-kernel", "")
    if not isinstance(min_kernel, str) or (min_kernel and not _VERSION_RE.fullmatch(min_kernel)):
        errs.append(FieldError(f"{at}.min-kernel", f'a release like "5.13", got {min_kernel!r}'))
        min_kernel = ""
    return Requirements(executables, modules, paths, min_kernel)
