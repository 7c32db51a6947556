"""The ebpf mode's programs and loader against the kernel: a bpffs and a cgroup of the test's
own, a network namespace with a backend on loopback, and client processes run in that cgroup
and namespace. The Service address is routed nowhere, so only the programs can reach it."""

from __future__ import annotations

import errno
import subprocess
import time
from collections.abc import Iterator
from ipaddress import ip_address
from pathlib import Path

import pytest
from kits.ebpf_kit import client, own_bpffs, own_cgroup, own_loader, serving

from kubeplex.backends.ebpf import layout
from kubeplex.backends.ebpf.loader import Dataplane, Loader, LoaderError

pytestmark = pytest.mark.kernel

SERVICE, SERVICE6 = "10.96.0.10", "fd00:96::10"
BACKEND, BACKEND6 = "10.244.1.5", "fd00:244::5"
BACKEND_B = "10.244.1.6"
SVC_ID = 7


@pytest.fixture
def bpffs() -> Iterator[Path]:
    with own_bpffs() as folder:
        yield folder


@pytest.fixture
def cgroup() -> Iterator[Path]:
    with own_cgroup() as path:
        yield path


@pytest.fixture
def backend_ns(netns: str) -> Iterator[str]:
    """The namespace with the backend's addresses on loopback and its TCP and UDP servers."""
    with serving(netns, [BACKEND, BACKEND_B, BACKEND6]):
        yield netns


@pytest.fixture
def loader(bpffs: Path) -> Iterator[Loader]:
    with own_loader(bpffs) as made:
        yield made


def program_service(
    dp: Dataplane, service: str, port: int, proto: int, backend_port: int, *, count: int = 1
) -> None:
    """One Service port with one endpoint, on the backend of the Service's family."""
    svc = ip_address(service)
    backend = ip_address(BACKEND if svc.version == 4 else BACKEND6)
    svc_map = dp.maps["kpx_svc4" if svc.version == 4 else "kpx_svc6"]
    svc_id = SVC_ID + svc.version
    svc_map.update(layout.svc_key(svc, port, proto), layout.svc_value(svc_id, count))
    backends = dp.maps["kpx_backends"]
    backends.update(layout.backend_key(svc_id, 0), layout.backend_value(backend, backend_port))


def start_with_a_service(loader: Loader, cgroup: Path) -> None:
    """A start that programs one Service, then goes (as the daemon may), leaving its pins."""
    dp = loader.start(cgroup)
    program_service(dp, SERVICE, 80, layout.PROTO_TCP, 8080)
    dp.close()


def program_two_endpoints(dp: Dataplane, flags: int = 0, timeout: int = 0) -> None:
    svc_id = 42
    key = layout.svc_key(ip_address(SERVICE), 80, layout.PROTO_TCP)
    dp.maps["kpx_svc4"].update(key, layout.svc_value(svc_id, 2, flags, timeout))
    for slot, backend in enumerate((BACKEND, BACKEND_B)):
        value = layout.backend_value(ip_address(backend), 8080)
        dp.maps["kpx_backends"].update(layout.backend_key(svc_id, slot), value)
        if flags & layout.FLAG_AFFINITY:
            dp.maps["kpx_slots"].update(layout.slot_key(svc_id, value), layout.slot_value(slot))


def attached(cgroup: Path) -> str:
    return subprocess.run(
        ["bpftool", "cgroup", "show", str(cgroup)], capture_output=True, text=True, check=True
    ).stdout


def test_a_tcp_connect_reaches_the_backend_and_getpeername_shows_the_service(
    loader: Loader, cgroup: Path, backend_ns: str
) -> None:
    dp = loader.start(cgroup)
    program_service(dp, SERVICE, 80, layout.PROTO_TCP, 8080)
    program_service(dp, SERVICE6, 80, layout.PROTO_TCP, 8080)
    assert client(backend_ns, cgroup, SERVICE, 80, "tcp") == {
        "data": BACKEND,
        "peer": [SERVICE, 80],
    }
    assert client(backend_ns, cgroup, SERVICE6, 80, "tcp") == {
        "data": BACKEND6,
        "peer": [SERVICE6, 80],
    }
    # Only the cgroup's processes are translated: elsewhere the Service address leads nowhere.
    assert client(backend_ns, None, SERVICE, 80, "tcp") == {"errno": errno.ENETUNREACH}


def test_an_unconnected_udp_reply_comes_from_the_service_address(
    loader: Loader, cgroup: Path, backend_ns: str
) -> None:
    dp = loader.start(cgroup)
    program_service(dp, SERVICE, 53, layout.PROTO_UDP, 5353)
    program_service(dp, SERVICE6, 53, layout.PROTO_UDP, 5353)
    for service, backend in ((SERVICE, BACKEND), (SERVICE6, BACKEND6)):
        reply = client(backend_ns, cgroup, service, 53, "udp")
        assert reply == {"data": f"{backend} ping", "peer": [service, 53]}


def test_a_service_without_endpoints_refuses_the_connection(
    loader: Loader, cgroup: Path, backend_ns: str
) -> None:
    dp = loader.start(cgroup)
    program_service(dp, SERVICE, 80, layout.PROTO_TCP, 8080, count=0)
    program_service(dp, SERVICE6, 53, layout.PROTO_UDP, 5353, count=0)
    assert client(backend_ns, cgroup, SERVICE, 80, "tcp") == {"errno": errno.ECONNREFUSED}
    assert client(backend_ns, cgroup, SERVICE6, 53, "udp") == {"errno": errno.ECONNREFUSED}


def test_a_second_start_adopts_the_pinned_links_and_maps(
    loader: Loader, cgroup: Path, backend_ns: str, bpffs: Path
) -> None:
    first = loader.start(cgroup)
    assert sorted(first.attached) == sorted(layout.PROGRAMS)
    program_service(first, SERVICE, 80, layout.PROTO_TCP, 8080)
    first.close()
    links_before = attached(cgroup)

    second = Loader(bpffs).start(cgroup)
    assert second.adopted
    assert attached(cgroup) == links_before  # nothing attached twice
    key = layout.svc_key(ip_address(SERVICE), 80, layout.PROTO_TCP)
    assert dict(second.maps["kpx_svc4"].items()) == {key: layout.svc_value(SVC_ID + 4, 1)}
    assert client(backend_ns, cgroup, SERVICE, 80, "tcp")["data"] == BACKEND
    second.close()


def test_a_link_lost_from_the_pins_is_attached_again_keeping_the_maps(
    loader: Loader, cgroup: Path, backend_ns: str, bpffs: Path
) -> None:
    start_with_a_service(loader, cgroup)
    loader.links.joinpath("connect4").unlink()  # its link goes with its last reference
    assert client(backend_ns, cgroup, SERVICE, 80, "tcp") == {"errno": errno.ENETUNREACH}

    second = Loader(bpffs).start(cgroup)
    assert second.attached == ["connect4"]
    assert client(backend_ns, cgroup, SERVICE, 80, "tcp")["data"] == BACKEND
    second.close()


def test_a_map_lost_from_the_pins_is_made_again_and_the_links_use_it(
    loader: Loader, cgroup: Path, backend_ns: str, bpffs: Path
) -> None:
    start_with_a_service(loader, cgroup)
    loader.folder.joinpath("kpx_svc4").unlink()

    second = Loader(bpffs).start(cgroup)
    assert second.adopted  # the same links, switched to programs on the new map
    assert list(second.maps["kpx_svc4"].keys()) == []
    assert client(backend_ns, cgroup, SERVICE, 80, "tcp") == {"errno": errno.ENETUNREACH}
    program_service(second, SERVICE, 80, layout.PROTO_TCP, 8080)
    assert client(backend_ns, cgroup, SERVICE, 80, "tcp")["data"] == BACKEND
    second.close()


def test_cleanup_detaches_and_unpins_everything(
    loader: Loader, cgroup: Path, backend_ns: str
) -> None:
    start_with_a_service(loader, cgroup)
    pinned = {str(loader.folder / m.name) for m in layout.MAPS}
    pinned |= {str(loader.links / p) for p in layout.PROGRAMS}
    assert set(loader.leftovers()) == pinned
    assert all(f"kpx_{p}" in attached(cgroup) for p in layout.PROGRAMS)

    assert set(loader.cleanup()) == pinned
    assert loader.leftovers() == []
    assert not loader.folder.exists()
    assert "kpx_" not in attached(cgroup)
    assert client(backend_ns, cgroup, SERVICE, 80, "tcp") == {"errno": errno.ENETUNREACH}


def test_without_affinity_connections_spread_over_the_endpoints(
    loader: Loader, cgroup: Path, backend_ns: str
) -> None:
    program_two_endpoints(loader.start(cgroup))
    # All 16 on one endpoint by chance: 2 in 65,536.
    seen = {client(backend_ns, cgroup, SERVICE, 80, "tcp")["data"] for _ in range(16)}
    assert seen == {BACKEND, BACKEND_B}


def test_affinity_keeps_a_client_on_its_endpoint_until_the_timeout(
    loader: Loader, cgroup: Path, backend_ns: str
) -> None:
    dp = loader.start(cgroup)
    program_two_endpoints(dp, layout.FLAG_AFFINITY, 10800)
    affinity = dp.maps["kpx_affinity"]
    first = client(backend_ns, cgroup, SERVICE, 80, "tcp")["data"]
    ((key, value),) = affinity.items()
    addr, port, _ = layout.AFFINITY_VALUE.unpack(value)
    assert (str(ip_address(addr[:4])), int.from_bytes(port, "big")) == (first, 8080)
    assert {client(backend_ns, cgroup, SERVICE, 80, "tcp")["data"] for _ in range(6)} == {first}

    # A fresh entry decides; one older than the timeout does not (the program's clock is
    # CLOCK_MONOTONIC). Each expired try picks at random: 16 on the old endpoint is 1 in 65,536.
    other = BACKEND_B if first == BACKEND else BACKEND
    endpoint = layout.backend_value(ip_address(other), 8080)
    affinity.update(key, layout.affinity_value(endpoint, time.monotonic_ns()))
    assert client(backend_ns, cgroup, SERVICE, 80, "tcp")["data"] == other
    program_two_endpoints(dp, layout.FLAG_AFFINITY, 1)
    landed = set()
    for _ in range(16):
        stale = time.monotonic_ns() - 5_000_000_000
        affinity.update(key, layout.affinity_value(endpoint, stale))
        landed.add(client(backend_ns, cgroup, SERVICE, 80, "tcp")["data"])
        refreshed = affinity.lookup(key)
        assert refreshed is not None and layout.AFFINITY_VALUE.unpack(refreshed)[2] > stale
    assert landed == {BACKEND, BACKEND_B}


def test_a_folder_that_is_not_bpffs_or_cgroup2_is_refused_by_name(
    loader: Loader, cgroup: Path, tmp_path: Path
) -> None:
    with pytest.raises(LoaderError, match=f"bpffs folder {tmp_path} is not a bpf file system"):
        Loader(tmp_path).start(cgroup)
    with pytest.raises(LoaderError, match=f"cgroup {tmp_path} is not a cgroup2 folder"):
        loader.start(tmp_path)
    assert list(tmp_path.iterdir()) == []
    assert loader.leftovers() == []
    assert "kpx_" not in attached(cgroup)


def test_a_pinned_map_of_another_layout_is_not_adopted(
    loader: Loader, cgroup: Path, backend_ns: str
) -> None:
    loader.start(cgroup).close()
    stale = loader.folder / "kpx_backends"
    stale.unlink()
    create = f"bpftool map create {stale} type hash key 8 value 16 entries 1024 name kpx_backends"
    subprocess.run(create.split(), check=True)
    with pytest.raises(LoaderError, match=rf"pinned map {stale} has .* \(8, 16, 1024\), not"):
        Loader(loader.bpffs).start(cgroup)
    assert {p.name for p in loader.folder.iterdir()} >= {"links", "kpx_svc4"}
