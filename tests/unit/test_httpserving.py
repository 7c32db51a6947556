"""The HTTP serving loop under clients that hold it: idle and slow connections, more of them
than it keeps open, oversized or malformed requests, slow answers; over real sockets on
loopback (tests/unit/test_healthcheck.py covers what the health servers answer)."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from kubeplex.core.daemon.httpserving import (
    BadRequest,
    HTTPServing,
    Limits,
    Response,
    parse_head,
)

OK: Response = (200, (("Content-Type", "text/plain"),), b"ok")


def echo(method: str, path: str) -> Response:
    return 200, (("Content-Type", "text/plain"),), f"{method} {path}".encode()


def connect(address: tuple[str, int]) -> socket.socket:
    return socket.create_connection(address, timeout=5)


_leftover: dict[int, bytes] = {}


def read_response(sock: socket.socket, head: bool = False) -> tuple[int, dict[str, str], bytes]:
    """One answer from a raw socket (Content-Length framed; no body after a HEAD); what
    follows it (a pipelined answer) is kept for the next call."""
    data = _leftover.pop(sock.fileno(), b"")
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        assert chunk, f"closed before an answer: {data!r}"
        data += chunk
    top, _, rest = data.partition(b"\r\n\r\n")
    lines = top.decode().split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {k.lower(): v for k, _, v in (line.partition(": ") for line in lines[1:])}
    length = 0 if head else int(headers.get("content-length", "0"))
    while len(rest) < length:
        rest += sock.recv(4096)
    _leftover[sock.fileno()] = rest[length:]
    return status, headers, rest[:length]


def closed_by_peer(sock: socket.socket, within: float) -> bool:
    sock.settimeout(within)
    try:
        while True:
            if not sock.recv(4096):
                return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def get(address: tuple[str, int], path: str = "/healthz", timeout: float = 1.0) -> int:
    """A kubelet-like probe: a new connection, one GET, ``timeout`` for all of it."""
    conn = http.client.HTTPConnection(*address, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Connection": "close"})
        return conn.getresponse().status
    finally:
        conn.close()


def wait_for(cond: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@pytest.fixture
def make_serving() -> Iterator[Callable[..., HTTPServing]]:
    loops: list[HTTPServing] = []

    def make(**limits: float) -> HTTPServing:
        loop = HTTPServing(limits=Limits(**limits))  # type: ignore[arg-type]
        loops.append(loop)
        return loop

    yield make
    for loop in loops:
        loop.stop()


# --------------------------------------------------------------------- clients that hold it


def test_idle_connections_hold_no_thread() -> None:
    serving = HTTPServing()
    sockets: list[socket.socket] = []
    try:
        listener = serving.listen("127.0.0.1", 0, lambda m, p: OK)
        address = serving.address_of(listener)
        assert get(address) == 200
        threads = threading.active_count()
        sockets = [connect(address) for _ in range(300)]
        assert get(address) == 200  # accepted after every idle one
        assert threading.active_count() <= threads + 2
    finally:
        for sock in sockets:
            sock.close()
        serving.stop()


def test_beyond_the_cap_the_longest_idle_connection_closes_and_probes_are_served(
    make_serving: Callable[..., HTTPServing],
) -> None:
    serving = make_serving(max_connections=20)
    address = serving.address_of(serving.listen("127.0.0.1", 0, lambda m, p: OK))
    # A client that keeps its connection alive and uses it is closed last.
    keeper = http.client.HTTPConnection(*address, timeout=5)
    keeper.request("GET", "/metrics")
    assert keeper.getresponse().read() == b"ok"
    idle = [connect(address) for _ in range(100)]
    try:
        for _ in range(10):
            assert get(address) == 200
        wait_for(lambda: serving.open_connections <= 20, "the cap")
        assert closed_by_peer(idle[0], within=2)  # the oldest idle ones went first
        assert not closed_by_peer(idle[-1], within=0.2)
        keeper.request("GET", "/metrics")  # the same connection, still open
        assert keeper.getresponse().read() == b"ok"
    finally:
        keeper.close()
        for sock in idle:
            sock.close()


def test_a_request_trickling_in_is_cut_off_at_its_deadline(
    make_serving: Callable[..., HTTPServing],
) -> None:
    serving = make_serving(request_seconds=0.6)
    address = serving.address_of(serving.listen("127.0.0.1", 0, lambda m, p: OK))
    slow = connect(address)
    silent = connect(address)
    started = time.monotonic()
    try:
        for byte in b"GET /healthz HTTP/1.1\r\n":  # a byte every 0.1 s never finishes in time
            try:
                slow.send(bytes([byte]))
            except OSError:
                break
            time.sleep(0.1)
        assert closed_by_peer(slow, within=1)
        assert closed_by_peer(silent, within=0.1)
        assert time.monotonic() - started < 3
        assert get(address) == 200
    finally:
        slow.close()
        silent.close()


def test_a_kept_alive_connection_is_closed_when_idle(
    make_serving: Callable[..., HTTPServing],
) -> None:
    serving = make_serving(idle_seconds=0.5, request_seconds=5)
    address = serving.address_of(serving.listen("127.0.0.1", 0, echo))
    with connect(address) as sock:
        for _ in range(3):  # kept alive between requests shorter than the idle time
            sock.sendall(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_response(sock)[2] == b"GET /a"
            time.sleep(0.2)
        assert closed_by_peer(sock, within=2)
    assert serving.open_connections == 0


def test_a_client_that_never_reads_its_answer_is_closed(
    make_serving: Callable[..., HTTPServing],
) -> None:
    big: Response = (200, (), b"x" * (8 << 20))
    serving = make_serving(write_seconds=0.5)
    address = serving.address_of(serving.listen("127.0.0.1", 0, lambda m, p: big))
    with connect(address) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
        wait_for(lambda: serving.open_connections == 0, "the write deadline", timeout=3)


def test_a_slow_answer_of_one_listener_does_not_hold_up_another(
    make_serving: Callable[..., HTTPServing],
) -> None:
    release = threading.Event()

    def stuck(method: str, path: str) -> Response:
        release.wait(10)
        return OK

    serving = make_serving(workers=4, calls_per_listener=2)
    metrics = serving.address_of(serving.listen("127.0.0.1", 0, stuck))
    health = serving.address_of(serving.listen("127.0.0.1", 0, lambda m, p: OK))
    scrapes = [connect(metrics) for _ in range(6)]
    try:
        for sock in scrapes:
            sock.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
        for _ in range(5):
            assert get(health) == 200
        release.set()
        for sock in scrapes:  # the ones that waited for a worker are answered too
            assert read_response(sock)[0] == 200
    finally:
        release.set()
        for sock in scrapes:
            sock.close()


# ------------------------------------------------------------------------------ the protocol


def test_keep_alive_pipelining_head_and_bodies(make_serving: Callable[..., HTTPServing]) -> None:
    serving = make_serving()
    address = serving.address_of(serving.listen("127.0.0.1", 0, echo))
    with connect(address) as sock:
        # A POST's body is read and dropped: the next request on the connection is intact.
        sock.sendall(
            b"POST /x?q=1 HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello"
            b"GET /y HTTP/1.1\r\n\r\nHEAD /z HTTP/1.1\r\n\r\n"
        )
        assert read_response(sock)[2] == b"POST /x"
        status, headers, body = read_response(sock)
        assert (status, body) == (200, b"GET /y")
        assert headers["content-length"] == "6" and headers["date"].endswith(" GMT")
        status, headers, body = read_response(sock, head=True)
        assert headers["content-length"] == "7" and body == b""  # HEAD: no body
        sock.sendall(b"GET /last HTTP/1.1\r\nConnection: close\r\n\r\n")
        status, headers, body = read_response(sock)
        assert body == b"GET /last" and headers["connection"] == "close"
        assert closed_by_peer(sock, within=1)
    with connect(address) as sock:  # HTTP/1.0: closed unless asked to keep it
        sock.sendall(b"GET /old HTTP/1.0\r\n\r\n")
        assert read_response(sock)[2] == b"GET /old"
        assert closed_by_peer(sock, within=1)
    with connect(address) as sock:
        sock.sendall(b"GET /old HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        assert read_response(sock)[1]["connection"] == "keep-alive"
        sock.sendall(b"GET /again HTTP/1.0\r\n\r\n")
        assert read_response(sock)[2] == b"GET /again"


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nBad Header\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost : x\r\n\r\n", 400),
        (b"GET / HTTP/2.0\r\n\r\n", 505),
        (b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 501),
        (b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n", 413),
        (b"GET / HTTP/1.1\r\nX: " + b"a" * 9000 + b"\r\n\r\n", 431),
        (b"DELETE / HTTP/1.1\r\n\r\n", 501),
    ],
)
def test_bad_requests_are_answered_and_closed(
    make_serving: Callable[..., HTTPServing], request_bytes: bytes, status: int
) -> None:
    serving = make_serving()
    address = serving.address_of(serving.listen("127.0.0.1", 0, echo))
    with connect(address) as sock:
        sock.sendall(request_bytes)
        got, headers, _ = read_response(sock)
        assert (got, headers["connection"]) == (status, "close")
        assert closed_by_peer(sock, within=1)


def test_a_failing_app_is_a_500_and_the_listener_lives_on(
    make_serving: Callable[..., HTTPServing],
) -> None:
    def app(method: str, path: str) -> Response:
        if path == "/boom":
            raise RuntimeError("bug")
        if path == "/split":
            return 200, (("X-Evil", "a\r\nSet-Cookie: x"),), b""
        return OK

    serving = make_serving()
    address = serving.address_of(serving.listen("127.0.0.1", 0, app))
    assert get(address, "/boom") == 500
    assert get(address, "/split") == 500  # no header splitting
    assert get(address, "/fine") == 200


def test_parse_head_paths_and_keep_alive() -> None:
    req = parse_head(b"GET http://node:10256/healthz?x=1 HTTP/1.1\r\nConnection: Close", 10)
    assert (req.path, req.keep_alive, req.body_length) == ("/healthz", False, 0)
    assert parse_head(b"GET /a HTTP/1.1\nHost: b", 10).keep_alive  # bare LF, as Go accepts
    with pytest.raises(BadRequest):
        parse_head(b"GET /a HTTP/1.1\r\n folded", 10)
    with pytest.raises(BadRequest):
        parse_head(b"GET /a HTTP/1.1\r\nContent-Length: \xd9\xa3", 10)  # non-ASCII digit
