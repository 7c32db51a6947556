"""The image's build step: the dataclass methods of every class a start may define, compiled
and kept (:mod:`kubeplex.core.startup.codecache`), so that a pod's starts compile none.

``python -m kubeplex.core.cli.warm_cache`` (as ``compileall`` is run for the bytecode).
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import kubeplex.core
from kubeplex.core.daemon.modes import platform_modes
from kubeplex.core.dataplane.plugins import load_backend_class
from kubeplex.core.startup import SWITCH, codecache

__all__ = ["warm"]


def warm() -> int:
    """Imports every module of the core and each backend the trust list allows on this
    platform, and writes what their classes compiled (even with ``PYTHONDONTWRITEBYTECODE``:
    asked for, as ``compileall`` is): the number of sources kept. Raises ``OSError`` if they
    cannot be written."""
    cache = codecache.install()
    if cache is None:
        raise OSError(f"{SWITCH}=0: no dataclass methods to keep")
    for module in pkgutil.walk_packages(kubeplex.core.__path__, "kubeplex.core."):
        if not module.name.endswith(".__main__"):
            importlib.import_module(module.name)
    for mode in platform_modes():
        load_backend_class(mode)
    codecache.done()
    cache.save()
    return len(cache.used)


if __name__ == "__main__":
    print(f"kept the dataclass methods of {warm()} sources", file=sys.stderr)
