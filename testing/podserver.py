"""A tiny backend "pod" for kernel tests, in the spirit of agnhost netexec.

Run inside a pod namespace::

    python -m kubeplex.testing.podserver --name web-a --port 8080 --udp-port 8081

HTTP (every ``--port``): ``/`` and ``/hostname`` answer the pod name, ``/clientip`` answers
``ip:port`` of the peer as this pod saw it (so a test can tell whether the proxy SNATed).
UDP (every ``--udp-port``): a datagram ``clientip`` is answered with the peer's ``ip:port``,
any other datagram with the pod name.

Once every socket is bound and listening, one line ``READY <json>`` is written to stdout and
stdout is closed: the parent synchronises on that line instead of sleeping, and closing it
means a server that outlives its parent (``kubeplex lab``) can never die of a broken pipe.
Only the standard library is used, so the server starts in well under a second.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Load tests open many short connections at once; the default backlog of 5 would turn a
    # burst into SYN retransmits that look like proxy latency.
    request_queue_size = 256

    def __init__(self, address: tuple[str, int], pod_name: str, verbose: bool) -> None:
        self.pod_name = pod_name
        self.verbose = verbose
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    # HTTP/1.0: one request per connection, so every request is a fresh conntrack flow.
    protocol_version = "HTTP/1.0"

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path in ("/", "/hostname"):
            self._reply(200, self.server.pod_name)
        elif path == "/clientip":
            host, port = self.client_address[0], self.client_address[1]
            self._reply(200, f"{host}:{port}")
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
        reply = f"{peer[0]}:{peer[1]}" if data.strip() == b"clientip" else pod_name
        try:
            sock.sendto(reply.encode(), peer)
        except OSError as exc:  # the peer vanished; keep serving others
            sys.stderr.write(f"udp reply to {peer}: {exc}\n")


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m kubeplex.testing.podserver")
    p.add_argument("--name", required=True, help="pod name returned by /hostname")
    p.add_argument("--port", type=int, action="append", default=[], help="HTTP port (repeatable)")
    p.add_argument("--udp-port", type=int, action="append", default=[], help="UDP echo port")
    p.add_argument("--bind", default="0.0.0.0", help="address to bind (default all)")
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

    http_servers = [_Server((args.bind, port), args.name, args.verbose) for port in args.port]
    udp_socks: list[socket.socket] = []
    for port in args.udp_port:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((args.bind, port))
        udp_socks.append(s)

    threads = [
        threading.Thread(target=srv.serve_forever, name=f"http-{port}", daemon=True)
        for srv, port in zip(http_servers, args.port, strict=True)
    ]
    threads += [
        threading.Thread(target=_udp_echo, args=(s, args.name), name=f"udp-{port}", daemon=True)
        for s, port in zip(udp_socks, args.udp_port, strict=True)
    ]
    for t in threads:
        t.start()

    # Sockets are bound (and TCP ones listening) since construction, so the pod is reachable.
    ready = {"name": args.name, "pid": os.getpid(), "tcp": args.port, "udp": args.udp_port}
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
