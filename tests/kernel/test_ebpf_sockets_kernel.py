"""The ebpf mode against the kernel, where sockets meet the maps: a dual-stack socket naming
an IPv4 Service as ::ffff:a.b.c.d, and a client's affinity kept while its endpoint moves to
another slot. A bpffs and a cgroup of the test's own; servers on a namespace's loopback."""

from __future__ import annotations

from collections.abc import Iterator
from ipaddress import ip_address
from pathlib import Path
from typing import Any

import pytest
from kits.ebpf_kit import client, own_bpffs, own_cgroup, own_loader, serving
from kits.render_kit import config, endpoint_slice, ep, node_obj, service

from kubeplex.backends.ebpf import EbpfBackend, layout
from kubeplex.core.dataplane.backend import BackendContext
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.types import IPFamily

pytestmark = pytest.mark.kernel

NODE = "node-a"
SERVICE = "10.96.0.10"
MAPPED = f"::ffff:{SERVICE}"
PODS = ["10.244.1.5", "10.244.1.6", "10.244.1.7"]


@pytest.fixture
def setup(netns: str) -> Iterator[tuple[Path, Path, str]]:
    with own_bpffs() as bpffs, own_cgroup() as cgroup, own_loader(bpffs), serving(netns, PODS):
        yield bpffs, cgroup, netns


def backend_on(bpffs: Path, cgroup: Path) -> EbpfBackend:
    options = {"bpffs": str(bpffs), "cgroup": str(cgroup)}
    ctx = BackendContext(config({"mode": "nftables"}), NODE, families=(IPFamily.IPv4,))
    backend = EbpfBackend(ctx, options=options)
    backend.prepare()
    return backend


def web(pods: list[str], **spec: Any) -> ClusterState:
    """web: TCP 80 and UDP 53 on SERVICE, to the pods' 8080 and 5353."""
    cluster = ClusterState(NODE, (IPFamily.IPv4,))
    cluster.set_node(node_obj())
    ports = [
        {"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
        {"name": "dns", "port": 53, "targetPort": 5353, "protocol": "UDP"},
    ]
    cluster.set_service(service("ns1", "web", SERVICE, ports, **spec))
    set_pods(cluster, pods)
    return cluster


def set_pods(cluster: ClusterState, pods: list[str]) -> None:
    ports = [
        {"name": "http", "port": 8080, "protocol": "TCP"},
        {"name": "dns", "port": 5353, "protocol": "UDP"},
    ]
    cluster.set_endpoint_slice(endpoint_slice("ns1", "web", [ep(p) for p in pods], ports))


# --- IPv4-mapped addresses on IPv6 sockets ------------------------------------------------------


def test_a_dual_stack_socket_reaches_an_ipv4_service_by_its_mapped_address(
    setup: tuple[Path, Path, str],
) -> None:
    bpffs, cgroup, netns = setup
    backend = backend_on(bpffs, cgroup)
    assert not backend.sync(web(PODS[:1]).checkout(full=True)).failed
    # TCP: connect6 translates, getpeername6 shows the Service, both IPv4-mapped.
    assert client(netns, cgroup, MAPPED, 80, "tcp") == {"data": PODS[0], "peer": [MAPPED, 80]}
    # Unconnected UDP: the reply, read through recvmsg6, comes from the mapped Service address.
    reply = client(netns, cgroup, MAPPED, 53, "udp")
    assert reply == {"data": f"{PODS[0]} ping", "peer": [MAPPED, 53]}
    # Without endpoints the mapped address is refused like the IPv4 one.
    cluster = web([])
    backend.sync(cluster.checkout(full=True))
    assert client(netns, cgroup, MAPPED, 80, "tcp") == {"errno": 111}
    backend.cleanup()


# --- affinity across a slot move ----------------------------------------------------------------


def test_affinity_follows_an_endpoint_moved_to_another_slot(
    setup: tuple[Path, Path, str],
) -> None:
    bpffs, cgroup, netns = setup
    backend = backend_on(bpffs, cgroup)
    cluster = web(PODS, sessionAffinity="ClientIP")
    backend.sync(cluster.checkout(full=True))
    svc_id = next(
        layout.SVC_VALUE.unpack(v)[0]
        for k, v in backend.kernel.dump("kpx_svc4").items()
        if layout.SVC4_KEY.unpack(k)[2] == layout.PROTO_TCP
    )

    def pod_in(slot: int) -> str:
        value = backend.kernel.lookup("kpx_backends", layout.backend_key(svc_id, slot))
        return str(ip_address(layout.BACKEND_VALUE.unpack(value)[0][:4]))

    # The client (its network namespace) sticks to the endpoint of the last slot: retried
    # with its affinity entry forgotten until the random pick lands there.
    last = pod_in(2)
    for _ in range(60):
        for key in backend.kernel.dump("kpx_affinity"):
            backend.kernel.delete("kpx_affinity", key)
        if client(netns, cgroup, SERVICE, 80, "tcp")["data"] == last:
            break
    else:
        pytest.fail(f"no connection of 60 landed on {last}")

    # The endpoint of slot 0 goes: the last one moves into slot 0, the count drops to 2.
    set_pods(cluster, [p for p in PODS if p != pod_in(0)])
    plan = backend.render(cluster.checkout())
    assert not plan.full
    backend.apply(plan)
    assert pod_in(0) == last
    # Its client stays with it (all 12 on it by chance, were it lost: 1 in 4,096).
    assert {client(netns, cgroup, SERVICE, 80, "tcp")["data"] for _ in range(12)} == {last}
    backend.cleanup()
