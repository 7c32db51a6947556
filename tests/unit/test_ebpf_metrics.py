"""The ebpf mode's own metric families, read from the exposition /metrics serves: what its maps
hold after a sync, the map operations the last sync sent, failed syncs; no conntrack reconciler
and no other mode's families; the attached programs left out where no pinned link is read."""

from __future__ import annotations

import re

import yaml
from kits.render_kit import LAB, config

from kubeplex.backends.ebpf import EbpfBackend, metrics
from kubeplex.backends.ebpf.plan import OBSERVED_MAPS, RENDERED_MAPS
from kubeplex.core.daemon.metrics import ProxyMetrics
from kubeplex.core.dataplane.backend import BackendContext
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.types import IPFamily
from kubeplex.core.sources.manifests import ManifestSource
from kubeplex.testing.fakes import FakeEbpfMaps

NODE = "kind-worker"


def seed() -> tuple[ClusterState, EbpfBackend, FakeEbpfMaps, ProxyMetrics]:
    cluster = ClusterState(NODE, (IPFamily.IPv4, IPFamily.IPv6))
    ManifestSource(LAB / "manifests", cluster).load()
    maps = FakeEbpfMaps()
    backend = EbpfBackend(BackendContext(config({}), NODE, kernel=maps), options={})
    return cluster, backend, maps, ProxyMetrics(backend, process_collectors=False)


def web_slice_shrunk(cluster: ClusterState) -> None:
    """default/web's EndpointSlice loses its last endpoint."""
    docs = yaml.safe_load_all((LAB / "manifests" / "web.yaml").read_text())
    web = next(d for d in docs if d["kind"] == "EndpointSlice")
    web["endpoints"].pop()
    cluster.set_endpoint_slice(web)


def exposed(m: ProxyMetrics, family: str) -> dict[tuple[str, ...], float]:
    """The family's samples in the exposition text, by their label values."""
    text = m.exposition().decode()
    out = {}
    for labels, value in re.findall(rf"^{family}{{([^}}]*)}} (\S+)$", text, re.MULTILINE):
        out[tuple(re.findall(r'="([^"]*)"', labels))] = float(value)
    return out


def test_a_sync_exposes_the_entries_of_each_map_and_the_operations_it_sent() -> None:
    cluster, backend, maps, m = seed()
    state = cluster.checkout(full=True)
    m.sync_listener(state, backend.sync(state), 0.01)
    entries = exposed(m, metrics.MAP_ENTRIES)
    assert entries == {(name,): len(maps.dump(name)) for name in RENDERED_MAPS}
    assert entries[("kpx_svc4",)] > 0 and entries[("kpx_backends",)] > 0
    sent = exposed(m, metrics.MAP_OPERATIONS_LAST)
    assert sum(v for (_, op), v in sent.items() if op == "update") == len(maps.sent)
    assert sum(v for (_, op), v in sent.items() if op == "delete") == 0

    # A partial sync: web's ClusterIP entry updated, its last slot deleted, nothing else.
    backends_before = entries[("kpx_backends",)]
    web_slice_shrunk(cluster)
    state = cluster.checkout()
    m.sync_listener(state, backend.sync(state), 0.01)
    sent = exposed(m, metrics.MAP_OPERATIONS_LAST)
    assert {k: v for k, v in sent.items() if v} == {
        ("kpx_svc4", "update"): 1,
        ("kpx_backends", "delete"): 1,
    }
    assert len(sent) == len(OBSERVED_MAPS) * 2  # the others are 0, not last sync's
    assert exposed(m, metrics.MAP_ENTRIES)[("kpx_backends",)] == backends_before - 1


def test_the_modes_families_and_no_others() -> None:
    _, _, _, m = seed()
    m.sync_failed([IPFamily.IPv6])
    assert m.value(metrics.SYNC_FAILURES, {"ip_family": "IPv6"}) == 1
    kinds = dict(re.findall(r"^# TYPE (\S+) (\S+)$", m.exposition().decode(), re.MULTILINE))
    ours = {name: kind for name, kind in kinds.items() if "ebpf" in name}
    assert ours == {
        metrics.SYNC_FAILURES: "counter",
        metrics.MAP_ENTRIES: "gauge",
        metrics.MAP_OPERATIONS_LAST: "gauge",
    }
    # Nothing of the netfilter modes.
    assert not [n for n in kinds if "iptables" in n or "nftables" in n]


def test_attached_programs_are_left_out_where_no_pin_is_read() -> None:
    _, backend, _, m = seed()
    assert backend.scrape() == []
    assert metrics.PROGRAMS_ATTACHED not in m.exposition().decode()
