"""EbpfBackend against the kernel: the seed lab's graph (from the lab's manifests) synced into
real pinned maps in a bpffs of the test's own, programs attached to a cgroup of the test's own,
and a client in that cgroup reaching the web pods (served on a namespace's loopback) through
web's ClusterIP; a partial sync after an endpoint change; a cleanup that leaves nothing."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kits.ebpf_kit import client, own_bpffs, own_cgroup, own_loader, serving
from kits.render_kit import LAB, config, seed_lab_cluster

from kubeplex.backends.ebpf import EbpfBackend
from kubeplex.backends.ebpf.maps import PinnedMaps
from kubeplex.backends.ebpf.plan import RENDERED_MAPS
from kubeplex.core.dataplane.backend import BackendContext
from kubeplex.core.model.types import ServicePortName

pytestmark = pytest.mark.kernel

NODE = "kind-worker"
WEB = "10.96.88.59"
PODS = ["10.244.1.2", "10.244.2.2", "10.244.2.3"]
#: Connections per check: one of three pods never chosen in 30 is 3 in 190,000.
TRIES = 30


@pytest.fixture
def web_pods(netns: str) -> Iterator[str]:
    with serving(netns, PODS):
        yield netns


@pytest.fixture
def setup() -> Iterator[tuple[Path, Path]]:
    with own_bpffs() as bpffs, own_cgroup() as cgroup, own_loader(bpffs):
        yield bpffs, cgroup


def context(netns: str) -> BackendContext:
    """The node's context: its nftables (the entry points of traffic from other hosts) are
    the test namespace's."""
    return BackendContext(config({"mode": "nftables"}), NODE, netns=netns)


def landed(netns: str, cgroup: Path) -> set[str]:
    found = set()
    for _ in range(TRIES):
        reply = client(netns, cgroup, WEB, 80, "tcp")
        assert reply["peer"] == [WEB, 80], reply
        found.add(reply["data"])
    return found


def held(backend: EbpfBackend) -> dict[str, dict[bytes, bytes]]:
    return {name: backend.kernel.dump(name) for name in RENDERED_MAPS}


def without_last_pod() -> dict[str, Any]:
    docs = yaml.safe_load_all((LAB / "manifests" / "web.yaml").read_text())
    web = next(d for d in docs if d["metadata"]["name"] == "web-7x2kq")
    web["endpoints"] = web["endpoints"][:-1]
    return dict(web)


def test_the_seed_lab_synced_serves_web_then_a_partial_sync_then_nothing_left(
    setup: tuple[Path, Path], web_pods: str
) -> None:
    bpffs, cgroup = setup
    options = {"bpffs": str(bpffs), "cgroup": str(cgroup)}
    backend = EbpfBackend(context(web_pods), options=options)
    assert backend.missing_requirements() == []
    cluster = seed_lab_cluster()

    backend.prepare()
    result = backend.sync(cluster.checkout(full=True))
    assert result.full and not result.failed
    assert held(backend) == backend.renderer.desired
    assert landed(web_pods, cgroup) == set(PODS)
    (web,) = backend.inspect(ServicePortName("default", "web")) or []
    assert [(e.target, e.share) for e in web.endpoints] == [(f"{ip}:8080", 1 / 3) for ip in PODS]

    # A partial sync reads nothing and writes only web's ClusterIP entry and its last slot.
    cluster.set_endpoint_slice(without_last_pod())
    state = cluster.checkout()
    assert backend.observe(state) is None
    plan = backend.render(state)
    assert [op.map for op in plan.ops] == ["kpx_svc4", "kpx_backends"]
    assert not backend.apply(plan).full
    assert held(backend) == backend.renderer.desired
    assert landed(web_pods, cgroup) == set(PODS[:2])

    # A second start adopts the pins, and its full sync against the dump sends nothing.
    again = EbpfBackend(context(web_pods), options=options)
    again.prepare()
    assert isinstance(again.kernel, PinnedMaps)
    assert again.render(cluster.checkout(full=True), again.observe(state)).ops == ()

    report = again.cleanup()
    assert report.removed and again.leftovers() == [] and backend.leftovers() == []
    assert not (bpffs / "kubeplex").exists()
    shown = ["bpftool", "cgroup", "show", str(cgroup)]
    assert "kpx_" not in subprocess.run(shown, capture_output=True, text=True).stdout
    assert client(web_pods, cgroup, WEB, 80, "tcp").get("errno")
    backend.cleanup()  # the first one's fds closed, nothing more to remove
