"""A probe client for kernel tests; prints one JSON document on stdout.

Run inside a namespace::

    python -m kubeplex.testing.netclient http 10.96.0.10 80 /hostname --count 20 --timeout 1
    python -m kubeplex.testing.netclient udp 10.96.0.10 53 --count 5 --source-port 40000
    python -m kubeplex.testing.netclient http fd00:96::59 80 /clientip    # IPv6 ([ip] works too)

Every HTTP request uses a new TCP connection (a new conntrack flow, a new load-balancing
decision). UDP uses a new socket per datagram unless ``--source-port`` pins the 5-tuple,
which is what conntrack tests need (a stale entry keeps matching the same flow).

Output: ``{"proto": ..., "target": "ip:port", "results": [...]}`` (``[ip]:port`` for an IPv6
target) with one result per
request: ``outcome`` is ``ok`` (``body``, ``status``), ``refused``, ``timeout``,
``unreachable``, ``reset`` or ``error`` (``error`` holds the text), and ``ms`` is the elapsed
wall time. Only the standard library is used so the probe starts fast in any namespace.
"""

from __future__ import annotations

import argparse
import errno
import http.client
import json
import socket
import sys
import time
from collections.abc import Sequence
from typing import Any

MAX_COUNT = 10_000
MAX_TIMEOUT = 60.0

_UNREACHABLE = {errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EHOSTDOWN, errno.ENETDOWN}


def _classify(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, ConnectionRefusedError):
        return {"outcome": "refused"}
    if isinstance(exc, TimeoutError):
        return {"outcome": "timeout"}
    if isinstance(exc, ConnectionResetError | ConnectionAbortedError | BrokenPipeError):
        return {"outcome": "reset", "error": str(exc)}
    if isinstance(exc, http.client.RemoteDisconnected):
        return {"outcome": "reset", "error": str(exc)}
    if isinstance(exc, OSError) and exc.errno in _UNREACHABLE:
        return {"outcome": "unreachable", "error": str(exc)}
    return {"outcome": "error", "error": f"{type(exc).__name__}: {exc}"}


def _host(ip: str) -> str:
    """An address as given, or without the brackets of ``[ipv6]``."""
    return ip[1:-1] if ip.startswith("[") and ip.endswith("]") else ip


def _family(ip: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in ip else socket.AF_INET


def target_text(ip: str, port: int) -> str:
    ip = _host(ip)
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def http_get(
    ip: str, port: int, path: str, timeout: float, source_ip: str | None
) -> dict[str, Any]:
    source = (_host(source_ip), 0) if source_ip else None
    conn = http.client.HTTPConnection(_host(ip), port, timeout=timeout, source_address=source)
    start = time.monotonic()
    try:
        conn.request("GET", path, headers={"Connection": "close"})
        resp = conn.getresponse()
        body = resp.read().decode(errors="replace")
        result: dict[str, Any] = {"outcome": "ok", "status": resp.status, "body": body}
    except Exception as exc:
        result = _classify(exc)
    finally:
        conn.close()
    result["ms"] = round((time.monotonic() - start) * 1000, 2)
    return result


def udp_exchange(
    ip: str,
    port: int,
    payload: bytes,
    timeout: float,
    source_ip: str | None,
    source_port: int | None,
) -> dict[str, Any]:
    ip = _host(ip)
    family = _family(ip)
    sock = socket.socket(family, socket.SOCK_DGRAM)
    start = time.monotonic()
    try:
        sock.settimeout(timeout)
        if source_ip or source_port:
            # Pinning the source port across probes needs SO_REUSEADDR: the previous probe's
            # socket is closed, but be tolerant of a concurrent one in the same namespace.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            any_ip = "::" if family == socket.AF_INET6 else "0.0.0.0"
            sock.bind((_host(source_ip) if source_ip else any_ip, source_port or 0))
        # connect() so an ICMP port-unreachable (REJECT, no listener) surfaces as ECONNREFUSED.
        sock.connect((ip, port))
        sock.send(payload)
        data = sock.recv(65535)
        result: dict[str, Any] = {"outcome": "ok", "body": data.decode(errors="replace")}
    except Exception as exc:
        result = _classify(exc)
    finally:
        sock.close()
    result["ms"] = round((time.monotonic() - start) * 1000, 2)
    return result


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m kubeplex.testing.netclient")
    sub = p.add_subparsers(dest="proto", required=True)
    for name in ("http", "udp"):
        s = sub.add_parser(name)
        s.add_argument("ip")
        s.add_argument("port", type=int)
        if name == "http":
            s.add_argument("path", nargs="?", default="/hostname")
        else:
            s.add_argument("--payload", default="hostname")
            s.add_argument("--source-port", type=int, default=None)
        s.add_argument("--count", type=int, default=1)
        s.add_argument("--timeout", type=float, default=2.0, help="seconds per request")
        s.add_argument("--interval", type=float, default=0.0, help="seconds between requests")
        s.add_argument("--source-ip", default=None)
    args = p.parse_args(argv)
    if not 1 <= args.count <= MAX_COUNT:
        p.error(f"--count must be 1..{MAX_COUNT}")
    if not 0 < args.timeout <= MAX_TIMEOUT:
        p.error(f"--timeout must be in (0, {MAX_TIMEOUT}]")
    if not 0 <= args.interval <= MAX_TIMEOUT:
        p.error(f"--interval must be in [0, {MAX_TIMEOUT}]")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    results: list[dict[str, Any]] = []
    for i in range(args.count):
        if i and args.interval:
            time.sleep(args.interval)  # pacing requested by the caller, not synchronisation
        if args.proto == "http":
            r = http_get(args.ip, args.port, args.path, args.timeout, args.source_ip)
        else:
            r = udp_exchange(
                args.ip,
                args.port,
                args.payload.encode(),
                args.timeout,
                args.source_ip,
                args.source_port,
            )
        results.append(r)
    doc = {"proto": args.proto, "target": target_text(args.ip, args.port), "results": results}
    json.dump(doc, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
