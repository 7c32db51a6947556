"""Tests that install kubeplex's log handlers (``logs.configure``) leave the root logger as
they found it."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from kubeplex.core.cli import logs


@contextmanager
def root_logger_kept() -> Iterator[None]:
    """The root logger's level and handlers as they were, whatever ``configure`` installed."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    try:
        yield
    finally:
        for handler in list(root.handlers):
            if handler not in handlers:
                root.removeHandler(handler)
        logs._installed.clear()
        root.setLevel(level)
