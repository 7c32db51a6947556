"""The ebpf mode's entry points for traffic from other hosts (nftables, kernel NAT): the tables
rendered for the seed lab and for each external traffic policy (goldens under golden/ebpf/),
partial renders that recompute only changed Service ports, and the backend's plan carrying
the transaction (printed by ``render``, recorded next to the fake maps, removed by cleanup)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
from kits.render_kit import (
    NODE,
    V4,
    V6,
    assert_golden_file,
    config,
    endpoint_slice,
    ep,
    node_obj,
    port,
    seed_lab_cluster,
    service,
)

from kubeplex.backends.ebpf import EbpfBackend, requirements
from kubeplex.backends.ebpf.entry_nat import EntryNatRenderer, source_ranges
from kubeplex.backends.ebpf.loader import Loader
from kubeplex.backends.ebpf.options import EbpfOptions
from kubeplex.backends.ebpf.render import EbpfRenderer, RenderSettings
from kubeplex.core.dataplane.backend import BackendContext
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.types import IPFamily
from kubeplex.testing.fakes import FakeEbpfMaps

GOLDEN = Path(__file__).resolve().parent / "golden" / "ebpf"
OTHER = "other-node"
ADDRESSES = ("192.168.0.2",)


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
    text = EntryNatRenderer().render(seed_lab_cluster().checkout(full=True), ("172.18.0.5",), True)
    assert_golden_file(GOLDEN / "entry-nat-seed-lab.txt", text, "rendered tables differ")
    assert "tcp . 30080 : goto external-" in text
    # An even spread over the three pods: a third, half of the rest, the rest.
    assert (
        "    meta l4proto tcp numgen random mod 3 0 dnat to 10.244.1.2:8080\n"
        "    meta l4proto tcp numgen random mod 2 0 dnat to 10.244.2.2:8080\n"
        "    meta l4proto tcp dnat to 10.244.2.3:8080\n"
    ) in text


def test_policies_golden() -> None:
    state = cluster_of(policies()).checkout(full=True)
    text = EntryNatRenderer().render(state, ADDRESSES, full=True)
    assert_golden_file(GOLDEN / "entry-nat-policies.txt", text, "rendered tables differ")
    chains = {c.split(" {")[0]: c for c in text.split("  chain ")[1:]}

    def chain(name: str, kind: str = "external-") -> str:
        (found,) = [b for k, b in chains.items() if k.startswith(kind) and k.endswith(name)]
        return found

    cluster = chain("ns1/cluster/tcp/p80")
    assert "meta mark set meta mark | 0x00004000" in cluster
    assert "tcp numgen random mod 2 0 dnat to 10.180.0.1:80\n    meta l4proto tcp dnat" in cluster
    local = chain("ns1/local/tcp/p80")
    assert local.split("\n")[1:3] == ["    meta l4proto tcp dnat to 10.180.0.1:80", "  }"]
    assert chain("ns1/elsewhere/tcp/p80").split("\n")[1].strip() == "drop"
    # No endpoint anywhere: rejected at the filter hooks, not in the nat chain.
    assert "tcp . 3004 : goto no-endpoints" in text and "none/tcp" not in text
    assert "chain no-endpoints {\n    reject\n  }" in text
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


def test_a_partial_render_sends_the_changes_of_the_changed_service_ports() -> None:
    cluster = cluster_of(policies())
    renderer = EntryNatRenderer()
    assert renderer.render(cluster.checkout(full=True), ADDRESSES, full=True).startswith(
        "add table ip kubeplex-ebpf\ndelete table ip kubeplex-ebpf\n"
    )
    renderer.committed()
    # An endpoint on the node for a Local Service that had none: its chain, nothing else.
    cluster.set_endpoint_slice(endpoint_slice("ns1", "elsewhere", [ep("10.180.0.9", NODE)]))
    chain = "ip kubeplex-ebpf external-KO2CI2ID-ns1/elsewhere/tcp/p80"
    assert renderer.render(cluster.checkout(), ADDRESSES, full=False) == (
        f"flush chain {chain}\nadd rule {chain} meta l4proto tcp dnat to 10.180.0.9:80\n"
    )
    renderer.committed()
    # Nothing external changed: nothing to send.
    cluster.set_endpoint_slice(endpoint_slice("ns1", "inside", [ep("10.180.0.8", NODE)]))
    assert renderer.render(cluster.checkout(), ADDRESSES, full=False) == ""
    # A Service gone, another one new (neither with an endpoint): only refused elements.
    cluster.delete_service("ns1", "none")
    cluster.set_service(web_with_external_ip())
    assert renderer.render(cluster.checkout(), ADDRESSES, full=False) == (
        "add element ip kubeplex-ebpf refused-entry-points { 192.168.99.12 . tcp . 80 : goto"
        " no-endpoints }\n"
        "delete element ip kubeplex-ebpf refused-nodeports { tcp . 3004 }\n"
    )
    # Not committed (a failed apply): the next render is whole again.
    renderer.invalidate()
    assert renderer.render(cluster.checkout(), ADDRESSES, full=False).startswith("add table ")


def sticky(
    *endpoints: str,
    timeout: int = 600,
    policy: str = "Cluster",
    name: str = "sticky",
    vip: str = "172.30.0.49",
    node_port: int = 3009,
) -> list[dict[str, Any]]:
    """A NodePort with ClientIP affinity (Cluster: masqueraded) over ``endpoints``."""
    return [
        service(
            "ns1",
            name,
            vip,
            [port(node_port=node_port)],
            type="NodePort",
            externalTrafficPolicy=policy,
            sessionAffinity="ClientIP",
            sessionAffinityConfig={"clientIP": {"timeoutSeconds": timeout}},
        ),
        endpoint_slice("ns1", name, [ep(ip, NODE) for ip in endpoints]),
    ]


STICKY = "external-LDSSDLKY-ns1/sticky/tcp/p80"


def affinity_sets(text: str) -> list[str]:
    return sorted(set(re.findall(r"affinity-[A-Z0-9]{8}-ns1/sticky/tcp/p80__[0-9a-f.]+/80", text)))


def test_affinity_golden_a_set_per_endpoint_looked_up_before_the_pick() -> None:
    """Upstream's nftables affinity in this table's one chain per Service port: a client in
    an endpoint's set goes back there, a pick adds it to the chosen endpoint's set."""
    cluster = cluster_of(
        [
            *policies(),
            *sticky("10.180.0.2", "10.180.0.3"),
            *sticky(
                "10.180.0.4", policy="Local", name="sticky-local", vip="172.30.0.50", node_port=3010
            ),
        ]
    )
    text = EntryNatRenderer().render(cluster.checkout(full=True), ADDRESSES, full=True)
    assert_golden_file(GOLDEN / "entry-nat-affinity.txt", text, "rendered tables differ")
    # The Services without affinity are rendered as they are without it beside them.
    plain = EntryNatRenderer().render(cluster_of(policies()).checkout(full=True), ADDRESSES, True)
    assert "affinity" not in plain
    a, b = (
        "affinity-NO2U7NRU-ns1/sticky/tcp/p80__10.180.0.2/80",
        "affinity-CHOO574I-ns1/sticky/tcp/p80__10.180.0.3/80",
    )
    assert affinity_sets(text) == sorted([a, b])
    for name in (a, b):
        assert f"  set {name} {{ type ipv4_addr; flags dynamic,timeout; timeout 600s; }}\n" in text
    assert (
        f"  chain {STICKY} {{\n"
        "    meta mark set meta mark | 0x00004000\n"
        f"    ip saddr @{a} meta l4proto tcp update @{a} {{ ip saddr }} dnat to 10.180.0.2:80\n"
        f"    ip saddr @{b} meta l4proto tcp update @{b} {{ ip saddr }} dnat to 10.180.0.3:80\n"
        f"    meta l4proto tcp numgen random mod 2 0 update @{a} {{ ip saddr }}"
        " dnat to 10.180.0.2:80\n"
        f"    meta l4proto tcp update @{b} {{ ip saddr }} dnat to 10.180.0.3:80\n"
        "  }\n"
    ) in text
    # Local: the client's address kept, no mark.
    (local,) = [c for c in text.split("  chain ") if c.startswith("external-Y7SMNTFT-")]
    assert "ns1/sticky-local/tcp/p80 {\n    ip saddr @affinity-" in local and "mark" not in local
    assert len(max(re.findall(r"affinity-\S+", text), key=len)) <= 255


def test_affinity_ipv6_looks_up_the_ip6_source() -> None:
    cluster = cluster_of(
        [
            node_obj(),
            service(
                "ns1",
                "sticky",
                "fd00::49",
                [port(node_port=3009)],
                type="NodePort",
                sessionAffinity="ClientIP",
                ipFamilies=["IPv6"],
            ),
            endpoint_slice("ns1", "sticky", [ep("fd00:10::2", NODE)], family="IPv6"),
        ],
        (V6,),
    )
    text = EntryNatRenderer().render(cluster.checkout(full=True), ("fd00::2",), full=True)
    name = "affinity-" + re.findall(r"affinity-(\S+__fd00.10..2/80)", text)[0]
    assert f"  set {name} {{ type ipv6_addr; flags dynamic,timeout; timeout 10800s; }}" in text
    assert f"ip6 saddr @{name} meta l4proto tcp update @{name} {{ ip6 saddr }} dnat to" in text


def test_a_partial_render_of_an_affinity_service_sends_its_chain_and_sets() -> None:
    cluster = cluster_of([*policies(), *sticky("10.180.0.2", "10.180.0.3")])
    renderer = EntryNatRenderer()
    renderer.render(cluster.checkout(full=True), ADDRESSES, full=True)
    renderer.committed()
    where = "ip kubeplex-ebpf"
    a, b, c = (
        "affinity-NO2U7NRU-ns1/sticky/tcp/p80__10.180.0.2/80",
        "affinity-CHOO574I-ns1/sticky/tcp/p80__10.180.0.3/80",
        "affinity-BJHGSJOY-ns1/sticky/tcp/p80__10.180.0.5/80",
    )
    spec = "{ type ipv4_addr; flags dynamic,timeout; timeout 600s; }"
    # An endpoint added: its set first, then the chain rewritten; nothing else.
    cluster.set_endpoint_slice(sticky("10.180.0.2", "10.180.0.3", "10.180.0.5")[1])
    added = renderer.render(cluster.checkout(), ADDRESSES, full=False)
    lines = added.splitlines()
    assert lines[:2] == [f"add set {where} {c} {spec}", f"flush chain {where} {STICKY}"], added
    assert all(line.startswith(f"add rule {where} {STICKY} ") for line in lines[2:]), added
    assert len(lines) == 2 + 1 + 3 + 3 and f"@{c} {{ ip saddr }} dnat to 10.180.0.5:80" in added
    renderer.committed()
    # One removed: the chain rewritten without it, then its set deleted (no rule uses it).
    cluster.set_endpoint_slice(sticky("10.180.0.3", "10.180.0.5")[1])
    removed = renderer.render(cluster.checkout(), ADDRESSES, full=False)
    lines = removed.splitlines()
    assert lines[0] == f"flush chain {where} {STICKY}" and lines[-1] == f"delete set {where} {a}"
    assert len(lines) == 1 + 1 + 2 + 2 + 1 and a not in "".join(lines[:-1]), removed
    renderer.committed()
    # The timeout changed: the sets made again between the chain's flush and its rules.
    cluster.set_service(sticky("10.180.0.3", "10.180.0.5", timeout=60)[0])
    retimed = renderer.render(cluster.checkout(), ADDRESSES, full=False).splitlines()
    spec60 = spec.replace("600s", "60s")
    assert retimed[:5] == [
        f"flush chain {where} {STICKY}",
        f"delete set {where} {b}",
        f"add set {where} {b} {spec60}",
        f"delete set {where} {c}",
        f"add set {where} {c} {spec60}",
    ]
    assert len(retimed) == 5 + 1 + 2 + 2
    renderer.committed()
    # Affinity off: the chain without lookups, the sets deleted.
    svc = sticky("10.180.0.3", "10.180.0.5")[0]
    del svc["spec"]["sessionAffinity"], svc["spec"]["sessionAffinityConfig"]
    cluster.set_service(svc)
    off = renderer.render(cluster.checkout(), ADDRESSES, full=False).splitlines()
    assert off[-2:] == [f"delete set {where} {b}", f"delete set {where} {c}"]
    assert not any("affinity" in line for line in off[:-2])


def test_no_table_where_no_service_port_has_an_external_entry_point() -> None:
    """No NAT hook, so no conntrack, on a node whose Services are reached at the socket only."""
    cluster = cluster_of([node_obj(), web_with_cluster_ip_only()])
    renderer = EntryNatRenderer()
    absent = "add table ip kubeplex-ebpf\ndelete table ip kubeplex-ebpf\n"
    assert renderer.render(cluster.checkout(full=True), ADDRESSES, full=True) == absent
    renderer.committed()
    cluster.set_service(web_with_external_ip())
    assert renderer.render(cluster.checkout(), ADDRESSES, full=False).startswith(
        absent + "table ip kubeplex-ebpf {\n"
    )
    renderer.committed()
    cluster.delete_service("ns1", "new")
    assert renderer.render(cluster.checkout(), ADDRESSES, full=False) == absent
    renderer.committed()
    cluster.set_service(web_with_cluster_ip_only("other"))
    assert renderer.render(cluster.checkout(), ADDRESSES, full=False) == ""


def test_a_table_with_its_nat_rule_stays_while_the_node_holds_nated_flows() -> None:
    """After a switch from a netfilter mode, established flows keep their NAT only while a nat
    chain with a NAT rule is there: the table stays until a full sync finds none left."""
    cluster = cluster_of([node_obj(), web_with_cluster_ip_only()])
    ebpf = backend()
    maps = ebpf.kernel
    assert isinstance(maps, FakeEbpfMaps)
    maps.holds_nat_flows = True

    def sync(full: bool) -> str:
        state = cluster.checkout(full=full)
        plan = ebpf.render(state, ebpf.observe(state))
        ebpf.apply(plan)
        return plan.entry_nat

    kept = sync(full=True)
    assert kept.startswith("add table ip kubeplex-ebpf\ndelete table ip kubeplex-ebpf\ntable ")
    assert "masquerade" in kept and maps.tables() == [("ip", "kubeplex-ebpf")]
    # A partial sync of a Service reached at the socket only leaves the kept table alone.
    cluster.set_service(web_with_cluster_ip_only("other"))
    assert sync(full=False) == ""
    # The flows ended: the next full sync removes it.
    maps.holds_nat_flows = False
    assert sync(full=True) == "add table ip kubeplex-ebpf\ndelete table ip kubeplex-ebpf\n"
    assert maps.tables() == []


def web_with_cluster_ip_only(name: str = "inside") -> dict[str, Any]:
    return service("ns1", name, "172.30.0.47", [port()])


def web_with_external_ip() -> dict[str, Any]:
    return service("ns1", "new", "172.30.0.48", [port()], externalIPs=["192.168.99.12"])


def backend() -> EbpfBackend:
    ctx = BackendContext(config({"mode": "nftables"}), NODE, (V4,), kernel=FakeEbpfMaps())
    return EbpfBackend(ctx, options={"bpffs": "/nonexistent", "cgroup": "/nonexistent"})


def test_the_plan_carries_the_tables_and_apply_commits_them() -> None:
    cluster = cluster_of(policies())
    ebpf = backend()
    tables = ebpf.kernel
    assert isinstance(tables, FakeEbpfMaps)
    plan = ebpf.render(cluster.checkout(full=True))
    assert "# nftables, traffic from other hosts:\nadd table ip kubeplex-ebpf\n" in str(plan)
    assert plan.kernel_inputs()[-1] == plan.entry_nat
    ebpf.apply(plan)
    assert tables.transactions == [plan.entry_nat]
    assert "nftables table ip kubeplex-ebpf" in ebpf.leftovers()

    # A partial sync that changes nothing external sends no transaction.
    cluster.set_endpoint_slice(endpoint_slice("ns1", "inside", [ep("10.180.0.8", NODE)]))
    quiet = ebpf.render(cluster.checkout())
    assert not quiet.full and quiet.entry_nat == "" and "nftables" not in str(quiet)
    ebpf.apply(quiet)
    # One that does sends its changes.
    cluster.set_endpoint_slice(endpoint_slice("ns1", "elsewhere", [ep("10.180.0.9", NODE)]))
    ebpf.apply(ebpf.render(cluster.checkout()))
    assert tables.transactions[-1].startswith("flush chain ip kubeplex-ebpf external-")
    # A full sync does not delete a table it knows (its affinity sets would go empty): it
    # sends what differs, here nothing; a table someone deleted it writes whole again.
    state = cluster.checkout(full=True)
    ebpf.apply(ebpf.render(state, ebpf.observe(state)))
    assert len(tables.transactions) == 2
    tables.transact("delete table ip kubeplex-ebpf\n")
    state = cluster.checkout(full=True)
    ebpf.apply(ebpf.render(state, ebpf.observe(state)))
    assert len(tables.transactions) == 4 and tables.transactions[-1].startswith(
        "add table ip kubeplex-ebpf\n"
    )

    report = ebpf.cleanup()
    assert "nftables table ip kubeplex-ebpf" in report.removed
    assert tables.transactions[-1] == "delete table ip kubeplex-ebpf\n"
    assert "nftables table ip kubeplex-ebpf" not in ebpf.leftovers()


def test_source_ranges_filter_only_the_other_hosts() -> None:
    """The socket programs still serve a LoadBalancer IP with source ranges (so the mode does
    not declare them); the tables filter what comes from other hosts."""
    cluster = cluster_of(policies())
    plan = EbpfRenderer(RenderSettings(("192.168.0.2",))).render(cluster.checkout(full=True))
    assert "update kpx_svc4 1.2.3.4:80/tcp -> " in str(plan)
    text = EntryNatRenderer().render(cluster.checkout(full=True), ADDRESSES, full=True)
    assert "1.2.3.4 . tcp . 80 : goto firewall-FCBKHWL6-ns1/lb/tcp/p80," in text
    assert "tcp . 3005 : goto external-FCBKHWL6-ns1/lb/tcp/p80," in text


def test_a_node_without_nft_lacks_a_requirement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = EbpfOptions(cgroup=tmp_path, bpffs=tmp_path)
    loader = Loader(tmp_path, object_path=tmp_path / "kubeplex_lb.bpf.o")
    nft_missing = "executable 'nft' not found in PATH"
    assert nft_missing not in requirements.missing(options, loader)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert nft_missing in requirements.missing(options, loader)
