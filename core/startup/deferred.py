"""Importing an outside module whose top imports classes it calls only on a rare path: while it
is imported, those names stand in for the classes, which are imported at the first call.

The ``kubernetes`` client's kubeconfig loader imports the ``ApiClient`` (pydantic) and
``requests_oauthlib`` (requests) at its top, about 0.1 s at each start, and calls them only to
refresh an OIDC token. Nothing else sees the stand-ins: they are in place only while the module
is imported, and only for classes not imported yet. (A thread importing those names meanwhile
would get them too: calling one works, ``isinstance`` does not. kubeplex loads its client
configuration before it starts the threads that could.)
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from kubeplex.core.startup import enabled

__all__ = ["Deferred", "deferring", "import_deferring"]


class Deferred:
    """Stands for ``module.name``, a class or function, until called: then imports it and
    calls it."""

    __slots__ = ("module", "name")

    def __init__(self, module: str, name: str) -> None:
        self.module = module
        self.name = name

    def resolve(self) -> Any:
        return getattr(importlib.import_module(self.module), self.name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<deferred {self.module}.{self.name}>"


@contextmanager
def deferring(names: Mapping[str, str]) -> Iterator[None]:
    """Within the block, ``from module import name`` gives a :class:`Deferred` for each
    ``module: name`` of ``names`` whose module is not imported yet (an empty module is put in
    its place) or does not hold the name yet (a package that imports it lazily); afterwards
    both are as before."""
    shells: dict[str, types.ModuleType] = {}
    lent: list[tuple[types.ModuleType, str, Deferred]] = []
    for module, name in names.items():
        stand_in = Deferred(module, name)
        found = sys.modules.get(module)
        if found is None:
            shell = types.ModuleType(module, f"stands for {module} while another module imports")
            setattr(shell, name, stand_in)
            sys.modules[module] = shells[module] = shell
        elif name not in found.__dict__:
            setattr(found, name, stand_in)
            lent.append((found, name, stand_in))
    try:
        yield
    finally:
        for module, shell in shells.items():
            if sys.modules.get(module) is shell:
                del sys.modules[module]
        for found, name, stand_in in lent:
            if found.__dict__.get(name) is stand_in:
                delattr(found, name)


def import_deferring(module: str, names: Mapping[str, str]) -> types.ModuleType:
    """``module``, imported within :func:`deferring` ``names`` unless it is imported already
    (then as it is: stand-ins put in place now would only be seen by others) or the start-up
    tricks are off."""
    found = sys.modules.get(module)
    if found is not None:
        return found
    if not enabled():
        return importlib.import_module(module)
    with deferring(names):
        return importlib.import_module(module)
