"""The daemon's watch on its ``--config`` file, as upstream kube-proxy's: once the file is
written, replaced or removed, the process exits (status 1, as upstream's error exit) so that
its supervisor (the kubelet) restarts it and the new configuration takes effect.

Polling, not inotify: a ConfigMap volume updates by swapping a symlink, which ``os.stat`` of
the path follows, and a poll every second needs no dependency.

Only ENOENT and ENOTDIR mean the file was removed. Any other failure to read it (out of
descriptors, EIO, ...) says nothing about the file: it is logged and the next poll looks
again, so a process short of descriptors does not take itself for reconfigured and exit.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("kubeplex")

#: The exit status when the configuration file changed (upstream's: any error exits 1).
EXIT_CONFIG_CHANGED = 1

_Identity = tuple[int, int, int, int, bytes]
#: The errors that say the file (or a folder on its path) is not there.
_GONE = (errno.ENOENT, errno.ENOTDIR)


class _Unknown:
    """The file could not be read when the watch was made: its first read is the baseline."""


_UNKNOWN = _Unknown()


def _identity(path: Path) -> _Identity | None:
    """The file's identity and content; None if it is not there. Raises OSError if it
    cannot be told."""
    try:
        st = os.stat(path)
        digest = hashlib.sha256(path.read_bytes()).digest()
    except OSError as err:
        if err.errno in _GONE:
            return None
        raise
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size, digest)


class ConfigWatch:
    """The file as it was when created (create it before reading the file, so that a change
    made while the daemon starts is seen too)."""

    def __init__(self, path: str | os.PathLike[str], interval: float = 1.0) -> None:
        self.path = Path(path)
        self.interval = interval
        self._failing = 0  # the errno of the last failed read (logged once per errno)
        self._seen: _Identity | _Unknown | None = self._read()
        self._thread: threading.Thread | None = None

    def _read(self) -> _Identity | _Unknown | None:
        try:
            found = _identity(self.path)
        except OSError as err:
            if err.errno != self._failing:
                self._failing = err.errno or -1
                log.warning(
                    "cannot read the configuration file %s (will retry): %s", self.path, err
                )
            return _UNKNOWN
        if self._failing:
            self._failing = 0
            log.info("the configuration file %s is readable again", self.path)
        return found

    def change(self) -> str | None:
        """How the file changed since (None: it did not, or it cannot be told now)."""
        now = self._read()
        if isinstance(now, _Unknown):
            return None
        if isinstance(self._seen, _Unknown):
            self._seen = now
            return None
        if now == self._seen:
            return None
        if now is None:
            return "removed"
        if self._seen is None:
            return "created"
        if now[:2] != self._seen[:2]:
            return "replaced"
        return "written"

    def start(self, stop: threading.Event, on_change: Callable[[str], None]) -> None:
        """Poll in a daemon thread until ``stop`` is set; ``on_change`` is called once."""

        def poll() -> None:
            while not stop.wait(self.interval):
                why = self.change()
                if why is not None:
                    log.error(
                        "the configuration file %s was %s: exiting, to start again with it",
                        self.path,
                        why,
                    )
                    on_change(why)
                    return

        self._thread = threading.Thread(target=poll, name="config-watch", daemon=True)
        self._thread.start()
