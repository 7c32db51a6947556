"""EbpfBackend over the in-memory maps: a full sync of the seed lab leaves the maps holding what
the render wants, a partial sync sends only the changed Service's entries, a refused write
fails the sync and makes the next one full against a dump, and its options and requirements
are checked by name."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest
import yaml
from kits.render_kit import (
    LAB,
    config,
    dual_stack_svc1,
    endpoint_slice,
    ep,
    node_obj,
    port,
    service,
)

from kubeplex.backends.ebpf import EbpfBackend, layout, nodeport_addresses, requirements
from kubeplex.backends.ebpf.layout import DEFAULT_BPFFS
from kubeplex.backends.ebpf.loader import Loader
from kubeplex.backends.ebpf.options import EbpfOptions, cgroup2_root
from kubeplex.backends.ebpf.plan import RENDERED_MAPS
from kubeplex.core.dataplane.backend import BackendContext
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.errors import BackendError, InvalidObject
from kubeplex.core.model.types import IPFamily, NodeInfo, ServicePortName
from kubeplex.core.sources.manifests import ManifestSource
from kubeplex.testing.fakes import FakeEbpfMaps

V4, V6 = IPFamily.IPv4, IPFamily.IPv6
SEED_NODE = "kind-worker"
WEB_SLICE = "web-7x2kq"


def seed_lab() -> tuple[ClusterState, EbpfBackend, FakeEbpfMaps]:
    cluster = ClusterState(SEED_NODE, (V4, V6))
    source = ManifestSource(LAB / "manifests", cluster)
    source.load()
    assert not source.problems
    maps = FakeEbpfMaps()
    ctx = BackendContext(config({"mode": "nftables"}), SEED_NODE, kernel=maps)
    return cluster, EbpfBackend(ctx, options={}), maps


def one_endpoint_fewer() -> dict[str, Any]:
    """The seed lab's slice of default/web without its last endpoint."""
    docs = yaml.safe_load_all((LAB / "manifests" / "web.yaml").read_text())
    web = next(d for d in docs if d["metadata"]["name"] == WEB_SLICE)
    web["endpoints"] = web["endpoints"][:-1]
    return dict(web)


def held(maps: FakeEbpfMaps) -> dict[str, dict[bytes, bytes]]:
    return {name: maps.dump(name) for name in RENDERED_MAPS}


def test_a_full_sync_of_the_seed_lab_programs_what_the_render_wants() -> None:
    cluster, backend, maps = seed_lab()
    result = backend.sync(cluster.checkout(full=True))
    assert result.full and not result.failed
    assert held(maps) == backend.renderer.desired
    assert result.counts["map_updates"] == sum(len(m) for m in held(maps).values()) > 0
    # The NodePort on the Node's own address (nodePortAddresses "primary").
    assert "172.18.0.5:30080/tcp" in str(backend.render(cluster.checkout(full=True)))


def test_a_partial_sync_sends_only_the_changed_services_entries() -> None:
    cluster, backend, maps = seed_lab()
    backend.sync(cluster.checkout(full=True))
    sent = len(maps.sent)
    cluster.set_endpoint_slice(one_endpoint_fewer())
    state = cluster.checkout()
    assert not state.is_full() and backend.observe(state) is None  # nothing read
    plan = backend.render(state)
    backend.apply(plan)
    web_id = backend.renderer.svc_ids.ids["default/web/tcp/ipv4"]
    assert held(maps) == backend.renderer.desired
    # The ClusterIP's count, then its last slot: nothing of web-nodeport or of IPv6.
    assert [str(op) for op in plan.ops] == [
        f"update kpx_svc4 10.96.88.59:80/tcp -> svc {web_id:#010x} count 2",
        f"delete kpx_backends svc {web_id:#010x} slot 2",
    ]
    assert maps.sent[sent:] == plan.kernel_inputs()


class Refusing(FakeEbpfMaps):
    refuse = False

    def update(self, name: str, key: bytes, value: bytes, flags: int = 0) -> None:
        if self.refuse and name == "kpx_svc4":
            raise OSError(errno.E2BIG, "full")
        super().update(name, key, value, flags)


def test_a_refused_write_fails_the_sync_and_the_next_is_full_against_the_maps() -> None:
    cluster = ClusterState("n1", (V4,))
    maps = Refusing()
    ctx = BackendContext(config({"mode": "nftables"}), "n1", kernel=maps)
    backend = EbpfBackend(ctx, options={})
    cluster.set_node(node_obj())
    cluster.set_service(service("ns1", "svc1", "172.30.0.41", [port()]))
    cluster.set_endpoint_slice(endpoint_slice("ns1", "svc1", [ep("10.180.0.1")]))
    backend.sync(cluster.checkout(full=True))
    maps.refuse = True
    cluster.set_service(service("ns1", "svc2", "172.30.0.42", [port()]))
    with pytest.raises(BackendError, match=r"ebpf: the maps refused the plan: .*full"):
        backend.sync(cluster.checkout())
    maps.refuse = False
    maps.maps["kpx_backends"][b"\xff" * 8] = b"\0" * 20  # a stray entry: the dump finds it
    state = cluster.checkout()
    observed = backend.observe(state)
    assert observed is not None and b"\xff" * 8 in observed["kpx_backends"]
    result = backend.apply(backend.render(state, observed))
    assert result.full and held(maps) == backend.renderer.desired


def test_sctp_is_named_among_the_failed_services() -> None:
    cluster = ClusterState("n1", (V4,))
    backend = EbpfBackend(
        BackendContext(config({"mode": "nftables"}), "n1", kernel=FakeEbpfMaps()), options={}
    )
    cluster.set_service(service("ns1", "svc1", "172.30.0.41", [port(protocol="SCTP")]))
    result = backend.sync(cluster.checkout(full=True))
    assert result.failed == {"ns1/svc1:p80 (IPv4)": "SCTP is not supported by the ebpf mode"}


def test_nodeport_addresses_follow_node_port_addresses_in_both_families() -> None:
    node = NodeInfo("n1", addresses=("192.168.0.2", "127.0.0.1", "2001:db8::1"))
    assert nodeport_addresses(["primary"], node) == ("192.168.0.2", "2001:db8::1")
    assert nodeport_addresses([], node) == ("192.168.0.2", "2001:db8::1")  # not loopback
    assert nodeport_addresses(["10.0.0.0/8"], node) == ("2001:db8::1",)


def test_options_default_and_bad_ones_are_named() -> None:
    assert EbpfOptions.parse({}) == EbpfOptions(Path(cgroup2_root()), Path(DEFAULT_BPFFS))
    given = EbpfOptions.parse({"cgroup": "/sys/fs/cgroup/kube", "bpffs": "/run/bpf"})
    assert given == EbpfOptions(Path("/sys/fs/cgroup/kube"), Path("/run/bpf"))
    with pytest.raises(InvalidObject) as err:
        EbpfOptions.parse({"cgroup": "relative", "bpffs": 3, "pin": "/x"})
    assert str(err.value) == (
        "[backends.ebpf.options]: pin: unknown option; "
        "cgroup: must be an absolute path, not 'relative'; "
        "bpffs: must be an absolute path, not 3"
    )


def test_the_nodes_own_cgroup_and_bpffs_in_the_context_win_over_the_options() -> None:
    ctx = BackendContext(
        config({}),
        "n1",
        kernel=FakeEbpfMaps(),
        cgroup=Path("/sys/fs/cgroup/lab/n1"),
        bpffs=Path("/run/lab/n1"),
    )
    backend = EbpfBackend(ctx, options={"cgroup": "/sys/fs/cgroup/kube", "bpffs": "/run/bpf"})
    assert backend.options == EbpfOptions(Path("/sys/fs/cgroup/lab/n1"), Path("/run/lab/n1"))
    assert backend.loader.folder == Path("/run/lab/n1/kubeplex")
    # Without them, the options say.
    plain = EbpfBackend(BackendContext(config({}), "n1"), options={"bpffs": "/x"})
    assert plain.options.bpffs == Path("/x") and plain.loader.folder == Path("/x/kubeplex")


def test_the_cgroup2_root_is_read_from_the_mounts(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text(
        "proc /proc proc rw 0 0\ncgroup2 /sys/fs/cgroup/unified cgroup2 rw,nosuid 0 0\n"
    )
    assert cgroup2_root(mounts) == "/sys/fs/cgroup/unified"
    assert cgroup2_root(tmp_path / "none") == "/sys/fs/cgroup"


def test_requirements_name_what_is_missing(tmp_path: Path) -> None:
    options = EbpfOptions(cgroup=tmp_path, bpffs=tmp_path / "nowhere")
    loader = Loader(tmp_path, object_path=tmp_path / "kubeplex_lb.bpf.o")
    found = requirements.missing(options, loader, release="5.4.0-150-generic")
    assert found == [
        "kernel 5.4.0 is older than 5.8",
        f"cgroup2 {tmp_path} is not a cgroup2 mount",
        f"bpffs {tmp_path / 'nowhere'}: No such file or directory",
        f"{tmp_path / 'kubeplex_lb.bpf.o'} is missing (scripts/build-bpf.sh builds it)",
    ]


def test_inspect_reads_a_services_entries_endpoints_and_affinity_from_the_maps() -> None:
    cluster, backend, maps = seed_lab()
    backend.sync(cluster.checkout(full=True))
    web = ServicePortName("default", "web")
    (found,) = backend.inspect(web) or []
    web_id = backend.renderer.svc_ids.ids["default/web/tcp/ipv4"]
    assert found.family is V4 and found.affinity_seconds is None
    assert found.entries == (f"kpx_svc4 10.96.88.59:80/tcp -> svc {web_id:#010x} count 3",)
    assert [(e.target, e.share) for e in found.endpoints] == [
        (f"{ip}:8080", 1 / 3) for ip in ("10.244.1.2", "10.244.2.2", "10.244.2.3")
    ]
    # What the maps hold, not what the render wants: a slot gone is not shown.
    maps.delete("kpx_backends", layout.backend_key(web_id, 2))
    (found,) = backend.inspect(web) or []
    assert [e.target for e in found.endpoints] == ["10.244.1.2:8080", "10.244.2.2:8080"]
    assert backend.inspect(ServicePortName("default", "nothing")) == []


def test_a_node_running_one_family_writes_no_entry_of_the_other() -> None:
    """A dual-stack Service: on an IPv4-only node none of its IPv6 entries or endpoints is
    written, on an IPv6-only node none of its IPv4 ones; with both families, both are."""
    for families in ((V4,), (V6,), (V4, V6)):
        cluster = ClusterState(SEED_NODE, (V4, V6))
        svc, *slices = dual_stack_svc1()
        cluster.set_service(svc)
        for eps in slices:
            cluster.set_endpoint_slice(eps)
        maps = FakeEbpfMaps()
        ctx = BackendContext(
            config({"mode": "nftables"}), SEED_NODE, families=families, kernel=maps
        )
        backend = EbpfBackend(ctx, options={})
        assert backend.sync(cluster.checkout(full=True)).full
        found = {layout.BACKEND_VALUE.unpack(v)[2] for v in maps.dump("kpx_backends").values()}
        assert found == {layout.FAMILY_V4 if f is V4 else layout.FAMILY_V6 for f in families}
        assert bool(maps.dump("kpx_svc4")) == (V4 in families)
        assert bool(maps.dump("kpx_svc6")) == (V6 in families)


def test_a_full_sync_deleting_stale_affinity_entries_counts_them() -> None:
    """The affinity entries of a Service gone go in the next full sync; its operations are
    counted per map like the others."""
    cluster, backend, maps = seed_lab()
    stale = layout.AFFINITY_KEY.pack(1, 0x0BADF00D)
    maps.update("kpx_affinity", stale, layout.affinity_value(bytes(20), 1))
    result = backend.sync(cluster.checkout(full=True))
    assert maps.dump("kpx_affinity") == {}
    sent = {s.labels: s.value for s in result.samples if s.family.endswith("operations_last")}
    assert sent[("kpx_affinity", "delete")] == 1
