"""The health servers inside the node's network namespace (tests/unit/test_healthcheck.py
serves them on loopback without root)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from kits.http_kit import serving_loop

from kubeplex.core.daemon.httpserving import HTTPServing
from kubeplex.core.daemon.proxy_health import ProxyHealth, ProxyHealthServer
from kubeplex.testing.netlab import unique_prefix


@pytest.fixture
def serving() -> Iterator[HTTPServing]:
    yield from serving_loop()


@pytest.mark.kernel
def test_listeners_open_inside_the_nodes_namespace(serving: HTTPServing) -> None:
    ns = f"{unique_prefix()}-hc"  # reap_stale() finds it if this process dies
    subprocess.run(["ip", "netns", "add", ns], check=True)
    server = None
    try:
        subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"], check=True)
        server = ProxyHealthServer(serving, ProxyHealth(1.0), "127.0.0.1", 0, netns=ns)
        port = server.address[1]
        probe = (
            "import http.client\n"
            f"c = http.client.HTTPConnection('127.0.0.1', {port}, timeout=5)\n"
            "c.request('GET', '/livez')\n"
            "print(c.getresponse().status)\n"
        )
        out = subprocess.run(
            ["ip", "netns", "exec", ns, sys.executable, "-c", probe],
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.strip() == "200"
    finally:
        if server is not None:
            server.close()
        subprocess.run(["ip", "netns", "del", ns], check=False)
