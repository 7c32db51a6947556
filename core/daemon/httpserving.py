"""HTTP/1.1 serving for /healthz, /metrics and the health-check NodePorts: one event loop,
no thread per connection.

``http.server``'s threading server holds a thread and a descriptor for as long as a client
keeps its connection open: a thousand idle connections exhaust the process's descriptors, and
then whatever else needs one fails (the config watch's ``stat``, the API connection). Here one
loop thread (a selector over non-blocking sockets) accepts, reads, parses and writes; only
the answer itself (the ``App``) runs in a small pool of worker threads, as an app may wait for
a lock or for the kernel (a scrape).

Each bound is against one way a client can hold the server:

* connections: at most ``Limits.max_connections`` open; a new one beyond closes the one
  that has waited longest without a request answered (never one being answered), so a fresh
  probe is always served;
* time: a request's line, headers and body must arrive within ``request_seconds`` of its
  first byte (of the accept, for a new connection), however slowly they trickle in; a kept-
  alive connection without a new request is closed after ``idle_seconds``; an answer must be
  taken within ``write_seconds``;
* size: a request head up to ``max_header_bytes`` (431 beyond); a body up to
  ``max_body_bytes`` (413 beyond), read and dropped, as no app reads one;
* work: at most ``calls_per_listener`` answers of one listener are computed at a time, so
  slow scrapes of /metrics never hold up /healthz.

Keep-alive is HTTP/1.1's (HTTP/1.0 with ``Connection: keep-alive``), pipelined requests are
answered in order, and every answer carries ``Content-Length`` and ``Date``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import queue
import re
import resource
import selectors
import socket
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import urlsplit

from kubeplex.core.dataplane.netns import run_in_netns

__all__ = ["JSON_HEADERS", "App", "HTTPServing", "Limits", "ListenError", "Listener", "Response"]

log = logging.getLogger(__name__)

#: (status, headers, body) of one HTTP answer.
Response = tuple[int, Sequence[tuple[str, str]], bytes]
#: Answers a request from its method and path (without the query string).
App = Callable[[str, str], Response]
#: The headers of a JSON answer (the health servers'), as upstream sends them.
JSON_HEADERS = (("Content-Type", "application/json"), ("X-Content-Type-Options", "nosniff"))

_CALL_TIMEOUT = 10.0
#: How often deadlines are checked (and paused listeners resumed).
_SWEEP_SECONDS = 0.25
#: After accept(2) ran out of descriptors with nothing left to close.
_ACCEPT_PAUSE_SECONDS = 0.25
_ACCEPT_BATCH = 64
_RECV_BYTES = 65536
#: The kernel lowers it to net.core.somaxconn (Go's listeners ask for that too).
_LISTEN_BACKLOG = 4096
_WARN_EVERY_SECONDS = 60.0
#: What the loop passes to the apps; any other method is answered 501.
_METHODS = frozenset({"GET", "HEAD", "POST"})
_HEAD_END = re.compile(rb"\r?\n\r?\n")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


class ListenError(OSError):
    """A listener could not be opened (address in use, no such namespace, ...)."""


@dataclass(frozen=True)
class Limits:
    """The bounds of one ``HTTPServing`` (see the module doc)."""

    #: 0: half the soft descriptor limit, at most 4,096.
    max_connections: int = 0
    request_seconds: float = 10.0
    #: A kept-alive connection between requests (what the http.server-based loop allowed).
    idle_seconds: float = 30.0
    write_seconds: float = 10.0
    max_header_bytes: int = 8192
    max_body_bytes: int = 1 << 20
    workers: int = 4
    calls_per_listener: int = 2


def default_max_connections() -> int:
    """Half the soft RLIMIT_NOFILE (the rest is the daemon's), between 16 and 4,096."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return 4096
    return max(16, min(4096, soft // 2))


# ------------------------------------------------------------------------------- the protocol


class BadRequest(Exception):
    """A request answered with ``status`` and the connection closed."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    keep_alive: bool
    body_length: int
    http10: bool = False


def parse_head(head: bytes, max_body_bytes: int) -> Request:
    """The request line and headers (without the blank line that ends them)."""
    lines = head.decode("latin-1").split("\n")
    parts = lines[0].removesuffix("\r").split(" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]):
        raise BadRequest(400, "malformed request line")
    method, target, version = parts
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        if re.fullmatch(r"HTTP/\d\.\d", version):
            raise BadRequest(505, f"HTTP version {version} not supported")
        raise BadRequest(400, "malformed request line")
    headers: dict[str, list[str]] = {}
    for raw in lines[1:]:
        line = raw.removesuffix("\r")
        name, colon, value = line.partition(":")
        # No folded lines, no space before the colon (request smuggling: RFC 9112 5.1).
        if not colon or not _TOKEN.fullmatch(name):
            raise BadRequest(400, "malformed header line")
        headers.setdefault(name.lower(), []).append(value.strip(" \t"))
    if "transfer-encoding" in headers:
        raise BadRequest(501, "Transfer-Encoding is not supported")
    lengths = set(headers.get("content-length", ()))
    if len(lengths) > 1:
        raise BadRequest(400, "conflicting Content-Length")
    body = 0
    if lengths:
        text = lengths.pop()
        if not text.isascii() or not text.isdigit():
            raise BadRequest(400, "malformed Content-Length")
        body = int(text)
        if body > max_body_bytes:
            raise BadRequest(413, "request body too large")
    tokens = {
        t.strip().lower() for value in headers.get("connection", ()) for t in value.split(",")
    }
    keep_alive = "close" not in tokens if version == "HTTP/1.1" else "keep-alive" in tokens
    return Request(method, _path_of(target), keep_alive, body, version == "HTTP/1.0")


def _path_of(target: str) -> str:
    if target.startswith("/"):
        return target.split("?", 1)[0]
    if target == "*":
        return target
    if target.startswith(("http://", "https://")):  # absolute-form
        return urlsplit(target).path or "/"
    raise BadRequest(400, "malformed request target")


def http_date(ts: float) -> str:
    """RFC 9110's IMF-fixdate, whatever the locale."""
    t = time.gmtime(ts)
    return (
        f"{_DAYS[t.tm_wday]}, {t.tm_mday:02d} {_MONTHS[t.tm_mon - 1]} {t.tm_year} "
        f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} GMT"
    )


def render_response(
    response: Response, *, keep_alive: bool, with_body: bool, http10: bool = False
) -> bytes:
    """The bytes of one answer; ValueError for a header that would split the head."""
    status, headers, body = response
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = ""
    lines = [f"HTTP/1.1 {status} {reason}"]
    for name, value in headers:
        if not _TOKEN.fullmatch(name) or "\r" in value or "\n" in value:
            raise ValueError(f"bad HTTP header {name!r}")
        lines.append(f"{name}: {value}")
    lines.append(f"Content-Length: {len(body)}")
    lines.append(f"Date: {http_date(time.time())}")
    if not keep_alive:
        lines.append("Connection: close")
    elif http10:
        lines.append("Connection: keep-alive")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + body if with_body else head


def _text_response(status: int, text: str) -> Response:
    return status, (("Content-Type", "text/plain; charset=utf-8"),), f"{text}\n".encode()


# ---------------------------------------------------------------------------- the listeners


def _listen(host: str, port: int, netns: str | None) -> socket.socket:
    """A listening TCP socket on host:port, created in ``netns`` if one is given."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        if netns:
            path = netns if "/" in netns else os.path.join("/run/netns", netns)
            if not os.path.exists(path):
                raise FileNotFoundError(f"no network namespace {netns!r}")
            # Made by a thread inside the namespace, the socket lives in it for good (without
            # pyroute2's netns module, whose import would be paid at every lab proxy's start).
            sock = run_in_netns(netns, lambda: socket.socket(family, socket.SOCK_STREAM))
        else:
            sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as err:
        raise ListenError(f"cannot make a socket for {host}:{port}: {err}") from err
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(_LISTEN_BACKLOG)
        sock.setblocking(False)
    except OSError as err:
        sock.close()
        where = f" in netns {netns}" if netns else ""
        raise ListenError(f"cannot listen on {_join(host, port)}{where}: {err}") from err
    return sock


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Listener:
    """One listening socket and the app that answers its requests."""

    def __init__(self, sock: socket.socket, app: App) -> None:
        self.sock = sock
        self.app = app
        host, port = sock.getsockname()[:2]
        self.address: tuple[str, int] = (str(host), int(port))
        #: Answers being computed, and connections whose request waits for a worker.
        self.running = 0
        self.waiting: deque[_Conn] = deque()
        self.registered = False
        self.paused_until = 0.0
        self.closed = False

    def server_close(self) -> None:
        """Close the listening socket (the loop forgets it at its next turn)."""
        self.closed = True
        self.sock.close()


# --------------------------------------------------------------------------- the connections

_READING, _WAITING, _RUNNING, _WRITING, _CLOSED = range(5)


class _Conn:
    __slots__ = (
        "body_left",
        "deadline",
        "events",
        "fresh",
        "inbuf",
        "keep_alive",
        "listener",
        "outbuf",
        "request",
        "sock",
        "state",
    )

    def __init__(self, sock: socket.socket, listener: Listener, deadline: float) -> None:
        self.sock = sock
        self.listener = listener
        self.state = _READING
        self.deadline = deadline
        #: Between requests on a kept-alive connection: the first byte starts the clock.
        self.fresh = False
        self.inbuf = bytearray()
        self.outbuf = memoryview(b"")
        self.request: Request | None = None
        self.body_left = 0
        self.keep_alive = True
        self.events = 0


class _Workers:
    """Up to ``size`` threads that run jobs, started as jobs outnumber idle threads."""

    def __init__(self, size: int, name: str) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._size = max(1, size)
        self._name = name
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._idle = 0
        self._queued = 0

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            self._queued += 1
            if self._queued > self._idle and len(self._threads) < self._size:
                thread = threading.Thread(
                    target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
        self._jobs.put(job)

    def stop(self) -> None:
        with self._lock:
            for _ in self._threads:
                self._jobs.put(None)

    def _work(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            job = self._jobs.get()
            with self._lock:
                self._idle -= 1
                self._queued -= 1
            if job is None:
                return
            job()


# --------------------------------------------------------------------------------- the loop


class HTTPServing:
    """One thread that serves every listener added to it (health, metrics, health ports)."""

    def __init__(self, name: str = "kubeplex-http", limits: Limits | None = None) -> None:
        limits = limits or Limits()
        if not limits.max_connections:
            limits = dataclasses.replace(limits, max_connections=default_max_connections())
        self.limits = limits
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._commands: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._listeners: list[Listener] = []
        #: Open connections never answered, oldest first, and those answered at least once,
        #: longest since their last answer first: evicted in this order (a client that used
        #: its connection before is likelier a scraper than a flood).
        self._unanswered: OrderedDict[_Conn, None] = OrderedDict()
        self._answered: OrderedDict[_Conn, None] = OrderedDict()
        self._workers = _Workers(limits.workers, f"{name}-app")
        self._next_sweep = 0.0
        self._warned: dict[str, float] = {}
        self._stopping = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # --- public ---------------------------------------------------------------------------

    def listen(self, host: str, port: int, app: App, *, netns: str | None = None) -> Listener:
        """Start answering on host:port (port 0: any free one; see ``address_of``)."""
        listener = Listener(_listen(host, port, netns), app)
        try:
            self._call(lambda: self._add(listener))
        except BaseException:
            listener.server_close()
            raise
        return listener

    def close(self, listener: Listener) -> None:
        """Stop listening (the port is free when this returns) and close its connections;
        idempotent."""
        self._call(lambda: self._remove(listener))

    @staticmethod
    def address_of(listener: Listener) -> tuple[str, int]:
        return listener.address

    @property
    def open_connections(self) -> int:
        """Connections accepted and not closed yet."""
        return len(self._unanswered) + len(self._answered)

    def _connections(self) -> list[_Conn]:
        return [*self._unanswered, *self._answered]

    def stop(self) -> None:
        """Close every listener and connection and end the loop thread."""
        if self._closed:
            return
        self._stopping = True
        with contextlib.suppress(RuntimeError):
            self._call(lambda: None)
        self._thread.join(timeout=_CALL_TIMEOUT)
        self._workers.stop()
        self._closed = True
        self._wake_w.close()

    # --- calls into the loop --------------------------------------------------------------

    def _call(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` in the loop thread and wait for it (selectors are not thread-safe)."""
        if threading.current_thread() is self._thread:
            fn()
            return
        if self._closed or not self._thread.is_alive():
            raise RuntimeError("HTTP serving loop is stopped")
        done = threading.Event()
        failure: list[BaseException] = []

        def wrapped() -> None:
            try:
                fn()
            except BaseException as err:
                failure.append(err)
            finally:
                done.set()

        self._post(wrapped)
        if not done.wait(_CALL_TIMEOUT):
            raise RuntimeError("HTTP serving loop did not answer")
        if failure:
            raise failure[0]

    def _post(self, fn: Callable[[], None]) -> None:
        """Have the loop run ``fn`` (from any thread, without waiting)."""
        self._commands.put(fn)
        # A full socket buffer already holds a wake-up.
        with contextlib.suppress(BlockingIOError, OSError):
            self._wake_w.send(b"x")

    def _drain_commands(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            while self._wake_r.recv(4096):
                pass
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            command()

    # --- listeners ------------------------------------------------------------------------

    def _add(self, listener: Listener) -> None:
        self._selector.register(listener.sock, selectors.EVENT_READ, listener)
        listener.registered = True
        self._listeners.append(listener)

    def _remove(self, listener: Listener) -> None:
        if listener not in self._listeners:
            return
        self._listeners.remove(listener)
        if listener.registered:
            self._selector.unregister(listener.sock)
            listener.registered = False
        listener.server_close()
        for conn in [c for c in self._connections() if c.listener is listener]:
            self._close(conn)

    def _accept(self, listener: Listener) -> None:
        now = time.monotonic()
        for _ in range(_ACCEPT_BATCH):
            try:
                sock, _peer = listener.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:
                if err.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    if self._evict("out of descriptors"):
                        continue
                    self._warn("accept", f"accepting on {_join(*listener.address)}: {err}")
                    self._selector.unregister(listener.sock)
                    listener.registered = False
                    listener.paused_until = now + _ACCEPT_PAUSE_SECONDS
                    return
                if err.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EPERM):
                    continue  # that client is gone; the next one may not be
                log.warning("accepting on %s failed: %s", _join(*listener.address), err)
                return
            if self.open_connections >= self.limits.max_connections:
                self._evict(f"{self.open_connections} connections open, the most allowed")
            sock.setblocking(False)
            conn = _Conn(sock, listener, now + self.limits.request_seconds)
            self._unanswered[conn] = None
            self._interest(conn, selectors.EVENT_READ)

    def _evict(self, why: str) -> bool:
        """Close the first connection in eviction order that is not being answered."""
        for conns in (self._unanswered, self._answered):
            for conn in conns:
                if conn.state != _RUNNING:
                    self._warn("evict", f"HTTP: {why}: closing the connections idle the longest")
                    self._close(conn)
                    return True
        return False

    def _warn(self, what: str, message: str) -> None:
        """At most one such warning a minute (a flood would write one per connection)."""
        now = time.monotonic()
        if now >= self._warned.get(what, 0.0):
            self._warned[what] = now + _WARN_EVERY_SECONDS
            log.warning("%s", message)

    # --- connections ----------------------------------------------------------------------

    def _interest(self, conn: _Conn, events: int) -> None:
        if events == conn.events:
            return
        if not conn.events:
            self._selector.register(conn.sock, events, conn)
        elif not events:
            self._selector.unregister(conn.sock)
        else:
            self._selector.modify(conn.sock, events, conn)
        conn.events = events

    def _close(self, conn: _Conn) -> None:
        if conn.state == _CLOSED:
            return
        self._interest(conn, 0)
        conn.sock.close()
        conn.state = _CLOSED
        self._unanswered.pop(conn, None)
        self._answered.pop(conn, None)

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(_RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return
        if conn.fresh:  # the first byte of the next request on a kept-alive connection
            conn.fresh = False
            conn.deadline = time.monotonic() + self.limits.request_seconds
        conn.inbuf += data
        self._advance(conn)

    def _advance(self, conn: _Conn) -> None:
        """Parse what ``inbuf`` holds: drop a body, or dispatch a complete request."""
        limits = self.limits
        while conn.state == _READING:
            if conn.request is not None:
                dropped = min(conn.body_left, len(conn.inbuf))
                del conn.inbuf[:dropped]
                conn.body_left -= dropped
                if conn.body_left:
                    return
                request, conn.request = conn.request, None
                self._dispatch(conn, request)
                return
            while conn.inbuf and conn.inbuf[0] in b"\r\n":  # blank lines before a request
                del conn.inbuf[:1]
            found = _HEAD_END.search(conn.inbuf, 0, limits.max_header_bytes + 4)
            if found is None:
                if len(conn.inbuf) > limits.max_header_bytes:
                    self._reject(conn, BadRequest(431, "request header fields too large"))
                return
            head = bytes(conn.inbuf[: found.start()])
            del conn.inbuf[: found.end()]
            try:
                conn.request = parse_head(head, limits.max_body_bytes)
            except BadRequest as err:
                self._reject(conn, err)
                return
            conn.body_left = conn.request.body_length

    def _reject(self, conn: _Conn, err: BadRequest) -> None:
        conn.keep_alive = False
        self._respond(
            conn,
            render_response(
                _text_response(err.status, err.reason), keep_alive=False, with_body=True
            ),
        )

    def _dispatch(self, conn: _Conn, request: Request) -> None:
        if request.method not in _METHODS:
            self._reject(conn, BadRequest(501, f"unsupported method {request.method!r}"))
            return
        conn.keep_alive = request.keep_alive
        self._interest(conn, 0)  # pipelined requests wait in the socket until this is answered
        listener = conn.listener
        if listener.running < self.limits.calls_per_listener:
            self._start(conn, request)
        else:
            conn.state = _WAITING
            conn.request = request
            listener.waiting.append(conn)

    def _start(self, conn: _Conn, request: Request) -> None:
        conn.state = _RUNNING
        conn.listener.running += 1
        self._workers.submit(lambda: self._answer(conn, request))

    def _answer(self, conn: _Conn, request: Request) -> None:
        """In a worker: the app's answer, handed to the loop."""
        try:
            response = conn.listener.app(request.method, request.path)
            data = render_response(
                response,
                keep_alive=request.keep_alive,
                with_body=request.method != "HEAD",
                http10=request.http10,
            )
        except Exception:  # a bug in an app must not kill the listener
            log.exception("HTTP handler for %s failed", request.path)
            data = render_response(
                _text_response(500, "internal error"), keep_alive=False, with_body=True
            )
            conn.keep_alive = False
        self._post(lambda: self._hand_over(conn, data))

    def _hand_over(self, conn: _Conn, data: bytes) -> None:
        listener = conn.listener
        listener.running -= 1
        while listener.waiting and listener.running < self.limits.calls_per_listener:
            queued = listener.waiting.popleft()
            if queued.state == _WAITING and queued.request is not None:
                request, queued.request = queued.request, None
                self._start(queued, request)
        if conn.state == _RUNNING:
            self._respond(conn, data)

    def _respond(self, conn: _Conn, data: bytes) -> None:
        conn.state = _WRITING
        conn.outbuf = memoryview(data)
        conn.deadline = time.monotonic() + self.limits.write_seconds
        self._write(conn)

    def _write(self, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.outbuf)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._close(conn)
            return
        conn.outbuf = conn.outbuf[sent:]
        if conn.outbuf:
            self._interest(conn, selectors.EVENT_WRITE)
            return
        if not conn.keep_alive:
            self._close(conn)
            return
        # Answered: the next request may come, and this connection is evicted last.
        conn.state = _READING
        conn.fresh = True
        conn.deadline = time.monotonic() + self.limits.idle_seconds
        self._unanswered.pop(conn, None)
        self._answered.pop(conn, None)
        self._answered[conn] = None
        self._interest(conn, selectors.EVENT_READ)
        if conn.inbuf:
            conn.fresh = False
            conn.deadline = time.monotonic() + self.limits.request_seconds
            self._advance(conn)

    def _sweep(self, now: float) -> None:
        """Close connections past their deadline; resume paused listeners."""
        for conn in self._connections():
            if conn.state in (_READING, _WRITING) and now >= conn.deadline:
                self._close(conn)
        for listener in self._listeners:
            if not listener.registered and not listener.closed and now >= listener.paused_until:
                self._selector.register(listener.sock, selectors.EVENT_READ, listener)
                listener.registered = True

    def _run(self) -> None:
        try:
            while not self._stopping:
                timeout: float | None = None
                if self.open_connections or any(not li.registered for li in self._listeners):
                    now = time.monotonic()
                    if now >= self._next_sweep:
                        self._sweep(now)
                        self._next_sweep = now + _SWEEP_SECONDS
                    timeout = max(0.0, self._next_sweep - now)
                for key, mask in self._selector.select(timeout):
                    data = key.data
                    if isinstance(data, _Conn) and data.state == _CLOSED:
                        continue  # closed by an earlier event of this round
                    try:
                        if data is None:
                            self._drain_commands()
                        elif isinstance(data, Listener):
                            self._accept(data)
                        elif mask & selectors.EVENT_WRITE:
                            self._write(data)
                        else:
                            self._read(data)
                    except Exception:
                        log.exception("HTTP serving failed")
        finally:
            self._drain_commands()
            for conn in self._connections():
                self._close(conn)
            for listener in list(self._listeners):
                self._remove(listener)
            self._selector.close()
            self._wake_r.close()
