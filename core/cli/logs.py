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
from collections.abc import Mapping
from typing import IO, Any

from kubeplex.core.config.schema import KubeProxyConfiguration

__all__ = [
    "TEXT_FORMAT",
    "JSONFormatter",
    "configure",
    "level_for",
    "verbosity_of",
]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

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
    if levelno >= logging.WARNING:
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
    return logging.WARNING


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
            entry["err"] = str(error) or type(error).__name__
        for key, value in vars(record).items():
            if key not in _RECORD_ATTRIBUTES and key not in _RESERVED and not key.startswith("_"):
                entry[key] = value
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

    formatter: logging.Formatter = (
        JSONFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT)
    )
    threshold = _Threshold(level, vmodule)
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
        root.addHandler(handler)
        _installed.append(handler)
    # The logger lets through what the most verbose file wants; the filter does the rest.
    root.setLevel(level_for(max([level, *(v for _, v in vmodule)])))
