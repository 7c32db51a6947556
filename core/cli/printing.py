"""What the commands print to a terminal: text from outside (kernel listings and their
comments, a tool's or a server's message, an exception's) with what is not printable
escaped, so it can neither drive the terminal nor forge a line of the report."""

from __future__ import annotations

import sys
from typing import IO, Any

from kubeplex.core.model.errors import escaped

__all__ = ["echo", "escaped_fields", "printable"]


def printable(text: str) -> str:
    """``text`` with what is not printable escaped, its own line breaks kept (a report of
    several lines); a value from outside that may hold a line break goes through
    :func:`~kubeplex.core.model.errors.escaped` first."""
    if text.isprintable():
        return text
    return "\n".join(escaped(line) for line in text.split("\n"))


def escaped_fields(value: Any) -> Any:
    """``value`` (JSON-like: dicts, lists, strings) with every string escaped whole, line
    breaks too: the fields of a report, each printed on its own line."""
    if isinstance(value, str):
        return escaped(value)
    if isinstance(value, dict):
        return {key: escaped_fields(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [escaped_fields(item) for item in value]
    return value


def echo(text: str, file: IO[str] | None = None, end: str = "\n") -> None:
    """``print`` for the commands' output: ``text`` made :func:`printable`."""
    (file if file is not None else sys.stdout).write(printable(text) + end)
