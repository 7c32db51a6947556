"""The nftables backend on the seed lab (testing/lab): its golden transaction, the tables it
leaves (as the seed cluster's kube-proxy did), the base chains' hooks and priorities, and
the IPv6 table's NodePorts.
"""

from __future__ import annotations

import re

from kits.nftables_kit import Harness, assert_golden, elements_of, rules_of
from kits.render_kit import LAB, V4, V6

from kubeplex.core.config.kubeproxy import load_config, with_overrides
from kubeplex.core.dataplane import plugins
from kubeplex.core.sources.manifests import ManifestSource


def lab_harness() -> Harness:
    base = load_config(LAB / "config.yaml", plugins.known_modes())
    cfg = with_overrides(base, mode="nftables", known_modes=plugins.known_modes())
    # No upstream ServiceCIDRs: the lab's own ServiceCIDR comes with its manifests.
    h = Harness(cfg=cfg, families=(V4, V6), node=cfg.hostname_override, service_cidrs=())
    source = ManifestSource(LAB / "manifests", h.cluster)
    source.load()
    assert not source.problems and not h.cluster.invalid
    return h


def test_seed_lab_golden() -> None:
    assert_golden("seed-lab", lab_harness().render(full=True))


def test_seed_lab_applies_and_matches_the_seed() -> None:
    h = lab_harness()
    h.sync(full=True)
    dump = h.dump()
    svc = "service-PFISGYVC-default/web/tcp/"
    # map service-ips { type ipv4_addr . inet_proto . inet_service : verdict ... }
    assert (
        "add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service :"
        ' verdict ; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }'
    ) in dump
    assert f"{{ 10.96.88.59 . tcp . 80 : goto {svc} }}" in elements_of(dump, "service-ips")
    # services: ip daddr . meta l4proto . th dport vmap @service-ips, then NodePorts.
    assert rules_of(dump, "services") == [
        "ip daddr . meta l4proto . th dport vmap @service-ips",
        "ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports",
    ]
    # numgen random mod 3 over the three pods (through endpoint chains, see below).
    numgen = rules_of(dump, svc)[-1]
    assert numgen.startswith("numgen random mod 3 vmap { 0 : goto endpoint-")
    assert [m.split("__")[1] for m in re.findall(r"goto (\S+)", numgen)] == [
        "10.244.1.2/8080",
        "10.244.2.2/8080",
        "10.244.2.3/8080",
    ]
    # Masquerade off-cluster sources (seed: ip saddr != 10.244.0.0/16 ... mark | 0x00004000).
    assert rules_of(dump, svc)[0] == (
        "ip daddr 10.96.88.59 tcp dport 80 ip saddr != 10.244.0.0/16 jump mark-for-masquerade"
    )
    assert rules_of(dump, "mark-for-masquerade") == ["mark set mark or 0x00004000"]
    # "the nodeport-ips set held only the node's primary address"; never localhost.
    assert elements_of(dump, "nodeport-ips") == ["{ 172.18.0.5 }"]
    assert "127.0.0.0/8" not in rules_of(dump, "services")[1]
    assert elements_of(dump, "service-nodeports") == [
        "{ tcp . 30080 : goto external-SXIFFM75-default/web-nodeport/tcp/ }"
    ]
    # Everything in its own tables.
    assert set(h.kernel.tables) == {("ip", "kube-proxy"), ("ip6", "kube-proxy")}
    # cluster-ips-check rejects unused ports of a ClusterIP, and drops traffic to addresses of
    # the lab's ServiceCIDR "kubernetes" that no Service has.
    assert rules_of(dump, "cluster-ips-check") == [
        'ip daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"',
        'ip daddr { 10.96.0.0/16 } drop comment "Drop traffic to unallocated ClusterIPs"',
    ]
    assert elements_of(dump, "cluster-ips") == ["{ 10.96.88.59 }", "{ 10.96.223.155 }"]


def test_seed_base_chains_hooks_and_priorities() -> None:
    h = lab_harness()
    h.sync(full=True)
    chains = h.kernel.tables["ip", "kube-proxy"].chains
    assert {c: chain.base for c, chain in chains.items() if chain.base} == {
        "filter-prerouting-pre-dnat": ("filter", "prerouting", -110),
        "filter-output-pre-dnat": ("filter", "output", -110),
        "filter-input": ("filter", "input", 0),
        "filter-forward": ("filter", "forward", 0),
        "filter-output": ("filter", "output", 0),
        "nat-prerouting": ("nat", "prerouting", -100),
        "nat-output": ("nat", "output", -100),
        "nat-postrouting": ("nat", "postrouting", 100),
    }


def test_seed_ipv6_table_serves_nodeports_everywhere_but_localhost() -> None:
    # "primary" with no IPv6 node address leaves IPv6 NodePorts on every local address, as
    # cmd/kube-proxy does (it only turns the node's IPs into /32 and /128 CIDRs).
    h = lab_harness()
    h.sync(full=True)
    dump6 = h.dump(V6)
    assert "nodeport-ips" not in dump6
    assert (
        "add rule ip6 kube-proxy services fib daddr type local ip6 daddr != ::1"
        " meta l4proto . th dport vmap @service-nodeports"
    ) in dump6
