"""Slow clients that hold a server: ``python flood_kit.py PORT COUNT`` keeps COUNT connections
open to 127.0.0.1:PORT (of the network namespace it runs in); even ones send nothing, odd ones
a byte of a request line a second, and one the server closes is opened again at once. It
prints "ready" once every connection was tried, and, when stdin closes, how many it reopened.

A process of its own, so that the clients' work does not slow down the test's own probes.
"""

from __future__ import annotations

import contextlib
import errno
import resource
import selectors
import socket
import sys
import threading
import time

#: One request line, sent a byte a second by half of the connections.
TRICKLE = b"GET /healthz HTTP/1.1\r\nHost: node\r\nX-Slow: " + b"a" * 64


class SlowFlood:
    def __init__(self, port: int, count: int) -> None:
        self.port, self.count = port, count
        self.reopened = 0
        self._socks: list[socket.socket | None] = [None] * count
        self._sent = [0] * count
        self._sel = selectors.DefaultSelector()

    def _open(self, i: int) -> None:
        sock = socket.socket()
        sock.setblocking(False)
        if sock.connect_ex(("127.0.0.1", self.port)) not in (0, errno.EINPROGRESS):
            sock.close()
            return
        self._socks[i] = sock
        self._sent[i] = 0
        self._sel.register(sock, selectors.EVENT_READ, i)

    def _reopen(self, i: int) -> None:
        sock = self._socks[i]
        if sock is not None:
            self._sel.unregister(sock)
            sock.close()
            self._socks[i] = None
        self.reopened += 1
        self._open(i)

    def run(self, stop: threading.Event) -> None:
        for i in range(self.count):
            self._open(i)
        print("ready", flush=True)
        next_byte = time.monotonic()
        while not stop.is_set():
            for key, _ in self._sel.select(0.1):
                try:
                    data = key.fileobj.recv(4096)  # type: ignore[union-attr]
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:  # the server closed it
                    self._reopen(key.data)
            for i, sock in enumerate(self._socks):
                if sock is None:
                    self._open(i)
            if time.monotonic() < next_byte:
                continue
            next_byte += 1.0
            for i in range(1, self.count, 2):
                sock = self._socks[i]
                if sock is not None:
                    pos = self._sent[i] % len(TRICKLE)
                    with contextlib.suppress(OSError):  # closed: reopened by the next select
                        self._sent[i] += sock.send(TRICKLE[pos : pos + 1])


def main() -> None:
    port, count = int(sys.argv[1]), int(sys.argv[2])
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    flood = SlowFlood(port, count)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    flood.run(stop)
    print(f"reopened {flood.reopened}", flush=True)


if __name__ == "__main__":
    main()
