"""The methods ``@dataclass`` writes for each class, compiled when the image is built and read
at each start.

The decorator writes the source of each class's ``__init__``, ``__repr__``, ``__eq__``,
``__hash__`` (and, frozen, ``__setattr__`` and ``__delattr__``) and compiles it at import, for
each of the classes a daemon defines before its first sync. What a source compiles to does not
change from one start to the next, so the code is kept as the interpreter keeps a module's
bytecode: in ``__pycache__`` beside kubeplex's modules, keyed by the source itself, for one
interpreter's bytecode (``importlib.util.MAGIC_NUMBER``). The file is trusted as the bytecode
beside it is: who can write one can write the other.

The hook is the name ``exec`` in the ``dataclasses`` module, through which it compiles what it
writes: nothing else there is touched, the code is the same as compiled there, and a Python
that compiles some other way just does not call it. A command stops using it (:func:`done`)
once it has started (a daemon after its first sync). A running kubeplex only reads the file:
it is written by the image's build step (:func:`kubeplex.core.cli.warm_cache.warm`), which
keeps the methods of every class of the core and of the trusted backends. Without the file, a
start compiles them as plain Python does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import marshal
import os
import sys
from types import CodeType
from typing import Any

from kubeplex.core.startup import enabled

__all__ = ["CodeCache", "default_path", "done", "install"]

#: What the file starts with: its kind, then the bytecode's version.
HEADER = b"kubeplex dataclass methods\n" + importlib.util.MAGIC_NUMBER

#: The most sources kept: above, only those of the last start (whatever else defines classes
#: in the process, tests say, does not make the file grow for good).
MAX_ENTRIES = 2000


def default_path() -> str | None:
    """Where kubeplex's interpreter keeps the cache: ``kubeplex/core/__pycache__`` (under
    ``sys.pycache_prefix`` if set), None where bytecode is not cached at all."""
    tag = sys.implementation.cache_tag
    if tag is None:
        return None
    core = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if sys.pycache_prefix is None:
        folder = os.path.join(core, "__pycache__")
    else:
        folder = os.path.join(sys.pycache_prefix, os.path.splitdrive(core)[1].lstrip(os.sep))
    return os.path.join(folder, f"dataclass-methods.{tag}.marshal")


def _load(path: str | None) -> dict[str, CodeType]:
    """The cached code by source; empty if there is no file or it is of another kind,
    version or broken."""
    if path is None:
        return {}
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return {}
    if not data.startswith(HEADER):
        return {}
    try:
        loaded = marshal.loads(data[len(HEADER) :])
    except (EOFError, ValueError, TypeError):
        return {}
    if type(loaded) is not dict:
        return {}
    return {k: v for k, v in loaded.items() if type(k) is str and type(v) is CodeType}


class CodeCache:
    """Compiles what it executes through a dict of code by source, filled from ``path``."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.loaded = _load(path)
        #: What this process executed, by source.
        self.used: dict[str, CodeType] = {}
        self.compiled = 0

    def exec(
        self, source: Any, globals: dict[str, Any] | None = None, locals: Any = None, /
    ) -> None:
        """``exec`` as the builtin does; a source string is compiled once (as the builtin
        would, without this module's ``__future__`` flags)."""
        if type(source) is str:
            code = self.used.get(source) or self.loaded.get(source)
            if code is None:
                code = compile(source, "<string>", "exec", dont_inherit=True)
                self.compiled += 1
            self.used[source] = code
            source = code
        elif type(source) is not CodeType:
            source = compile(source, "<string>", "exec", dont_inherit=True)
        exec(source, globals, locals)

    def save(self) -> bool:
        """Writes what was used, with what was loaded if not too much, if anything was
        compiled: atomically, as the interpreter writes bytecode. True if written; raises
        ``OSError`` if it cannot be."""
        if not self.compiled or self.path is None:
            return False
        keep = {**self.loaded, **self.used}
        if len(keep) > MAX_ENTRIES:
            keep = self.used
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(HEADER + marshal.dumps(keep))
            os.replace(tmp, self.path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return True


_active: CodeCache | None = None


def install(path: str | None = None) -> CodeCache | None:
    """Makes ``dataclasses`` compile through a cache read from ``path`` (default:
    :func:`default_path`), until :func:`done`; None with the start-up tricks off."""
    global _active
    if _active is None and enabled():
        _active = CodeCache(default_path() if path is None else path)
        dataclasses.exec = _active.exec  # type: ignore[attr-defined]
    return _active


def done() -> CodeCache | None:
    """Stops using the cache (it is not written: see :func:`CodeCache.save`); the cache that
    was in use, if any."""
    global _active
    cache, _active = _active, None
    if cache is not None and dataclasses.__dict__.get("exec") == cache.exec:
        del dataclasses.exec  # type: ignore[attr-defined]
    return cache
