"""Smoke test of the guest kernel: what the IPVS mode builds on works here for real.

In one node namespace: the ``kube-ipvs0`` dummy link holding the virtual address, an IPVS
virtual service with two masquerading real servers (pyroute2, read back from the kernel), an
ipset ``hash:ip,port`` entry; then one TCP connection from a client pod through the virtual
service to a backend pod.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from pyroute2 import IPVS, IPVSDest, IPVSService

from kubeplex.testing.netlab import (
    CLIENT_POD,
    HTTP_PORT,
    NODE1,
    WEB_A,
    WEB_B,
    Lab,
    LabSpec,
    NodeSpec,
    PodSpec,
    reap_stale,
    unique_prefix,
)

VIP = "10.96.0.10"
VPORT = 80
SPEC = LabSpec(
    nodes=(NodeSpec(NODE1, "172.18.0.5", "10.244.1.0/24"),),
    pods=(
        PodSpec(WEB_A, NODE1, "10.244.1.2"),
        PodSpec(WEB_B, NODE1, "10.244.1.4"),
        PodSpec(CLIENT_POD, NODE1, "10.244.1.3", http_ports=()),
    ),
)
BACKENDS = {SPEC.pod(WEB_A).ip: WEB_A, SPEC.pod(WEB_B).ip: WEB_B}
FWD_MASQ = 0  # IP_VS_CONN_F_MASQ


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    """One node with two backend pods and a client pod; removed even if the test fails."""
    reap_stale()
    with Lab(SPEC, unique_prefix()) as lab:
        yield lab


def _ip(lab: Lab, *args: str) -> str:
    return lab.exec(NODE1, ["ip", *args]).stdout


def _attr(msg: Any, name: str) -> Any:
    """A raw attribute of a dumped service or destination (pyroute2 rewrites some)."""
    for key, value in msg.get("attrs"):
        if key == name:
            return value
    return None


def _dests(ipvs: IPVS, service: IPVSService) -> list[tuple[str, int, int]]:
    """(address, port, forwarding method) of the service's real servers, as the kernel has
    them (``IPVSDest.from_message`` would report every method as 3, direct routing)."""
    found = []
    for msg in ipvs.dest("dump", service=service):
        nested = msg.get("IPVS_CMD_ATTR_DEST")
        found.append(
            (
                _attr(nested, "IPVS_DEST_ATTR_ADDR"),
                _attr(nested, "IPVS_DEST_ATTR_PORT"),
                _attr(nested, "IPVS_DEST_ATTR_FWD_METHOD"),
            )
        )
    return sorted(found)


def _connections(lab: Lab) -> list[tuple[str, int, str, int]]:
    """IPVS's connection table in the node: (virtual ip, port, real server ip, port)."""

    def ip(hexa: str) -> str:
        return socket.inet_ntoa(bytes.fromhex(hexa))

    rows = lab.exec(NODE1, ["cat", "/proc/net/ip_vs_conn"]).stdout.splitlines()[1:]
    conns = []
    for row in rows:
        _proto, _cip, _cport, vip, vport, dip, dport, *_ = row.split()
        conns.append((ip(vip), int(vport, 16), ip(dip), int(dport, 16)))
    return conns


def test_ipvs_dummy_ipset_and_one_connection(lab: Lab) -> None:
    node = lab.namespace_of(NODE1)

    # kube-ipvs0 holds every virtual address (kube-proxy leaves it down: the local route
    # exists all the same).
    _ip(lab, "link", "add", "kube-ipvs0", "type", "dummy")
    _ip(lab, "addr", "add", f"{VIP}/32", "dev", "kube-ipvs0")
    assert f"{VIP}/32" in _ip(lab, "-o", "addr", "show", "dev", "kube-ipvs0")
    assert f"local {VIP}" in _ip(lab, "route", "show", "table", "local")

    service = IPVSService(addr=VIP, port=VPORT, protocol=socket.IPPROTO_TCP, sched_name="rr")
    with IPVS(netns=node) as ipvs:
        ipvs.service("add", service=service)
        for ip in BACKENDS:
            dest = IPVSDest(addr=ip, port=HTTP_PORT, fwd_method=FWD_MASQ)
            ipvs.dest("add", service=service, dest=dest)

        services = [IPVSService.from_message(m) for m in ipvs.service("dump")]
        assert [(s["addr"], s["port"], s["protocol"]) for s in services] == [
            (VIP, VPORT, socket.IPPROTO_TCP)
        ]
        assert services[0]["sched_name"] == "rr"
        assert _dests(ipvs, service) == [(ip, HTTP_PORT, FWD_MASQ) for ip in sorted(BACKENDS)]

        # The set kube-proxy's IPVS mode matches cluster IPs with (per namespace, as IPVS).
        ipset = ["ipset"]
        lab.exec(NODE1, [*ipset, "create", "KUBE-CLUSTER-IP", "hash:ip,port"])
        lab.exec(NODE1, [*ipset, "add", "KUBE-CLUSTER-IP", f"{VIP},tcp:{VPORT}"])
        lab.exec(NODE1, [*ipset, "test", "KUBE-CLUSTER-IP", f"{VIP},tcp:{VPORT}"])
        listed = lab.exec(NODE1, [*ipset, "list", "KUBE-CLUSTER-IP"]).stdout
        assert "Type: hash:ip,port" in listed
        assert f"{VIP},tcp:{VPORT}" in listed
        absent = subprocess.run(
            ["ipset", "list", "-n"], capture_output=True, text=True, check=False
        ).stdout
        assert "KUBE-CLUSTER-IP" not in absent.split()  # the root namespace has no such set

        # One TCP connection through the virtual service, NATed to one of the backends.
        [probe] = lab.http(CLIENT_POD, VIP, VPORT, "/hostname", timeout=10.0)
        assert probe.ok, probe
        assert probe.body in BACKENDS.values()
    # IPVS (not some other path) carried it: its one connection entry names that backend.
    [(vip, vport, real_ip, real_port)] = _connections(lab)
    assert (vip, vport, real_port) == (VIP, VPORT, HTTP_PORT)
    assert BACKENDS[real_ip] == probe.body
