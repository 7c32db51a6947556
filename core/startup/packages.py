"""Outside packages whose ``__init__`` imports far more than kubeplex uses: registered without
running it, so that only the submodules kubeplex imports are loaded.

Used for the ``kubernetes`` client only (its package ``__init``\\ s import every part of it, and
its kubeconfig loader imports ``oauthlib``'s OAuth 2 flows for a token refresh): a dependency
upgrade that breaks it shows as a difference between a start with and without the start-up
tricks (see :mod:`kubeplex.core.startup`).
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from collections.abc import Callable
from importlib.abc import Loader
from types import ModuleType
from typing import Any

from kubeplex.core.startup import enabled

__all__ = ["register_bare"]


def register_bare(*names: str) -> None:
    """Register the packages ``names`` without running their ``__init__``, unless imported
    already (a parent before its children) or the start-up tricks are off. Their submodules
    import as usual; the first use of anything else of such a package
    (``kubernetes.config.load_kube_config``) runs its ``__init__`` then, so nothing else sees a
    difference. A name that is not a package here is left alone: its imports fail or work as
    they would."""
    if not enabled():
        return
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


def _completion(module: ModuleType, loader: Loader) -> Callable[[str], Any]:
    """A module ``__getattr__`` (PEP 562) that runs the package's ``__init__`` once, then
    answers from what it defined. Other threads asking meanwhile wait until it has run: the
    hook stays in place until then. (A submodule's ``from . import sibling`` asks the package
    for ``sibling`` first: import the sibling before it.)"""
    lock = threading.RLock()
    state = {"started": False}

    def complete(attr: str) -> Any:
        with lock:
            # The thread running ``__init__`` may ask again meanwhile: it gets what is defined
            # so far, as during any package's ``__init__``.
            if not state["started"]:
                state["started"] = True
                loader.exec_module(module)
                if module.__dict__.get("__getattr__") is complete:
                    del module.__dict__["__getattr__"]
        try:
            return module.__dict__[attr]
        except KeyError:
            raise AttributeError(f"module {module.__name__!r} has no attribute {attr!r}") from None

    return complete
