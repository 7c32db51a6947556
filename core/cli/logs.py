"""Log set-up shared by the commands: the ``logging`` section of the configuration and ``--v``.

Verbosity works like klog's ``-v N``: a message is shown when its level is at most N. Python's
levels map onto klog's as follows (errors and warnings are always shown, as klog's are):

======================  =========
Python level            klog ``v``
======================  =========
ERROR, CRITICAL         error (no ``v``)
WARNING                 0
INFO                    1
DEBUG                   4
below DEBUG             5
======================  =========

Verbosity 0 shows, besides errors and warnings, the few info messages at level ``NOTICE`` (klog's
``Info`` without ``V``): the mode, the source and the first sync, as upstream logs its start.

Every message is written with what is not printable escaped (:func:`escaped`): a record's
arguments, its key/value pairs and its exception's text may come from outside (an API server's
message, a kernel tool's output), and must neither forge a line nor drive a terminal.

``logging.format: text`` (the default) writes ``<time> <LEVEL> <logger>: <message>`` lines;
``json`` writes component-base's JSON lines: one object per line with ``ts`` (milliseconds since
the epoch, a float, as component-base's encoder writes it), ``caller``, ``msg``, then ``v`` for
an info message or ``err`` for an error's exception, then the record's key/value pairs (the
``extra=`` of the logging call). ``logging.vmodule`` sets the verbosity per Python module
(``filePattern`` is matched against the module's file name without ``.py``, or against the path
when it holds a ``/``), and ``options.<format>.splitStream`` sends everything below errors to
standard output, as upstream does.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import sys
import traceback
from collections.abc import Mapping
from types import TracebackType
from typing import IO, Any

from kubeplex.core.config.schema import KubeProxyConfiguration
from kubeplex.core.model.errors import escaped

__all__ = [
    "NOTICE",
    "TEXT_FORMAT",
    "JSONFormatter",
    "TextFormatter",
    "configure",
    "level_for",
    "verbosity_of",
]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: An info message shown at verbosity 0 (klog's ``Info`` without ``V``); written as INFO.
NOTICE = logging.INFO + 5

# The attributes every LogRecord has; anything else on a record came from ``extra=``.
_RECORD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "taskName",
}
# The keys the entry itself uses; a key/value pair may not replace them.
_RESERVED = frozenset({"ts", "caller", "msg", "v", "err"})


def verbosity_of(levelno: int) -> int:
    """The klog verbosity of a Python level (errors have none: they are always shown)."""
    if levelno >= NOTICE:
        return 0
    if levelno >= logging.INFO:
        return 1
    if levelno >= logging.DEBUG:
        return 4
    return 5


def level_for(verbosity: int) -> int:
    """The lowest Python level shown at klog verbosity ``verbosity``."""
    if verbosity >= 5:
        return 1
    if verbosity >= 4:
        return logging.DEBUG
    if verbosity >= 1:
        return logging.INFO
    return NOTICE


_ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]


def _type_name(error: BaseException) -> str:
    kind = type(error)
    module = kind.__module__
    return (
        kind.__qualname__ if module in ("builtins", "__main__") else f"{module}.{kind.__qualname__}"
    )


def _message(error: BaseException) -> str:
    try:
        return escaped(str(error))
    except Exception:  # a hostile __str__ must not take the log line down
        return f"<{type(error).__name__} object>"


# Python's own words between the tracebacks of a chain.
_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"


def exception_text(error: BaseException) -> str:
    """``error``'s traceback, and those of the exceptions it was raised from or while handling,
    as Python prints them, each exception's message escaped (it may quote outside text)."""
    chain: list[tuple[BaseException, str]] = []
    seen: set[int] = set()
    current: BaseException | None = error
    link = ""
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append((current, link))
        if current.__cause__ is not None:
            current, link = current.__cause__, _CAUSE
        elif current.__context__ is not None and not current.__suppress_context__:
            current, link = current.__context__, _CONTEXT
        else:
            current = None
    parts: list[str] = []
    for exc, link in reversed(chain):
        if exc.__traceback__ is not None:
            parts.append("Traceback (most recent call last):\n")
            parts.extend(traceback.format_tb(exc.__traceback__))
        message = _message(exc)
        parts.append(f"{_type_name(exc)}: {message}\n" if message else f"{_type_name(exc)}\n")
        if link:
            parts.append(link)
    return "".join(parts).rstrip("\n")


class _Escaping(logging.Filter):
    """The message with its arguments, escaped, replaces them: whichever handler writes the
    record (and whichever formatter), nothing from outside reaches it raw."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        safe = escaped(message)
        if record.args or safe is not message:
            record.msg, record.args = safe, None
        return True


class TextFormatter(logging.Formatter):
    """``TEXT_FORMAT`` lines; a NOTICE is an INFO line, an exception's text escaped."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        # Another handler's formatter may have cached the exception's text raw on the record.
        levelname, exc_text = record.levelname, record.exc_text
        if record.levelno == NOTICE:
            record.levelname = "INFO"
        record.exc_text = None
        try:
            return super().format(record)
        finally:
            record.levelname, record.exc_text = levelname, exc_text

    def formatException(self, ei: _ExcInfo) -> str:
        error = ei[1]
        return super().formatException(ei) if error is None else exception_text(error)


class JSONFormatter(logging.Formatter):
    """component-base's JSON log format (k8s.io/component-base/logs/json), one line a record."""

    def format(self, record: logging.LogRecord) -> str:
        folder = os.path.basename(os.path.dirname(record.pathname))
        entry: dict[str, Any] = {
            "ts": record.created * 1000.0,
            "caller": f"{folder}/{record.filename}:{record.lineno}"
            if folder
            else f"{record.filename}:{record.lineno}",
            "msg": record.getMessage(),
        }
        if record.levelno < logging.ERROR:
            entry["v"] = verbosity_of(record.levelno)
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            entry["err"] = _message(error) or type(error).__name__
        for key, value in vars(record).items():
            if key not in _RECORD_ATTRIBUTES and key not in _RESERVED and not key.startswith("_"):
                # JSON escapes only C0 controls: C1 and bidi controls would reach a terminal.
                entry[key] = escaped(value) if isinstance(value, str) else value
        # Compact, as zap writes it.
        return json.dumps(entry, ensure_ascii=False, separators=(",", ":"), default=str)


class _StdStreamHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr``/``sys.stdout`` is at the time of the record, so a
    replaced stream (a test's capture, a closed pipe's replacement) is followed."""

    def __init__(self, name: str) -> None:
        self._stream_name = name
        super().__init__()

    @property
    def stream(self) -> IO[str]:
        stream: IO[str] = getattr(sys, self._stream_name)
        return stream

    @stream.setter
    def stream(self, _value: object) -> None:
        pass


class _Threshold(logging.Filter):
    """klog's -v and -vmodule: a record passes when its verbosity is at most its file's."""

    def __init__(self, verbosity: int, vmodule: list[tuple[str, int]]) -> None:
        super().__init__()
        self.verbosity = verbosity
        self.vmodule = vmodule

    def _limit(self, record: logging.LogRecord) -> int:
        for pattern, verbosity in self.vmodule:
            target = os.path.splitext(record.pathname if "/" in pattern else record.filename)[0]
            if fnmatch.fnmatchcase(target, pattern):
                return verbosity
        return self.verbosity

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR or verbosity_of(record.levelno) <= self._limit(
            record
        )


class _Split(logging.Filter):
    """splitStream: errors on one handler, everything else on the other."""

    def __init__(self, errors: bool) -> None:
        super().__init__()
        self.errors = errors

    def filter(self, record: logging.LogRecord) -> bool:
        return (record.levelno >= logging.ERROR) == self.errors


# The handlers configure() installed, so a second call replaces them instead of adding more.
_installed: list[logging.Handler] = []


def _vmodule(section: Mapping[str, Any]) -> list[tuple[str, int]]:
    entries = section.get("vmodule") or ()
    return [(str(e["filePattern"]), int(e.get("verbosity") or 0)) for e in entries]


def configure(cfg: KubeProxyConfiguration | None, verbosity: int | None) -> None:
    """Set up logging from the configuration's ``logging`` section; ``verbosity`` (``--v``,
    None when not given) takes precedence over ``logging.verbosity``, as upstream's flag does.
    Safe to call again (e.g. once before the configuration is read and once after)."""
    section: Mapping[str, Any] = cfg.logging if cfg is not None else {}
    level = verbosity if verbosity is not None else int(section.get("verbosity") or 0)
    fmt = str(section.get("format") or "text")
    vmodule = _vmodule(section)
    options = (section.get("options") or {}).get(fmt) or {}
    split = bool(options.get("splitStream"))

    formatter: logging.Formatter = JSONFormatter() if fmt == "json" else TextFormatter()
    threshold = _Threshold(level, vmodule)
    escaping = _Escaping()
    handlers: list[logging.Handler] = []
    if split:
        for name, errors in (("stdout", False), ("stderr", True)):
            stream = _StdStreamHandler(name)
            stream.addFilter(_Split(errors))
            handlers.append(stream)
    else:
        handlers.append(_StdStreamHandler("stderr"))

    root = logging.getLogger()
    for old in _installed:
        root.removeHandler(old)
    _installed.clear()
    for handler in handlers:
        handler.setFormatter(formatter)
        handler.addFilter(threshold)
        handler.addFilter(escaping)
        root.addHandler(handler)
        _installed.append(handler)
    # The logger lets through what the most verbose file wants; the filter does the rest.
    root.setLevel(level_for(max([level, *(v for _, v in vmodule)])))
