"""A tiny backend "pod" for kernel tests, in the spirit of agnhost netexec.

Run inside a pod namespace::

    python -m kubeplex.testing.podserver --name web-a --port 8080 --udp-port 8081

HTTP (every ``--port``): ``/`` and ``/hostname`` answer the pod name, ``/clientip`` answers
``ip:port`` of the peer as this pod saw it (so a test can tell whether the proxy SNATed);
an IPv6 peer is written ``[ip]:port``. UDP (every ``--udp-port``): a datagram ``clientip`` is
answered with the peer's address in the same form, any other datagram with the pod name.

Every port is served on both families: by default on ``0.0.0.0`` and, where the namespace has
IPv6 at all, on ``::`` (an IPv6-only socket, so IPv4 peers keep their plain ``ip:port``).
``--bind`` (repeatable) replaces that with exactly the given addresses.

Once every socket is bound and listening, one line ``READY <json>`` is written to stdout and
stdout is closed: the parent synchronises on that line instead of sleeping, and closing it
means a server that outlives its parent (``kubeplex lab``) can never die of a broken pipe.
Only the standard library is used, so the server starts in well under a second.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import socket
import socketserver
import sys
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any

DEFAULT_BINDS = ("0.0.0.0", "::")
#: bind errors that mean "this namespace has no IPv6", for the best-effort default ``::``.
_NO_IPV6 = {errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL, errno.EPROTONOSUPPORT}


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def peer_text(peer: tuple[Any, ...]) -> str:
    """``ip:port``, or ``[ip]:port`` for IPv6 (IPv4-mapped addresses shown as IPv4)."""
    host, port = str(peer[0]), int(peer[1])
    if host.startswith("::ffff:") and "." in host:
        host = host[len("::ffff:") :]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Load tests open many short connections at once; the default backlog of 5 would turn a
    # burst into SYN retransmits that look like proxy latency.
    request_queue_size = 256

    def __init__(self, address: tuple[str, int], pod_name: str, verbose: bool) -> None:
        self.pod_name = pod_name
        self.verbose = verbose
        self.address_family = _family(address[0])
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        # HTTPServer.server_bind would also resolve the host name (getfqdn): a DNS query from
        # inside the lab for nothing. The name is only used in CGI environments.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    # HTTP/1.0: one request per connection, so every request is a fresh conntrack flow.
    protocol_version = "HTTP/1.0"

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path in ("/", "/hostname"):
            self._reply(200, self.server.pod_name)
        elif path == "/clientip":
            self._reply(200, peer_text(self.client_address))
        elif path == "/healthz":
            self._reply(200, "ok")
        else:
            self._reply(404, f"unknown path {path}")

    def _reply(self, status: int, text: str) -> None:
        body = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        if self.server.verbose:
            sys.stderr.write(f"{self.address_string()} {format % args}\n")


def _udp_echo(sock: socket.socket, pod_name: str) -> None:
    while True:
        try:
            data, peer = sock.recvfrom(65535)
        except OSError:
            return
        reply = peer_text(peer) if data.strip() == b"clientip" else pod_name
        try:
            sock.sendto(reply.encode(), peer)
        except OSError as exc:  # the peer vanished; keep serving others
            sys.stderr.write(f"udp reply to {peer}: {exc}\n")


def _udp_socket(host: str, port: int) -> socket.socket:
    s = socket.socket(_family(host), socket.SOCK_DGRAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if s.family == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        s.bind((host, port))
    except OSError:
        s.close()
        raise
    return s


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m kubeplex.testing.podserver")
    p.add_argument("--name", required=True, help="pod name returned by /hostname")
    p.add_argument("--port", type=int, action="append", default=[], help="HTTP port (repeatable)")
    p.add_argument("--udp-port", type=int, action="append", default=[], help="UDP echo port")
    p.add_argument(
        "--bind",
        action="append",
        default=[],
        help="address to bind (repeatable; default 0.0.0.0 and, if IPv6 works, ::)",
    )
    p.add_argument("--verbose", action="store_true", help="log every request to stderr")
    args = p.parse_args(argv)
    if not args.port and not args.udp_port:
        p.error("need at least one --port or --udp-port")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)

    def _stop(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _stop)

    binds: list[str] = args.bind or list(DEFAULT_BINDS)
    optional = set() if args.bind else {"::"}
    http_servers: list[_Server] = []
    udp_socks: list[socket.socket] = []
    bound: list[str] = []
    for host in binds:
        servers: list[_Server] = []
        socks: list[socket.socket] = []
        try:
            for port in args.port:
                servers.append(_Server((host, port), args.name, args.verbose))
            for port in args.udp_port:
                socks.append(_udp_socket(host, port))
        except OSError as exc:
            for srv in servers:
                srv.server_close()
            for sock in socks:
                sock.close()
            if host in optional and exc.errno in _NO_IPV6:
                continue  # no IPv6 in this namespace: serve IPv4 only
            raise
        http_servers += servers
        udp_socks += socks
        bound.append(host)

    threads = [
        threading.Thread(target=srv.serve_forever, name=f"http-{srv.server_port}", daemon=True)
        for srv in http_servers
    ]
    threads += [
        threading.Thread(
            target=_udp_echo, args=(s, args.name), name=f"udp-{s.getsockname()[1]}", daemon=True
        )
        for s in udp_socks
    ]
    for t in threads:
        t.start()

    # Sockets are bound (and TCP ones listening) since construction, so the pod is reachable.
    ready = {
        "name": args.name,
        "pid": os.getpid(),
        "tcp": args.port,
        "udp": args.udp_port,
        "bind": bound,
    }
    sys.stdout.write(f"READY {json.dumps(ready)}\n")
    sys.stdout.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)

    try:
        threading.Event().wait()
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        for srv in http_servers:
            srv.server_close()
        for s in udp_socks:
            s.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
