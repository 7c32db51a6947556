"""Outside packages whose ``__init__`` imports far more than kubeplex uses: registered without
running it, so that only the submodules kubeplex imports are loaded. A leaf anyone may use."""

from __future__ import annotations

import importlib.util
import sys
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["register_bare"]


def register_bare(*names: str) -> None:
    """Register the packages ``names`` without running their ``__init__``, unless imported
    already (a parent before its children). Their submodules import as usual; the first use
    of anything else of such a package (``kubernetes.config.load_kube_config``,
    ``prometheus_client.Counter``) runs its ``__init__`` then, so nothing else sees a
    difference. A name that is not a package here is left alone: its imports fail or work
    as they would."""
    for name in names:
        if name in sys.modules:
            continue
        try:
            spec = importlib.util.find_spec(name)
        except ModuleNotFoundError:  # its parent is not here
            continue
        if spec is None or spec.loader is None or spec.submodule_search_locations is None:
            continue
        module = importlib.util.module_from_spec(spec)
        module.__getattr__ = _completion(module, spec.loader)  # type: ignore[method-assign]
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent in sys.modules:
            setattr(sys.modules[parent], child, module)


def _completion(module: Any, loader: Any) -> Callable[[str], Any]:
    """A module ``__getattr__`` (PEP 562) that runs the package's ``__init__`` once, then
    answers from what it defined. (A submodule's ``from . import sibling`` asks the package
    for ``sibling`` first: import the sibling before it.)"""
    lock = threading.RLock()

    def complete(attr: str) -> Any:
        with lock:
            if module.__dict__.pop("__getattr__", None) is not None:
                loader.exec_module(module)
        try:
            return module.__dict__[attr]
        except KeyError:
            raise AttributeError(f"module {module.__name__!r} has no attribute {attr!r}") from None

    return complete
