"""The ipvs mode against a real IPVS kernel (runs in the test VM; skipped without IPVS).

Few and small: Python runs about twenty times slower in the guest. Each test has its own
network namespace; the backend programs it through the real seam (``IpvsKernel``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from kubeplex.backends.ipvs import IpvsBackend
from kubeplex.backends.ipvs.kernel import IpvsKernel
from kubeplex.backends.ipvs.plan import RealKey, VirtualKey
from kubeplex.core.config.kubeproxy import with_overrides
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import BackendContext
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.types import IPFamily
from kubeplex.core.model.types import Protocol as L4
from kubeplex.testing.dataplane import endpoint, endpoint_slice, lab_config, node_object, service

V4 = IPFamily.IPv4
NODE, NODE_IP = "kind-worker", "10.0.0.2"
POD = "10.244.1.5"  # on the namespace's loopback: IPVS serves it as a local real server


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


@pytest.fixture
def netns() -> Iterator[str]:
    name = f"kpx-ipvs-{uuid.uuid4().hex[:8]}"
    _run("ip", "netns", "add", name)
    try:
        _run("ip", "-n", name, "link", "set", "lo", "up")
        _run("ip", "-n", name, "addr", "add", f"{POD}/32", "dev", "lo")
        _run("ip", "-n", name, "link", "add", "eth0", "type", "dummy")
        _run("ip", "-n", name, "addr", "add", f"{NODE_IP}/24", "dev", "eth0")
        _run("ip", "-n", name, "link", "set", "eth0", "up")
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


class Node:
    def __init__(self, netns: str, **ipvs: Any) -> None:
        cfg = with_overrides(
            lab_config("ipvs"),
            mode="ipvs",
            hostname_override=NODE,
            known_modes=plugins.known_modes(),
        )
        if ipvs:
            cfg = dataclasses.replace(cfg, ipvs=dataclasses.replace(cfg.ipvs, **ipvs))
        self.kernel = IpvsKernel(netns)
        self.backend = IpvsBackend(BackendContext(cfg, NODE, (V4,), netns, kernel=self.kernel))
        self.backend.prepare()
        self.state = ClusterState(NODE, (V4,))
        self.state.set_node(node_object(NODE, NODE_IP, "10.244.1.0/24"))

    def serve(self, name: str, vip: str, ips: list[str], **kw: Any) -> None:
        self.state.set_service(service(name, vip, 80, target_port=8080, **kw))
        self.slice(name, ips, protocol=kw.get("protocol", "TCP"))

    def slice(self, name: str, ips: list[str], protocol: str = "TCP") -> None:
        eps = [endpoint(ip, NODE) for ip in ips]
        self.state.set_endpoint_slice(endpoint_slice(name, eps, port=8080, protocol=protocol))

    def sync(self, full: bool = False) -> int:
        """One sync; the netlink requests its apply sent."""
        ps = self.state.checkout(full=full)
        rendered = self.backend.render(ps, self.backend.observe(ps))
        before = self.kernel.requests_sent
        self.backend.apply(rendered)
        return self.kernel.requests_sent - before


def _lab(node: Node) -> None:
    node.serve("web", "10.96.0.10", [POD, "10.244.2.6", "10.244.2.7"])
    node.serve("np", "10.96.0.30", [POD], type="NodePort", node_port=30080)
    node.serve("dns", "10.96.0.53", ["10.244.2.8"], protocol="UDP")
    node.serve("sticky", "10.96.0.40", ["10.244.2.9"], session_affinity="ClientIP")


def test_an_applied_plan_reads_back_as_the_desired_state(netns: str) -> None:
    node = Node(netns)
    _lab(node)
    node.sync(full=True)
    want = node.backend.renderers[V4].snapshot()
    held = node.kernel.dump(V4)
    assert held.link
    assert dict(held.virtual) == dict(want.virtual)
    assert {k: dict(v) for k, v in held.real.items()} == {k: dict(v) for k, v in want.real.items()}
    assert held.addresses == want.addresses
    assert {n: set(e) for n, e in held.entries.items()} == {
        n: set(e) for n, e in want.entries.items()
    }
    assert VirtualKey(L4.TCP, NODE_IP, 30080) in held.virtual
    assert held.virtual[VirtualKey(L4.TCP, "10.96.0.40", 80)].persistence == 10800
    link = subprocess.run(
        ["ip", "-n", netns, "-o", "link", "show", "kube-ipvs0"], capture_output=True, text=True
    ).stdout
    assert "state DOWN" in link or ",UP" not in link
    # Without a transmit queue, as upstream creates it (the kernel's default is 1000).
    txqlen = subprocess.run(
        ["ip", "netns", "exec", netns, "cat", "/sys/class/net/kube-ipvs0/tx_queue_len"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert txqlen.strip() == "0"
    # Masquerading forward (the dump reads the raw method: another one reads as weight -1,
    # so the equality above says it), and as ipvsadm reads it where it is installed.
    if shutil.which("ipvsadm"):
        listed = subprocess.run(
            ["ip", "netns", "exec", netns, "ipvsadm", "-S", "-n"], capture_output=True, text=True
        ).stdout
        assert "-a -t 10.96.0.10:80 -r 10.244.2.6:8080 -m -w 1" in listed
    # A second full sync finds nothing to change.
    assert node.sync(full=True) == 0


def test_a_one_endpoint_change_is_a_few_requests_and_cleanup_leaves_nothing(netns: str) -> None:
    node = Node(netns)
    _lab(node)
    node.sync(full=True)
    node.slice("web", [POD, "10.244.2.6", "10.244.2.7", "10.244.2.99"])
    assert node.sync() <= 5
    assert (
        RealKey("10.244.2.99", 8080)
        in node.kernel.dump(V4).real[VirtualKey(L4.TCP, "10.96.0.10", 80)]
    )
    report = node.backend.cleanup()
    assert "link kube-ipvs0" in report.removed
    assert node.backend.leftovers() == []
    after = node.kernel.dump(V4)
    assert not after.virtual and not after.link and not after.ipsets


def test_a_long_lived_connection_survives_its_endpoints_removal(netns: str) -> None:
    from pyroute2 import netns as pr_netns

    node = Node(netns)
    node.serve("web", "10.96.0.10", [POD])
    node.sync(full=True)
    server = pr_netns.create_socket(netns, socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((POD, 8080))
    server.listen(1)

    def echo() -> None:
        conn, _ = server.accept()
        with conn, contextlib.suppress(OSError):  # the client resets it at the end
            while data := conn.recv(100):
                conn.sendall(data)

    threading.Thread(target=echo, daemon=True).start()
    client = pr_netns.create_socket(netns, socket.AF_INET, socket.SOCK_STREAM)
    client.settimeout(10)
    client.connect(("10.96.0.10", 80))
    client.sendall(b"one")
    assert client.recv(100) == b"one"
    key, real = VirtualKey(L4.TCP, "10.96.0.10", 80), RealKey(POD, 8080)

    node.slice("web", [])  # the endpoint goes
    node.sync()
    held = node.kernel.dump(V4)
    assert held.real[key][real].weight == 0, "terminating: weight 0, not deleted"
    client.sendall(b"two")
    assert client.recv(100) == b"two", "the established connection still flows"
    node.sync()
    assert real in node.kernel.dump(V4).real[key], "kept while the connection is open"

    # Closed by a reset: IPVS forgets the connection within its CLOSE timeout (10 s).
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    client.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        node.sync()
        if real not in node.kernel.dump(V4).real.get(key, {}):
            break
        time.sleep(1)
    assert real not in node.kernel.dump(V4).real.get(key, {}), "deleted once idle"
    server.close()
