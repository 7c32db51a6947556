"""The ebpf mode against the kernel, where sockets meet the maps: a dual-stack socket naming
an IPv4 Service as ::ffff:a.b.c.d, a client's affinity kept while its endpoint moves to
another slot, the maps dumped in batches (and key by key where a map type has no batch
lookup), and what a drain keeps for replies and getpeername. A bpffs and a cgroup of the
test's own; servers on a namespace's loopback."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from ipaddress import ip_address
from pathlib import Path
from typing import Any

import pytest
from kits.ebpf_kit import client, own_bpffs, own_cgroup, own_loader, serving
from kits.render_kit import config, endpoint_slice, ep, node_obj, service

from kubeplex.backends.ebpf import EbpfBackend, layout, libbpf
from kubeplex.backends.ebpf.drain import REVERSE_MAPS, REVERSE_PROGRAMS
from kubeplex.backends.ebpf.layout import MapLayout
from kubeplex.backends.ebpf.loader import DRAINING, BpfMap
from kubeplex.backends.ebpf.maps import PinnedMaps
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


def backend_on(bpffs: Path, cgroup: Path, netns: str) -> EbpfBackend:
    options = {"bpffs": str(bpffs), "cgroup": str(cgroup)}
    ctx = BackendContext(config({"mode": "nftables"}), NODE, (IPFamily.IPv4,), netns=netns)
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
    backend = backend_on(bpffs, cgroup, netns)
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
    backend = backend_on(bpffs, cgroup, netns)
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


# --- batch dumps --------------------------------------------------------------------------------


def test_a_dump_in_batches_is_every_entry_and_a_map_without_batches_is_read_key_by_key() -> None:
    """(The batch lookup's figures: bench/ebpf_dump.py.)"""
    with own_bpffs() as bpffs, own_loader(bpffs) as loader, own_cgroup() as cgroup:
        dp = loader.start(cgroup)
        maps = PinnedMaps(dp.maps)
        entries = {
            layout.backend_key(svc_id, slot): layout.backend_value(
                ip_address(f"10.{svc_id % 250}.{slot}.1"), 8080
            )
            for svc_id in range(1, 2001)
            for slot in range(5)
        }
        for key, value in entries.items():
            maps.update("kpx_backends", key, value)
        assert maps.dump("kpx_backends") == entries
        # Many batches (and hash buckets larger than a batch is asked for at first).
        fd = dp.maps["kpx_backends"].fd
        small = libbpf.map_lookup_batch(fd, 8, 20, chunk=1)
        assert dict(small) == entries and len(small) == len(entries)
        assert "kpx_backends" not in maps.no_batch
        dp.close()

        # A device hash map has no batch lookup (ENOTSUPP): its dump is read key by key.
        pin = bpffs / "devices"
        create = f"bpftool map create {pin} type devmap_hash key 4 value 4 entries 16 name d"
        subprocess.run(create.split(), check=True)
        u32 = struct.Struct("=I")
        devices = BpfMap(MapLayout("d", u32, u32, 16), libbpf.obj_get(str(pin)))
        try:
            loopback = u32.pack(1)  # its values are interfaces: lo's index
            entries = {u32.pack(key): loopback for key in (3, 7, 11)}
            for key, value in entries.items():
                devices.update(key, value)
            seam = PinnedMaps({"d": devices})
            assert seam.dump("d") == entries
            assert seam.no_batch == {"d"}
        finally:
            devices.close()
            pin.unlink()


# --- drain --------------------------------------------------------------------------------------

#: Sends (UDP) and connects (TCP) to the Service, says so, and reads the reply and the TCP
#: peer only when told to (after the test's cleanup).
WAITING_CLIENT = textwrap.dedent(
    """
    import json, socket, sys
    host = sys.argv[1]
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); udp.settimeout(5)
    udp.sendto(b"ping", (host, 53))
    tcp = socket.create_connection((host, 80), timeout=5)
    print("sent", flush=True)
    sys.stdin.readline()
    data, peer = udp.recvfrom(100)
    print(json.dumps({"udp": [data.decode(), list(peer)], "tcp": list(tcp.getpeername())}))
    """
)


def test_a_drain_keeps_the_reverse_path_for_replies_and_getpeername_then_it_goes(
    setup: tuple[Path, Path, str],
) -> None:
    bpffs, cgroup, netns = setup
    backend = backend_on(bpffs, cgroup, netns)
    backend.sync(web(PODS[:1]).checkout(full=True))
    join = f"echo $$ > {cgroup / 'cgroup.procs'} && "
    waiting = subprocess.Popen(
        [
            *("sh", "-c", f'{join}exec ip netns exec {netns} "$0" -c "$1" "$2"'),
            *(sys.executable, WAITING_CLIENT, SERVICE),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert waiting.stdout is not None and waiting.stdin is not None
        assert waiting.stdout.readline().strip() == "sent"
        report = backend.cleanup(drain=True)
        waiting.stdin.write("go\n")
        waiting.stdin.flush()
        seen = json.loads(waiting.stdout.readline())
    finally:
        waiting.kill()
        waiting.wait()
    # The reply read after the switch, and getpeername, still show the Service.
    assert seen == {"udp": [f"{PODS[0]} ping", [SERVICE, 53]], "tcp": [SERVICE, 80]}
    folder = bpffs / "kubeplex"
    kept = {str(folder / "links" / p) for p in REVERSE_PROGRAMS}
    kept |= {str(folder / m) for m in REVERSE_MAPS}
    assert set(report.draining) == kept == set(backend.leftovers())
    assert set(report.removed).isdisjoint(kept) and report.removed
    # New connections are not translated any more.
    assert client(netns, cgroup, SERVICE, 80, "tcp") == {"errno": 101}

    # Drained for a while: the next cleanup still keeps it; once the time is up, it goes.
    options = {"bpffs": str(bpffs), "cgroup": str(cgroup)}
    again = EbpfBackend(backend.ctx, options=options)
    assert set(again.cleanup(drain=True).draining) == kept
    past = time.time() - 3600
    os.utime(folder / DRAINING, (past, past))
    done = again.cleanup(drain=True)
    assert done.draining == () and set(done.removed) == kept
    assert again.leftovers() == [] and not folder.exists()
    shown = ["bpftool", "cgroup", "show", str(cgroup)]
    assert "kpx_" not in subprocess.run(shown, capture_output=True, text=True).stdout


def test_a_start_after_a_drain_takes_the_mode_back(setup: tuple[Path, Path, str]) -> None:
    bpffs, cgroup, netns = setup
    backend = backend_on(bpffs, cgroup, netns)
    cluster = web(PODS[:1])
    backend.sync(cluster.checkout(full=True))
    backend.cleanup(drain=True)
    back = backend_on(bpffs, cgroup, netns)
    assert not (bpffs / "kubeplex" / DRAINING).exists()
    back.sync(cluster.checkout(full=True))
    assert client(netns, cgroup, SERVICE, 80, "tcp") == {"data": PODS[0], "peer": [SERVICE, 80]}
    back.cleanup()
