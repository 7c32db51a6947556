"""Errors that name the object and the field a user has to fix.

Messages quote user-controlled values (names, namespaces, field values) and end up in log lines
and Kubernetes Events, so every part is bounded here: whatever the input, one error stays a few
KB and still names the object and the field.
"""

from __future__ import annotations

import reprlib
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kubeplex.core.model.types import IPFamily

#: Characters of one quoted user value (a name, a field value) in a message.
VALUE_LIMIT = 200
#: Characters of a field path, and of one field's message.
PATH_LIMIT = 256
MESSAGE_LIMIT = 1024
#: Characters of the object an error names (``file: Service ns/name``).
WHERE_LIMIT = 512
#: Field errors listed in one InvalidObject's message; the rest are counted.
LISTED_ERRORS = 10
#: Characters of the field errors of one InvalidObject, all together.
DETAILS_LIMIT = 4096

# A bounded repr: a nested structure (a YAML alias bomb) is never walked whole.
_REPR = reprlib.Repr()
_REPR.maxlevel = 3
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = _REPR.maxfrozenset = 8
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = VALUE_LIMIT


def size_of(text: str) -> int:
    """UTF-8 size of ``text`` (lone surrogates counted as their 3 bytes)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, ending in ``…(N bytes)`` (its whole size) if cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}…({size_of(text)} bytes)"


def shown(value: object, limit: int = VALUE_LIMIT) -> str:
    """A user-controlled value as it goes into a message: a string quoted with what is not
    printable escaped (newlines, terminal escapes, bidi controls), anything else as a bounded
    repr; at most ``limit`` characters, then ``…(N bytes)`` (the whole value's size)."""
    if not isinstance(value, str):
        try:
            text = _REPR.repr(value)
        except Exception:  # a hostile __repr__ must not take an error message down
            text = f"<{type(value).__name__}>"
        return clip(text, limit)
    head = value[: limit + 1]  # only the head is looked at: a 10 MB value costs no copy
    cut = len(value) > limit
    if head.isprintable():
        text = head[:limit]
    else:
        pieces, size = [], 0
        for char in head:
            piece = char if char.isprintable() else char.encode("unicode_escape").decode("ascii")
            if size + len(piece) > limit:
                cut = True  # an escape is never cut in half
                break
            pieces.append(piece)
            size += len(piece)
        text = "".join(pieces)
    return f'"{text}"…({size_of(value)} bytes)' if cut else f'"{text}"'


def escaped(text: str) -> str:
    """``text`` with every character that is not printable written as its Python escape
    (``\\x1b``, ``\\n``, ``\\u202e``): text from outside (a server's message, an exception's,
    a kernel listing) can then neither forge a line nor drive a terminal. Printable text comes
    back as it is, so escaping twice changes nothing."""
    if text.isprintable():
        return text
    return "".join(
        char if char.isprintable() else char.encode("unicode_escape").decode("ascii")
        for char in text
    )


def bare(value: object, limit: int = VALUE_LIMIT) -> str:
    """Like :func:`shown`, without quotes around a string that needs none (a name that
    fits and has no control characters): for ``Service ns/name``."""
    if isinstance(value, str) and len(value) <= limit and value.isprintable() and value:
        return value
    return shown(value, limit)


class KubeplexError(Exception):
    """Base of every error kubeplex reports to a user."""


class InputUnavailable(KubeplexError):
    """An input named on the command line (a manifests path) cannot be read at all: the
    configuration's fault, not a backend's."""


class FieldError(KubeplexError):
    """One bad field: ``path`` is dotted (``iptables.minSyncPeriod``), ``message`` says why.

    Both are bounded (a path may hold a user's map key, a message quotes values)."""

    def __init__(self, path: str, message: str) -> None:
        path, message = clip(path, PATH_LIMIT), clip(message, MESSAGE_LIMIT)
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message


class InvalidObject(KubeplexError):
    """An object (a config file, a Service, an EndpointSlice) with one or more bad fields.

    ``where`` names the object, e.g. ``Service default/web`` or ``config.yaml``; ``details``
    is the field errors as one bounded text (the first LISTED_ERRORS, then how many more).
    """

    def __init__(self, where: str, errors: Iterable[FieldError]) -> None:
        self.where = clip(where, WHERE_LIMIT)
        self.errors: Sequence[FieldError] = tuple(errors)
        self.details = describe_errors(self.errors)
        super().__init__(f"{self.where}: {self.details}" if self.where else self.details)


def describe_errors(errors: Sequence[FieldError]) -> str:
    """The field errors joined with ``; ``, bounded in number and in size."""
    text = "; ".join(str(e) for e in errors[:LISTED_ERRORS])
    more = len(errors) - LISTED_ERRORS
    if more > 0:
        text += f"; and {more} more"
    return clip(text, DETAILS_LIMIT)


class BackendError(KubeplexError):
    """A dataplane could not render or apply; the message says what the kernel holds.

    ``families`` are the IP families whose sync failed (None: all of them), so failure
    metrics count only those.
    """

    def __init__(self, message: str, families: Iterable[IPFamily] | None = None) -> None:
        super().__init__(message)
        self.families: tuple[IPFamily, ...] | None = None if families is None else tuple(families)
