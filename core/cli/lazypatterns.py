"""Regular expressions that some outside modules compile at their top, compiled at their first
use instead.

Compiling a pattern can cost milliseconds: PyYAML's reader compiles its class of non-printable
characters (about 7 ms, for the pure-Python reader, which a daemon never uses: its YAML goes
through libyaml), urllib3 its IPv6 address forms (about 3 ms, unused for a host given by name
or IPv4 address). A daemon pays both before its first request to the API server. For the
modules named in :data:`MODULES` only, while each is executed, ``re.compile`` called from its
own top-level code returns a :class:`LazyPattern`; everyone else's calls are compiled as ever,
and ``re.compile`` is the original again once the module is done. Each name there was read:
its module uses its patterns only through their methods (``match``, ``search``, ``sub``...),
never hands them to ``re`` functions or ``isinstance``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import re
import sys
import threading
from collections.abc import Sequence
from types import ModuleType
from typing import Any

__all__ = ["MODULES", "LazyPattern", "install", "uninstall"]

#: The modules whose top-level patterns are compiled at first use (milliseconds each
#: module's patterns took to compile at its import). Not PyYAML's resolver (1.5 ms): its
#: patterns are matched against every plain scalar of a manifests folder, and a lazy one
#: answers each call through one lookup more.
MODULES = frozenset(
    {
        "yaml.reader",  # 7: NON_PRINTABLE, for the pure-Python reader only
        "yaml.constructor",  # 0.6: timestamps, which kubeplex's loaders leave as strings
        "urllib3.util.url",  # 7.5: of which IPv6 forms 3.2, unused for other hosts
        "platform",  # 1.5: prometheus_client's platform collector uses one of nine
    }
)

_compile = re.compile
_lock = threading.Lock()
#: (thread, namespace) of each module of MODULES being executed now: several threads may
#: import, and a thread the module starts compiles as ever.
_executing: set[tuple[int, int]] = set()


class LazyPattern:
    """A compiled pattern made at the first use of any of its attributes; then it answers
    as that ``re.Pattern`` does (compiled twice by two threads at once, the same)."""

    __slots__ = ("_compiled", "_flags", "_pattern")

    def __init__(self, pattern: str | bytes, flags: int = 0) -> None:
        self._pattern = pattern
        self._flags = flags
        self._compiled: re.Pattern[Any] | None = None

    def compiled(self) -> re.Pattern[Any]:
        found = self._compiled
        if found is None:
            found = self._compiled = _compile(self._pattern, self._flags)
        return found

    def __getattr__(self, name: str) -> Any:
        return getattr(self.compiled(), name)

    def __repr__(self) -> str:
        state = "compiled" if self._compiled is not None else "not compiled yet"
        return f"<lazy re.compile({self._pattern!r}, {self._flags}), {state}>"


def _compile_at_top(pattern: Any, flags: int = 0) -> Any:
    if (threading.get_ident(), id(sys._getframe(1).f_globals)) in _executing:
        if isinstance(pattern, str | bytes):
            return LazyPattern(pattern, flags)
        if isinstance(pattern, LazyPattern) and not flags:
            return pattern  # as re.compile gives back a compiled pattern
    return _compile(pattern, flags)


class _Loader(importlib.abc.Loader):
    """Executes a module of MODULES as its own loader would, with its patterns lazy."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:  # get_source (tracebacks), get_filename...
        return getattr(self._inner, name)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        key = (threading.get_ident(), id(module.__dict__))
        with _lock:
            _executing.add(key)
            re.compile = _compile_at_top
        try:
            self._inner.exec_module(module)
        finally:
            with _lock:
                _executing.discard(key)
                if not _executing:
                    re.compile = _compile


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the modules of MODULES where the path finder does, and gives them :class:`_Loader`."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MODULES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


_FINDER = _Finder()


def install() -> None:
    """From now on, the modules of MODULES not imported yet compile their patterns lazily."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def uninstall() -> None:
    """Imports after this compile every pattern at once again (as without :func:`install`)."""
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
