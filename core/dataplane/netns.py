"""Running something inside a network namespace, for the daemon and the backends alike: a
socket made there stays there, and /proc/sys/net shows the namespace of the thread that opens
it, while the rest of the process never leaves its own."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

__all__ = ["NETNS_DIR", "run_in_netns"]

#: Where iproute2 pins named namespaces.
NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000

T = TypeVar("T")


def run_in_netns(netns: str, fn: Callable[[], T]) -> T:
    """Run ``fn`` in a thread that joined network namespace ``netns`` (a name or a path).

    setns(2) moves only the calling thread, which is thrown away afterwards. Nothing runs
    unless the thread is verifiably inside ``netns``.
    """
    path = Path(netns) if "/" in netns else NETNS_DIR / netns
    result: list[T] = []
    failure: list[BaseException] = []

    def target() -> None:
        try:
            import ctypes  # (only for a namespace: a node's start does without it)

            want = os.stat(path)
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns into {netns}: {os.strerror(err)}")
            finally:
                os.close(fd)
            now = os.stat("/proc/thread-self/ns/net")
            if (now.st_dev, now.st_ino) != (want.st_dev, want.st_ino):
                raise OSError(errno.EINVAL, f"thread did not enter network namespace {netns}")
            result.append(fn())
        except BaseException as err:  # handed to the caller's thread
            failure.append(err)

    thread = threading.Thread(target=target, name=f"netns-{netns}", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]
