"""The ebpf mode's entry points for traffic from other hosts (nftables, kernel NAT): the tables
rendered for the seed lab and for each external traffic policy (goldens under golden/ebpf/),
partial renders that recompute only changed Service ports, and the backend's plan carrying
the transaction (printed by ``render``, recorded next to the fake maps, removed by cleanup)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from kits.render_kit import (
    LAB,
    NODE,
    V4,
    V6,
    assert_golden_file,
    config,
    endpoint_slice,
    ep,
    node_obj,
    port,
    service,
)

from kubeplex.backends.ebpf import EbpfBackend
from kubeplex.backends.ebpf.entry_nat import EntryNatRenderer, RecordedEntryNat, source_ranges
from kubeplex.core.dataplane.backend import BackendContext
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.types import IPFamily
from kubeplex.core.sources.manifests import ManifestSource
from kubeplex.testing.fakes import FakeEbpfMaps

GOLDEN = Path(__file__).resolve().parent / "golden" / "ebpf"
OTHER = "other-node"


def cluster_of(
    objects: Iterable[Mapping[str, Any]], families: tuple[IPFamily, ...] = (V4,)
) -> ClusterState:
    cluster = ClusterState(NODE, families)
    for obj in objects:
        {
            "Service": cluster.set_service,
            "EndpointSlice": cluster.set_endpoint_slice,
            "Node": cluster.set_node,
        }[obj["kind"]](obj)
    return cluster


def seed_cluster() -> ClusterState:
    cluster = ClusterState("kind-worker", (V4, V6))
    source = ManifestSource(LAB / "manifests", cluster)
    source.load()
    assert not source.problems
    return cluster


def policies() -> list[dict[str, Any]]:
    """One Service port per case: Cluster over both nodes' endpoints (a NodePort and an
    externalIP), Local with a local endpoint (a NodePort), Local without one, none at all,
    a LoadBalancer with source ranges that overlap, a UDP NodePort."""
    here, there = ep("10.180.0.1", NODE), ep("10.180.1.1", OTHER)
    return [
        node_obj(),
        service(
            "ns1",
            "cluster",
            "172.30.0.41",
            [port(node_port=3001)],
            type="NodePort",
            externalIPs=["192.168.99.11"],
        ),
        endpoint_slice("ns1", "cluster", [here, there]),
        service(
            "ns1",
            "local",
            "172.30.0.42",
            [port(node_port=3002)],
            type="NodePort",
            externalTrafficPolicy="Local",
        ),
        endpoint_slice("ns1", "local", [here, there]),
        service(
            "ns1",
            "elsewhere",
            "172.30.0.43",
            [port(node_port=3003)],
            type="NodePort",
            externalTrafficPolicy="Local",
        ),
        endpoint_slice("ns1", "elsewhere", [there]),
        service("ns1", "none", "172.30.0.44", [port(node_port=3004)], type="NodePort"),
        service(
            "ns1",
            "lb",
            "172.30.0.45",
            [port(node_port=3005)],
            type="LoadBalancer",
            ingress=["1.2.3.4"],
            loadBalancerSourceRanges=["203.0.113.0/24", "203.0.113.128/25", "198.51.100.7/32"],
        ),
        endpoint_slice("ns1", "lb", [there]),
        service(
            "ns1", "dns", "172.30.0.46", [port(53, "dns", "UDP", node_port=3006)], type="NodePort"
        ),
        endpoint_slice("ns1", "dns", [here], [port(53, "dns", "UDP")]),
        # Only a ClusterIP: nothing in the tables.
        service("ns1", "inside", "172.30.0.47", [port()]),
        endpoint_slice("ns1", "inside", [here]),
    ]


def test_seed_lab_golden() -> None:
    text = EntryNatRenderer().render(seed_cluster().checkout(full=True), ("172.18.0.5",))
    assert_golden_file(GOLDEN / "entry-nat-seed-lab.txt", text, "rendered tables differ")
    assert "tcp . 30080 : goto external-" in text
    assert "dnat to numgen random mod 3 map { 0 : 10.244.1.2 . 8080, " in text


def test_policies_golden() -> None:
    state = cluster_of(policies()).checkout(full=True)
    text = EntryNatRenderer().render(state, ("192.168.0.2",))
    assert_golden_file(GOLDEN / "entry-nat-policies.txt", text, "rendered tables differ")
    chains = {c.split(" {")[0]: c for c in text.split("  chain ")[1:]}

    def chain(name: str, kind: str = "external-") -> str:
        (found,) = [b for k, b in chains.items() if k.startswith(kind) and k.endswith(name)]
        return found

    cluster = chain("ns1/cluster/tcp/p80")
    assert "meta mark set meta mark | 0x00004000" in cluster
    assert "mod 2 map { 0 : 10.180.0.1 . 80, 1 : 10.180.1.1 . 80 }" in cluster
    local = chain("ns1/local/tcp/p80")
    assert "mark" not in local and "mod 1 map { 0 : 10.180.0.1 . 80 }" in local
    assert chain("ns1/elsewhere/tcp/p80").split("\n")[1].strip() == "drop"
    assert chain("ns1/none/tcp/p80").split("\n")[1].strip() == "reject"
    firewall = chain("ns1/lb/tcp/p80", "firewall-")
    assert "ip saddr != { 198.51.100.7/32, 203.0.113.0/24 } drop" in firewall
    assert "192.168.99.11 . tcp . 80 : goto external-" in text
    assert "1.2.3.4 . tcp . 80 : goto firewall-" in text
    assert "udp . 3006 : goto external-" in text
    assert "inside" not in text


def test_source_ranges_are_merged_per_family() -> None:
    ranges = ["10.0.0.0/8", "10.1.0.0/16", "fd00::/8", "10.0.0.5/32"]
    assert source_ranges(ranges, V4) == ["10.0.0.0/8"]
    assert source_ranges(ranges, V6) == ["fd00::/8"]


def test_a_partial_render_recomputes_only_the_changed_service_ports() -> None:
    cluster = cluster_of(policies())
    renderer = EntryNatRenderer()
    first = renderer.render(cluster.checkout(full=True), ("192.168.0.2",))
    renderer.applied = first
    cluster.set_endpoint_slice(endpoint_slice("ns1", "elsewhere", [ep("10.180.0.9", NODE)]))
    second = renderer.render(cluster.checkout(), ("192.168.0.2",))
    assert second != first
    assert (
        second.replace(
            "meta l4proto tcp dnat to numgen random mod 1 map { 0 : 10.180.0.9 . 80 }", "drop"
        )
        == first
    )
    renderer.applied = second
    # Nothing external changed: the same text.
    cluster.set_endpoint_slice(endpoint_slice("ns1", "inside", [ep("10.180.0.8", NODE)]))
    assert renderer.render(cluster.checkout(), ("192.168.0.2",)) == second


def backend() -> EbpfBackend:
    ctx = BackendContext(config({"mode": "nftables"}), NODE, (V4,), kernel=FakeEbpfMaps())
    return EbpfBackend(ctx, options={"bpffs": "/nonexistent", "cgroup": "/nonexistent"})


def test_the_plan_carries_the_tables_and_apply_commits_them_when_they_change() -> None:
    cluster = cluster_of(policies())
    ebpf = backend()
    tables = ebpf.entry_tables
    assert isinstance(tables, RecordedEntryNat)
    plan = ebpf.render(cluster.checkout(full=True))
    assert "# nftables, traffic from other hosts:\nadd table ip kubeplex-ebpf\n" in str(plan)
    assert plan.kernel_inputs()[-1] == plan.entry_nat
    ebpf.apply(plan)
    assert tables.sent == [plan.entry_nat]
    assert ebpf.leftovers() == ["nftables table ip kubeplex-ebpf"]

    # A partial sync that changes nothing external sends no transaction.
    cluster.set_endpoint_slice(endpoint_slice("ns1", "inside", [ep("10.180.0.8", NODE)]))
    quiet = ebpf.render(cluster.checkout())
    assert not quiet.full and quiet.entry_nat == "" and "nftables" not in str(quiet)
    ebpf.apply(quiet)
    # One that does sends the whole tables again; a full sync always does (it reconciles).
    cluster.set_endpoint_slice(endpoint_slice("ns1", "elsewhere", [ep("10.180.0.9", NODE)]))
    ebpf.apply(ebpf.render(cluster.checkout()))
    ebpf.apply(ebpf.render(cluster.checkout(full=True)))
    assert len(tables.sent) == 3

    report = ebpf.cleanup()
    assert "nftables table ip kubeplex-ebpf" in report.removed
    assert tables.sent[-1] == "delete table ip kubeplex-ebpf\n"
    assert ebpf.leftovers() == []
