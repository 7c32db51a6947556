"""Which trust list this process was told to use (``--plugins FILE``), kept apart from the
loader in :mod:`kubeplex.core.dataplane.plugins` so a command line can set it without
importing the loader (stevedore, package metadata) before it needs a backend."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["ENV_VAR", "SYSTEM_TRUST_FILE", "selected", "trusting", "use_trust_file"]

#: The environment variable naming an operator's trust list.
ENV_VAR = "KUBEPLEX_PLUGINS"
#: An operator's trust list, read instead of the packaged default when it exists.
SYSTEM_TRUST_FILE = Path("/etc/kubeplex/plugins.toml")

_selected: Path | None = None


def selected() -> Path | None:
    """The file given by :func:`use_trust_file` (or :func:`trusting`), None if none was."""
    return _selected


def use_trust_file(path: str | os.PathLike[str] | None) -> None:
    """Make ``path`` the trust list of this process (``--plugins FILE``); None: back to the
    environment, /etc/kubeplex/plugins.toml and the packaged default."""
    global _selected
    _selected = Path(path) if path is not None else None


@contextlib.contextmanager
def trusting(path: str | os.PathLike[str] | None) -> Iterator[None]:
    """:func:`use_trust_file` for the duration of a ``with`` block (None: leave it as it is)."""
    global _selected
    before = _selected
    if path is not None:
        _selected = Path(path)
    try:
        yield
    finally:
        _selected = before
