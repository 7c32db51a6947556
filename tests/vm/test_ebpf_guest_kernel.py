"""The ebpf mode on the guest's kernel (Debian's, older than the host's): its programs pass
that kernel's verifier, attach to a cgroup of the test's own (in a cgroup2 the kit mounts:
the guest has none), and translate a connection to web's ClusterIP for a process in that
cgroup; cleanup leaves nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kits.ebpf_kit import client, missing, own_bpffs, own_cgroup, serving
from kits.render_kit import config, seed_lab_cluster

from kubeplex.backends.ebpf import EbpfBackend
from kubeplex.core.dataplane.backend import BackendContext

pytestmark = pytest.mark.vm

NODE = "kind-worker"
WEB = "10.96.88.59"
PODS = ["10.244.1.2", "10.244.2.2", "10.244.2.3"]


@pytest.fixture
def cgroup() -> Iterator[Path]:
    with own_cgroup() as folder:
        yield folder


def test_the_programs_load_attach_and_translate_on_the_guest_kernel(
    cgroup: Path, netns: str
) -> None:
    reason = missing()
    if reason:
        pytest.skip(reason)
    with own_bpffs() as bpffs:
        options = {"bpffs": str(bpffs), "cgroup": str(cgroup)}
        backend = EbpfBackend(
            BackendContext(config({"mode": "nftables"}), NODE, netns=netns), options=options
        )
        try:
            assert backend.missing_requirements() == []
            backend.prepare()
            assert not backend.sync(seed_lab_cluster().checkout(full=True)).failed
            with serving(netns, PODS):
                seen = {client(netns, cgroup, WEB, 80, "tcp")["data"] for _ in range(20)}
            assert seen <= set(PODS) and len(seen) > 1, seen
        finally:
            backend.cleanup()
        assert backend.leftovers() == []
