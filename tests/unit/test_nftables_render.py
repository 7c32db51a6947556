"""The nftables backend's tables, against upstream kube-proxy's nftables mode (no root).

Upstream reference: pkg/proxy/nftables/proxier.go (setupNFTables, syncProxyRules,
writeServiceToEndpointRules) and the expected table dumps in its proxier_test.go
(``baseRules``, TestOverallNFTablesRules, TestSyncProxyRulesRepeated). Ported scenarios use
upstream's fake proxier (tests/kits/nftables_kit.py). A transaction is applied to
``FakeNftables``, which refuses what the kernel refuses; its dump (knftables' fake's format)
is compared with upstream's expected dump after upstream's own normalization
(sortNFTablesTransaction); the masquerade mark is written as real kube-proxy writes it
(``0x00004000``; upstream's tests inject ``0x4000``). Also: nodePortAddresses.

Golden files live in tests/unit/golden/nftables/; ``KUBEPLEX_UPDATE_GOLDEN=1 pytest
tests/unit/test_nftables_*.py`` rewrites them (review the diff line by line before committing).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import pytest
from kits import render_kit
from kits.nftables_kit import (
    GOLDEN,
    NODE,
    UPSTREAM,
    Harness,
    assert_golden,
    assert_same_table,
    commands_of,
    config,
    elements_of,
    lines_of,
    node_obj,
    normalized,
    overall_objects,
    render,
    rules_of,
)
from kits.render_kit import V4, V6, endpoint_slice, ep, port, service, svc1

from kubeplex.backends.nftables import NftablesBackend
from kubeplex.backends.nftables import names as N
from kubeplex.backends.nftables.render import NftablesRendered
from kubeplex.backends.nftables.rules import FamilySettings, go_hex_mark, setup_lines
from kubeplex.core.dataplane.backend import BackendContext
from kubeplex.core.model.types import IPFamily, NodeInfo

UPSTREAM_BASE_RULES = """
add table ip kube-proxy { comment "rules for kube-proxy" ; }

add set ip kube-proxy cluster-ips { type ipv4_addr ; comment "Active ClusterIPs" ; }
add set ip kube-proxy nodeport-ips { type ipv4_addr ; comment "IPs that accept NodePort traffic" ; }

add map ip kube-proxy firewall-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "destinations that are subject to LoadBalancerSourceRanges" ; }
add map ip kube-proxy no-endpoint-nodeports { type inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to service nodeports with no endpoints" ; }
add map ip kube-proxy no-endpoint-services { type ipv4_addr . inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to services with no endpoints" ; }
add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }
add map ip kube-proxy service-nodeports { type inet_proto . inet_service : verdict ; comment "NodePort traffic" ; }

add chain ip kube-proxy cluster-ips-check
add chain ip kube-proxy filter-prerouting-pre-dnat { type filter hook prerouting priority -110 ; }
add chain ip kube-proxy filter-output-pre-dnat { type filter hook output priority -110 ; }
add chain ip kube-proxy filter-forward { type filter hook forward priority 0 ; }
add chain ip kube-proxy filter-input { type filter hook input priority 0 ; }
add chain ip kube-proxy filter-output { type filter hook output priority 0 ; }
add chain ip kube-proxy firewall-check
add chain ip kube-proxy mark-for-masquerade
add chain ip kube-proxy masquerading
add chain ip kube-proxy nat-output { type nat hook output priority -100 ; }
add chain ip kube-proxy nat-postrouting { type nat hook postrouting priority 100 ; }
add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }
add chain ip kube-proxy nodeport-endpoints-check
add chain ip kube-proxy reject-chain { comment "helper for @no-endpoint-services / @no-endpoint-nodeports" ; }
add chain ip kube-proxy services
add chain ip kube-proxy service-endpoints-check

add rule ip kube-proxy cluster-ips-check ip daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"
add rule ip kube-proxy cluster-ips-check ip daddr { 172.30.0.0/16 } drop comment "Drop traffic to unallocated ClusterIPs"
add rule ip kube-proxy filter-prerouting-pre-dnat ct state new jump firewall-check
add rule ip kube-proxy filter-forward ct state new jump service-endpoints-check
add rule ip kube-proxy filter-forward ct state new jump cluster-ips-check
add rule ip kube-proxy filter-input ct state new jump nodeport-endpoints-check
add rule ip kube-proxy filter-input ct state new jump service-endpoints-check
add rule ip kube-proxy filter-output ct state new jump service-endpoints-check
add rule ip kube-proxy filter-output-pre-dnat ct state new jump firewall-check
add rule ip kube-proxy filter-output ct state new jump cluster-ips-check
add rule ip kube-proxy firewall-check ip daddr . meta l4proto . th dport vmap @firewall-ips
add rule ip kube-proxy mark-for-masquerade mark set mark or 0x4000
add rule ip kube-proxy masquerading mark and 0x4000 == 0 return
add rule ip kube-proxy masquerading mark set mark xor 0x4000
add rule ip kube-proxy masquerading masquerade fully-random
add rule ip kube-proxy nat-output jump services
add rule ip kube-proxy nat-postrouting jump masquerading
add rule ip kube-proxy nat-prerouting jump services
add rule ip kube-proxy nodeport-endpoints-check ip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports
add rule ip kube-proxy reject-chain reject
add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips
add rule ip kube-proxy services ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports

add element ip kube-proxy nodeport-ips { 192.168.0.2 }
add rule ip kube-proxy service-endpoints-check ip daddr . meta l4proto . th dport vmap @no-endpoint-services
"""  # noqa: E501 - upstream's lines, verbatim


UPSTREAM_OVERALL = """
# svc1
add chain ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80
add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 ip daddr 172.30.0.41 tcp dport 80 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 }

add chain ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80
add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 ip saddr 10.180.0.1 jump mark-for-masquerade
add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 meta l4proto tcp dnat to 10.180.0.1:80

add element ip kube-proxy cluster-ips { 172.30.0.41 }
add element ip kube-proxy service-ips { 172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }

# svc2
add chain ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80
add rule ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80 ip daddr 172.30.0.42 tcp dport 80 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80 }
add chain ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 ip saddr 10.0.0.0/8 goto service-42NFTM6N-ns2/svc2/tcp/p80 comment "short-circuit pod traffic"
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local jump mark-for-masquerade comment "masquerade local traffic"
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local goto service-42NFTM6N-ns2/svc2/tcp/p80 comment "short-circuit local traffic"
add chain ip kube-proxy endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80
add rule ip kube-proxy endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80 ip saddr 10.180.0.2 jump mark-for-masquerade
add rule ip kube-proxy endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80 meta l4proto tcp dnat to 10.180.0.2:80

add element ip kube-proxy cluster-ips { 172.30.0.42 }
add element ip kube-proxy service-ips { 172.30.0.42 . tcp . 80 : goto service-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy service-ips { 192.168.99.22 . tcp . 80 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy service-ips { 1.2.3.4 . tcp . 80 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy service-nodeports { tcp . 3001 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }

add element ip kube-proxy no-endpoint-nodeports { tcp . 3001 comment "ns2/svc2:p80" : drop }
add element ip kube-proxy no-endpoint-services { 1.2.3.4 . tcp . 80 comment "ns2/svc2:p80" : drop }
add element ip kube-proxy no-endpoint-services { 192.168.99.22 . tcp . 80 comment "ns2/svc2:p80" : drop }

# svc3
add chain ip kube-proxy service-4AT6LBPK-ns3/svc3/tcp/p80
add rule ip kube-proxy service-4AT6LBPK-ns3/svc3/tcp/p80 ip daddr 172.30.0.43 tcp dport 80 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-4AT6LBPK-ns3/svc3/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-UEIP74TE-ns3/svc3/tcp/p80__10.180.0.3/80 }
add chain ip kube-proxy external-4AT6LBPK-ns3/svc3/tcp/p80
add rule ip kube-proxy external-4AT6LBPK-ns3/svc3/tcp/p80 jump mark-for-masquerade
add rule ip kube-proxy external-4AT6LBPK-ns3/svc3/tcp/p80 goto service-4AT6LBPK-ns3/svc3/tcp/p80
add chain ip kube-proxy endpoint-UEIP74TE-ns3/svc3/tcp/p80__10.180.0.3/80
add rule ip kube-proxy endpoint-UEIP74TE-ns3/svc3/tcp/p80__10.180.0.3/80 ip saddr 10.180.0.3 jump mark-for-masquerade
add rule ip kube-proxy endpoint-UEIP74TE-ns3/svc3/tcp/p80__10.180.0.3/80 meta l4proto tcp dnat to 10.180.0.3:80

add element ip kube-proxy cluster-ips { 172.30.0.43 }
add element ip kube-proxy service-ips { 172.30.0.43 . tcp . 80 : goto service-4AT6LBPK-ns3/svc3/tcp/p80 }
add element ip kube-proxy service-nodeports { tcp . 3003 : goto external-4AT6LBPK-ns3/svc3/tcp/p80 }

# svc4
add chain ip kube-proxy service-LAUZTJTB-ns4/svc4/tcp/p80
add rule ip kube-proxy service-LAUZTJTB-ns4/svc4/tcp/p80 ip daddr 172.30.0.44 tcp dport 80 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-LAUZTJTB-ns4/svc4/tcp/p80 numgen random mod 2 vmap { 0 : goto endpoint-UNZV3OEC-ns4/svc4/tcp/p80__10.180.0.4/80 , 1 : goto endpoint-5RFCDDV7-ns4/svc4/tcp/p80__10.180.0.5/80 }
add chain ip kube-proxy external-LAUZTJTB-ns4/svc4/tcp/p80
add rule ip kube-proxy external-LAUZTJTB-ns4/svc4/tcp/p80 jump mark-for-masquerade
add rule ip kube-proxy external-LAUZTJTB-ns4/svc4/tcp/p80 goto service-LAUZTJTB-ns4/svc4/tcp/p80
add chain ip kube-proxy endpoint-5RFCDDV7-ns4/svc4/tcp/p80__10.180.0.5/80
add rule ip kube-proxy endpoint-5RFCDDV7-ns4/svc4/tcp/p80__10.180.0.5/80 ip saddr 10.180.0.5 jump mark-for-masquerade
add rule ip kube-proxy endpoint-5RFCDDV7-ns4/svc4/tcp/p80__10.180.0.5/80 meta l4proto tcp dnat to 10.180.0.5:80
add chain ip kube-proxy endpoint-UNZV3OEC-ns4/svc4/tcp/p80__10.180.0.4/80
add rule ip kube-proxy endpoint-UNZV3OEC-ns4/svc4/tcp/p80__10.180.0.4/80 ip saddr 10.180.0.4 jump mark-for-masquerade
add rule ip kube-proxy endpoint-UNZV3OEC-ns4/svc4/tcp/p80__10.180.0.4/80 meta l4proto tcp dnat to 10.180.0.4:80

add element ip kube-proxy cluster-ips { 172.30.0.44 }
add element ip kube-proxy service-ips { 172.30.0.44 . tcp . 80 : goto service-LAUZTJTB-ns4/svc4/tcp/p80 }
add element ip kube-proxy service-ips { 192.168.99.33 . tcp . 80 : goto external-LAUZTJTB-ns4/svc4/tcp/p80 }

# svc5
add set ip kube-proxy affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 { type ipv4_addr ; flags dynamic,timeout ; timeout 10800s ; }
add chain ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80
add rule ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80 ip daddr 172.30.0.45 tcp dport 80 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80 ip saddr @affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 goto endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80
add rule ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 }
add chain ip kube-proxy external-HVFWP5L3-ns5/svc5/tcp/p80
add rule ip kube-proxy external-HVFWP5L3-ns5/svc5/tcp/p80 jump mark-for-masquerade
add rule ip kube-proxy external-HVFWP5L3-ns5/svc5/tcp/p80 goto service-HVFWP5L3-ns5/svc5/tcp/p80

add chain ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80
add rule ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 ip saddr 10.180.0.3 jump mark-for-masquerade
add rule ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 update @affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 { ip saddr }
add rule ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 meta l4proto tcp dnat to 10.180.0.3:80

add chain ip kube-proxy firewall-HVFWP5L3-ns5/svc5/tcp/p80
add rule ip kube-proxy firewall-HVFWP5L3-ns5/svc5/tcp/p80 ip saddr != { 203.0.113.0/25 } drop

add element ip kube-proxy cluster-ips { 172.30.0.45 }
add element ip kube-proxy service-ips { 172.30.0.45 . tcp . 80 : goto service-HVFWP5L3-ns5/svc5/tcp/p80 }
add element ip kube-proxy service-ips { 5.6.7.8 . tcp . 80 : goto external-HVFWP5L3-ns5/svc5/tcp/p80 }
add element ip kube-proxy service-nodeports { tcp . 3002 : goto external-HVFWP5L3-ns5/svc5/tcp/p80 }
add element ip kube-proxy firewall-ips { 5.6.7.8 . tcp . 80 : goto firewall-HVFWP5L3-ns5/svc5/tcp/p80 }

# svc6
add element ip kube-proxy cluster-ips { 172.30.0.46 }
add element ip kube-proxy no-endpoint-services { 172.30.0.46 . tcp . 80 comment "ns6/svc6:p80" : goto reject-chain }
"""  # noqa: E501 - upstream's lines, verbatim


def test_upstream_overall_golden() -> None:
    assert_golden("upstream-overall", render(overall_objects()))


def test_upstream_overall_table() -> None:
    h = Harness(overall_objects())
    h.sync()
    assert_same_table(UPSTREAM_BASE_RULES + UPSTREAM_OVERALL, h.dump())
    # A second full sync (no base-chain re-creation this time) leaves the same table.
    h.sync(full=True)
    assert_same_table(UPSTREAM_BASE_RULES + UPSTREAM_OVERALL, h.dump())


def test_v1_33_overall_table_item_for_item() -> None:
    """The whole table of kube-proxy 1.33's TestOverallNFTablesRules (a golden file of its
    expected dump), item for item: every chain, rule, set, map and element."""
    expected = (GOLDEN / "v1.33-overall-table.txt").read_text()
    h = Harness(overall_objects())
    h.sync()
    assert_same_table(expected, h.dump())
    assert len(normalized(expected)) == len(normalized(h.dump()))


def test_first_sync_recreates_base_chains_once() -> None:
    h = Harness(overall_objects())
    first = lines_of(h.sync())
    assert "delete chain ip kube-proxy nat-prerouting" in first
    assert "add chain ip kube-proxy nat-prerouting" in first
    second = lines_of(h.sync(full=True))
    assert not any(line.startswith("delete chain ip kube-proxy nat-") for line in second)


def _svc(
    ns: str, name: str, prt: str, ip: str, pnum: int, h: str, eps: Sequence[tuple[str, str]]
) -> str:
    """Upstream's dump of a ClusterIP service with endpoints (name hashes as upstream's)."""
    chain = f"service-{h}-{ns}/{name}/tcp/{prt}"
    epc = [(f"endpoint-{eh}-{ns}/{name}/tcp/{prt}__{eip}/{pnum}", eip) for eh, eip in eps]
    vmap = " , ".join(f"{i} : goto {c}" for i, (c, _) in enumerate(epc))
    out = [
        f"add element ip kube-proxy cluster-ips {{ {ip} }}",
        f"add element ip kube-proxy service-ips {{ {ip} . tcp . {pnum} : goto {chain} }}",
        f"add chain ip kube-proxy {chain}",
        f"add rule ip kube-proxy {chain} ip daddr {ip} tcp dport {pnum} ip saddr != 10.0.0.0/8"
        " jump mark-for-masquerade",
        f"add rule ip kube-proxy {chain} numgen random mod {len(epc)} vmap {{ {vmap} }}",
    ]
    for c, eip in epc:
        out += [
            f"add chain ip kube-proxy {c}",
            f"add rule ip kube-proxy {c} ip saddr {eip} jump mark-for-masquerade",
            f"add rule ip kube-proxy {c} meta l4proto tcp dnat to {eip}:{pnum}",
        ]
    return "\n".join(out) + "\n"


def _no_endpoints(ns: str, name: str, prt: str, ip: str) -> str:
    return (
        f"add element ip kube-proxy cluster-ips {{ {ip} }}\n"
        f"add element ip kube-proxy no-endpoint-services {{ {ip} . tcp . 80 comment"
        f' "{ns}/{name}:{prt}" : goto reject-chain }}\n'
    )


SVC1 = _svc("ns1", "svc1", "p80", "172.30.0.41", 80, "ULMVA6XW", [("5TPGNJF2", "10.0.1.1")])


SVC2 = _svc("ns2", "svc2", "p8080", "172.30.0.42", 8080, "MHHHYRWA", [("7RVP4LUQ", "10.0.2.1")])


SVC3 = _svc("ns3", "svc3", "p80", "172.30.0.43", 80, "4AT6LBPK", [("2OCDJSZQ", "10.0.3.1")])


SVC3B = _svc("ns3", "svc3", "p80", "172.30.0.43", 80, "4AT6LBPK", [("SWWHDC7X", "10.0.3.2")])


SVC3C = _svc(
    "ns3",
    "svc3",
    "p80",
    "172.30.0.43",
    80,
    "4AT6LBPK",
    [("SWWHDC7X", "10.0.3.2"), ("TQ2QKHCZ", "10.0.3.3")],
)


SVC4 = _svc("ns4", "svc4", "p80", "172.30.0.44", 80, "LAUZTJTB", [("WAHRBT2B", "10.0.4.1")])


def _cluster_ip(ns: str, name: str, ip: str, prt: str = "p80", pnum: int = 80) -> dict[str, Any]:
    return service(ns, name, ip, [port(pnum, prt)], type="ClusterIP")


def _slice(
    ns: str, name: str, ips: Sequence[str], prt: str = "p80", pnum: int = 80
) -> dict[str, Any]:
    return endpoint_slice(ns, name, [ep(ip) for ip in ips], [port(pnum, prt)])


def _touches_only(rendered: NftablesRendered, *services: str) -> None:
    """Every command of a partial transaction is about one of ``services`` (ns/name)."""
    pattern = "|".join(re.escape(s) for s in services)
    for line in lines_of(rendered):
        if line.startswith("#"):
            continue
        assert re.search(rf"-(?:{pattern})/", line) or re.search(r"\{ 172\.30\.0\.4\d[ }]", line), (
            line
        )


def test_upstream_sync_proxy_rules_repeated() -> None:
    """TestSyncProxyRulesRepeated, step by step: partial syncs leave upstream's table.

    Upstream flushes chains that are no longer needed and deletes them a second later; this
    kernel (>= 6.2) takes the deletion in the same transaction, so they are gone at once.
    """
    h = Harness(
        [
            node_obj(),
            _cluster_ip("ns1", "svc1", "172.30.0.41"),
            _cluster_ip("ns2", "svc2", "172.30.0.42", "p8080", 8080),
            _slice("ns1", "svc1", ["10.0.1.1"]),
            _slice("ns2", "svc2", ["10.0.2.1"], "p8080", 8080),
        ]
    )
    h.sync()
    assert_same_table(UPSTREAM_BASE_RULES + SVC1 + SVC2, h.dump())

    # Add a new service and its endpoints.
    h.feed([_cluster_ip("ns3", "svc3", "172.30.0.43"), _slice("ns3", "svc3", ["10.0.3.1"])])
    r = h.sync()
    assert not r.full
    assert_same_table(UPSTREAM_BASE_RULES + SVC1 + SVC2 + SVC3, h.dump())
    # 2 elements, 2 chains (add + flush + 2 rules each): upstream's 10 operations.
    assert len(commands_of(r)) == 10
    _touches_only(r, "ns3/svc3")

    # Delete a service: its elements go, its chains are flushed and deleted.
    h.cluster.delete_service("ns2", "svc2")
    r = h.sync()
    assert_same_table(UPSTREAM_BASE_RULES + SVC1 + SVC3, h.dump())
    assert commands_of(r) == [
        "delete element ip kube-proxy cluster-ips { 172.30.0.42 }",
        "delete element ip kube-proxy service-ips { 172.30.0.42 . tcp . 8080 }",
        "flush chain ip kube-proxy endpoint-7RVP4LUQ-ns2/svc2/tcp/p8080__10.0.2.1/8080",
        "flush chain ip kube-proxy service-MHHHYRWA-ns2/svc2/tcp/p8080",
        "delete chain ip kube-proxy endpoint-7RVP4LUQ-ns2/svc2/tcp/p8080__10.0.2.1/8080",
        "delete chain ip kube-proxy service-MHHHYRWA-ns2/svc2/tcp/p8080",
    ]

    # Add a service without endpoints: 2 elements.
    h.feed([_cluster_ip("ns4", "svc4", "172.30.0.44")])
    r = h.sync()
    no_eps = _no_endpoints("ns4", "svc4", "p80", "172.30.0.44")
    assert_same_table(UPSTREAM_BASE_RULES + SVC1 + SVC3 + no_eps, h.dump())
    assert len(commands_of(r)) == 2

    # Its endpoints arrive: one element out, one in, two chains (upstream's 10 operations).
    h.feed([_slice("ns4", "svc4", ["10.0.4.1"])])
    r = h.sync()
    assert_same_table(UPSTREAM_BASE_RULES + SVC1 + SVC3 + SVC4, h.dump())
    assert len(commands_of(r)) == 10
    _touches_only(r, "ns4/svc4")

    # Change an endpoint: the service chain and the new endpoint chain are written, the old
    # endpoint chain is flushed and deleted.
    h.feed([_slice("ns3", "svc3", ["10.0.3.2"])])
    r = h.sync()
    assert_same_table(UPSTREAM_BASE_RULES + SVC1 + SVC3B + SVC4, h.dump())
    assert len(commands_of(r)) == 10
    _touches_only(r, "ns3/svc3")

    # Add an endpoint: the unchanged endpoint chain is left alone (upstream rewrites it too).
    h.feed([_slice("ns3", "svc3", ["10.0.3.2", "10.0.3.3"])])
    r = h.sync()
    assert_same_table(UPSTREAM_BASE_RULES + SVC1 + SVC3C + SVC4, h.dump())
    assert len(commands_of(r)) == 8
    assert not any(
        ln.startswith(("flush chain", "add rule")) and "-SWWHDC7X-" in ln.split()[4]
        for ln in commands_of(r)
    )

    # Empty a service's endpoints: element swap, three chains flushed and deleted.
    h.feed([_slice("ns3", "svc3", [])])
    r = h.sync()
    no_eps3 = _no_endpoints("ns3", "svc3", "p80", "172.30.0.43")
    assert_same_table(UPSTREAM_BASE_RULES + SVC1 + no_eps3 + SVC4, h.dump())
    assert len(commands_of(r)) == 2 + 3 + 3

    # And back: everything is written again.
    h.feed([_slice("ns3", "svc3", ["10.0.3.2", "10.0.3.3"])])
    r = h.sync()
    assert_same_table(UPSTREAM_BASE_RULES + SVC1 + SVC3C + SVC4, h.dump())
    assert len(commands_of(r)) == 2 + 3 * 4
    # Nothing pending: a sync without changes writes nothing.
    assert commands_of(h.sync()) == []


def test_upstream_no_endpoints_reject() -> None:
    """TestNoEndpointsReject: cluster IP, external IP, NodePort and LB IP all go to reject."""
    h = Harness(
        [
            node_obj(),
            svc1("LoadBalancer", externalIPs=["192.168.99.11"], ingress=["1.2.3.4"]),
        ]
    )
    assert_golden("upstream-no-endpoints", h.sync())
    dump = h.dump()
    assert elements_of(dump, "no-endpoint-services") == [
        '{ 172.30.0.41 . tcp . 80 comment "ns1/svc1:p80" : goto reject-chain }',
        '{ 192.168.99.11 . tcp . 80 comment "ns1/svc1:p80" : goto reject-chain }',
        '{ 1.2.3.4 . tcp . 80 comment "ns1/svc1:p80" : goto reject-chain }',
    ]
    assert elements_of(dump, "no-endpoint-nodeports") == [
        '{ tcp . 3001 comment "ns1/svc1:p80" : goto reject-chain }'
    ]
    assert elements_of(dump, "service-ips") == [] and "service-ULMVA6XW" not in dump


def test_upstream_external_traffic_policy_local() -> None:
    """TestExternalTrafficPolicyLocal: external traffic goes to the local endpoint only,
    unmasqueraded; pod and node traffic is short-circuited to the cluster chain."""
    h = Harness(render_kit.etp_local_objects(node_obj(), NODE))
    assert_golden("upstream-etp-local", h.sync())
    dump = h.dump()
    ext = "external-ULMVA6XW-ns1/svc1/tcp/p80"
    assert rules_of(dump, ext) == [
        "ip saddr 10.0.0.0/8 goto service-ULMVA6XW-ns1/svc1/tcp/p80"
        ' comment "short-circuit pod traffic"',
        'fib saddr type local jump mark-for-masquerade comment "masquerade local traffic"',
        "fib saddr type local goto service-ULMVA6XW-ns1/svc1/tcp/p80"
        ' comment "short-circuit local traffic"',
        "goto local-ULMVA6XW-ns1/svc1/tcp/p80",
    ]
    local = rules_of(dump, "local-ULMVA6XW-ns1/svc1/tcp/p80")
    assert local == [
        "numgen random mod 1 vmap { 0 : goto endpoint-"
        + N.hash8("ns1/svc1/tcp/p80__10.180.2.1/80")
        + "-ns1/svc1/tcp/p80__10.180.2.1/80 }"
    ]
    assert "mod 2" in rules_of(dump, "service-ULMVA6XW-ns1/svc1/tcp/p80")[-1]
    assert elements_of(dump, "no-endpoint-services") == []


def test_external_traffic_policy_local_without_local_endpoints_drops() -> None:
    h = Harness(
        [
            node_obj(),
            svc1("NodePort", externalTrafficPolicy="Local"),
            endpoint_slice("ns1", "svc1", [ep("10.180.0.1", "other-node")]),
        ]
    )
    r = h.sync()
    dump = h.dump()
    assert elements_of(dump, "no-endpoint-nodeports") == [
        '{ tcp . 3001 comment "ns1/svc1:p80" : drop }'
    ]
    # The external chain still short-circuits pod and node traffic, but has no final goto.
    assert rules_of(dump, "external-ULMVA6XW-ns1/svc1/tcp/p80")[-1].endswith(
        'comment "short-circuit local traffic"'
    )
    assert r.plans[0].no_local_endpoints == {"internal": 0, "external": 1}


def test_upstream_internal_traffic_policy_local() -> None:
    h = Harness(
        [
            node_obj(),
            service("ns1", "svc1", "172.30.1.1", [port()], internalTrafficPolicy="Local"),
            endpoint_slice("ns1", "svc1", [ep("10.0.1.1", NODE), ep("10.0.1.2", "host1")]),
        ]
    )
    assert_golden("upstream-itp-local", h.sync())
    dump = h.dump()
    local = "local-" + N.hash8("ns1/svc1/tcp/p80") + "-ns1/svc1/tcp/p80"
    assert elements_of(dump, "service-ips") == [f"{{ 172.30.1.1 . tcp . 80 : goto {local} }}"]
    assert rules_of(dump, local)[0] == (
        "ip daddr 172.30.1.1 tcp dport 80 ip saddr != 10.0.0.0/8 jump mark-for-masquerade"
    )
    assert "service-" + N.hash8("ns1/svc1/tcp/p80") not in dump


def test_internal_traffic_policy_local_without_local_endpoints_drops() -> None:
    h = Harness(
        [
            node_obj(),
            service("ns1", "svc1", "172.30.1.1", [port()], internalTrafficPolicy="Local"),
            endpoint_slice("ns1", "svc1", [ep("10.0.1.2", "host1")]),
        ]
    )
    r = h.sync()
    assert elements_of(h.dump(), "no-endpoint-services") == [
        '{ 172.30.1.1 . tcp . 80 comment "ns1/svc1:p80" : drop }'
    ]
    assert r.plans[0].no_local_endpoints == {"internal": 1, "external": 0}


def test_upstream_load_balancer_source_ranges_allow_the_node() -> None:
    """TestLoadBalancer: the source ranges include the node IP, so the LB IPs are allowed as
    sources too; NodePorts are not subject to the ranges."""
    h = Harness(render_kit.lb_source_ranges_objects(node_obj()))
    assert_golden("upstream-loadbalancer", h.sync())
    dump = h.dump()
    fw = "firewall-ULMVA6XW-ns1/svc1/tcp/p80"
    assert rules_of(dump, fw) == [
        "ip saddr != { 192.168.0.0/24 , 203.0.113.0/25 , 1.2.3.4 , 5.6.7.8 } drop"
    ]
    assert elements_of(dump, "firewall-ips") == [
        f"{{ 1.2.3.4 . tcp . 80 : goto {fw} }}",
        f"{{ 5.6.7.8 . tcp . 80 : goto {fw} }}",
    ]
    assert elements_of(dump, "service-nodeports") == [
        "{ tcp . 3001 : goto external-ULMVA6XW-ns1/svc1/tcp/p80 }"
    ]


def test_source_ranges_without_the_node_ip_do_not_allow_the_vips() -> None:
    h = Harness(
        [
            node_obj(),
            svc1(
                "LoadBalancer",
                ports=[port()],
                loadBalancerSourceRanges=["203.0.113.0/25"],
                ingress=["1.2.3.4"],
            ),
            endpoint_slice("ns1", "svc1", [ep("10.180.0.1")]),
        ]
    )
    h.sync()
    assert rules_of(h.dump(), "firewall-ULMVA6XW-ns1/svc1/tcp/p80") == [
        "ip saddr != { 203.0.113.0/25 } drop"
    ]


def test_upstream_ipv6_nodeports_on_every_address() -> None:
    """TestNodePorts "ipv6" (no nodePortAddresses at the proxier, i.e. ::/0 in the config):
    fib daddr type local, never ::1."""
    h = Harness(
        [
            node_obj(),
            service("ns1", "svc1", "fd00:172:30::41", [port(node_port=3001)], type="NodePort"),
            endpoint_slice(
                "ns1",
                "svc1",
                [ep("fd00:10:180::1"), ep("fd00:10:180::2:1", NODE)],
                family="IPv6",
            ),
        ],
        {"mode": "nftables", "clusterCIDR": "fd00:10::/64", "nodePortAddresses": ["::/0"]},
        families=(V6,),
    )
    assert_golden("upstream-ipv6-nodeports", h.sync())
    dump = h.dump(V6)
    assert (
        "add rule ip6 kube-proxy services fib daddr type local ip6 daddr != ::1"
        " meta l4proto . th dport vmap @service-nodeports"
    ) in dump
    assert (
        "add rule ip6 kube-proxy nodeport-endpoints-check ip6 daddr != ::1"
        " meta l4proto . th dport vmap @no-endpoint-nodeports"
    ) in dump
    assert "nodeport-ips" not in dump
    ep_chain = "endpoint-" + N.hash8("ns1/svc1/tcp/p80__fd00.10.180..2.1/80")
    assert f"add rule ip6 kube-proxy {ep_chain}-ns1/svc1/tcp/p80__fd00.10.180..2.1/80" in dump
    assert "meta l4proto tcp dnat to [fd00:10:180::2:1]:80" in dump
    masq = "ip6 daddr fd00:172:30::41 tcp dport 80 ip6 saddr != fd00:10::/64"
    masq += " jump mark-for-masquerade"
    assert masq in dump
    assert "add element ip6 kube-proxy cluster-ips { fd00:172:30::41 }" in dump
    # The IPv6 ServiceCIDR drop rule.
    assert "ip6 daddr { fd00:10:96::/112 } drop" in dump


def test_upstream_cluster_ip_general() -> None:
    """TestClusterIPGeneral: TCP, UDP and SCTP ports of one Service share its cluster-ips
    element; each port has its own service-ips element and chain."""
    ports = [
        port(80, "http"),
        port(443, "https"),
        port(53, "dns-udp", "UDP"),
        port(53, "dns-tcp"),
        port(53, "dns-sctp", "SCTP"),
    ]
    slice_ports = [
        port(80, "http"),
        port(8443, "https"),
        port(53, "dns-udp", "UDP"),
        port(5353, "dns-tcp"),
        port(53, "dns-sctp", "SCTP"),
    ]
    h = Harness(
        [
            node_obj(),
            service("ns2", "svc2", "172.30.0.42", ports),
            endpoint_slice(
                "ns2", "svc2", [ep("10.180.0.1", NODE), ep("10.180.2.1", "node2")], slice_ports
            ),
        ]
    )
    assert_golden("upstream-cluster-ip-general", h.sync())
    dump = h.dump()
    assert elements_of(dump, "cluster-ips") == ["{ 172.30.0.42 }"]
    assert sorted(elements_of(dump, "service-ips")) == sorted(
        f"{{ 172.30.0.42 . {proto} . {p} : goto service-{N.hash8(f'ns2/svc2/{proto}/{name}')}"
        f"-ns2/svc2/{proto}/{name} }}"
        for proto, p, name in [
            ("tcp", 80, "http"),
            ("tcp", 443, "https"),
            ("udp", 53, "dns-udp"),
            ("tcp", 53, "dns-tcp"),
            ("sctp", 53, "dns-sctp"),
        ]
    )
    assert "meta l4proto tcp dnat to 10.180.2.1:5353" in dump
    assert "meta l4proto sctp dnat to 10.180.0.1:53" in dump
    assert "meta l4proto udp dnat to 10.180.0.1:53" in dump
    # Removing one port keeps the shared cluster-ips element.
    h.feed([service("ns2", "svc2", "172.30.0.42", ports[:-1])])
    r = h.sync()
    assert elements_of(h.dump(), "cluster-ips") == ["{ 172.30.0.42 }"]
    assert "delete element ip kube-proxy cluster-ips { 172.30.0.42 }" not in lines_of(r)
    # Removing the Service removes it.
    h.cluster.delete_service("ns2", "svc2")
    r = h.sync()
    assert "delete element ip kube-proxy cluster-ips { 172.30.0.42 }" in lines_of(r)
    assert elements_of(h.dump(), "cluster-ips") == []


READY = {"ready": True, "serving": True, "terminating": False}


TERMINATING = {"ready": False, "serving": True, "terminating": True}


GONE = {"ready": False, "serving": False, "terminating": True}


def terminating_objects(policy: str, endpoints: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return render_kit.terminating_objects(node_obj(), policy, endpoints)


@pytest.mark.parametrize(
    ("golden", "policy", "endpoints", "local", "cluster"),
    [
        (
            "upstream-terminating-local-ready",
            "Local",
            [
                ep("10.0.1.1", NODE, **READY),
                ep("10.0.1.2", NODE, **READY),
                ep("10.0.1.3", NODE, **TERMINATING),
                ep("10.0.1.4", NODE, **GONE),
                ep("10.0.1.5", "host-1", **READY),
            ],
            ["10.0.1.1", "10.0.1.2"],
            ["10.0.1.1", "10.0.1.2", "10.0.1.5"],
        ),
        (
            "upstream-terminating-local-only-terminating",
            "Local",
            [
                ep("10.0.1.2", NODE, **TERMINATING),
                ep("10.0.1.3", NODE, **TERMINATING),
                ep("10.0.1.4", NODE, **GONE),
                ep("10.0.1.5", "host-1", **READY),
            ],
            ["10.0.1.2", "10.0.1.3"],
            ["10.0.1.5"],
        ),
        (
            "upstream-terminating-cluster-only-terminating",
            "Cluster",
            [
                ep("10.0.1.2", NODE, **TERMINATING),
                ep("10.0.1.3", NODE, **TERMINATING),
                ep("10.0.1.4", "another-host", **GONE),
                ep("10.0.1.5", "another-host", **TERMINATING),
            ],
            None,
            ["10.0.1.2", "10.0.1.3", "10.0.1.5"],
        ),
    ],
)
def test_upstream_terminating_endpoints(
    golden: str,
    policy: str,
    endpoints: list[dict[str, Any]],
    local: list[str] | None,
    cluster: list[str],
) -> None:
    h = Harness(terminating_objects(policy, endpoints))
    assert_golden(golden, h.sync())
    dump = h.dump()
    base = N.hash8("ns1/svc1/tcp/") + "-ns1/svc1/tcp/"

    def targets(chain: str) -> list[str]:
        numgen = [r for r in rules_of(dump, chain) if r.startswith("numgen")]
        return [t.split("__")[1].split("/")[0] for t in re.findall(r"goto (\S+)", numgen[0])]

    assert targets("service-" + base) == cluster
    if local is not None:
        assert targets("local-" + base) == local
    # Affinity: one set per reachable endpoint, with upstream's timeout.
    sets = [ln for ln in dump.splitlines() if ln.startswith("add set ip kube-proxy affinity-")]
    assert len(sets) == len(set(cluster) | set(local or [])) and all(
        "timeout 10800s" in s for s in sets
    )


def test_session_affinity_rules_and_timeout_change() -> None:
    objs = [
        node_obj(),
        svc1(
            ports=[port()],
            sessionAffinity="ClientIP",
            sessionAffinityConfig={"clientIP": {"timeoutSeconds": 60}},
        ),
        endpoint_slice("ns1", "svc1", [ep("10.180.0.1"), ep("10.180.0.2")]),
    ]
    h = Harness(objs)
    h.sync()
    dump = h.dump()
    svc = "service-ULMVA6XW-ns1/svc1/tcp/p80"
    e1 = "5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"
    assert rules_of(dump, svc)[1] == f"ip saddr @affinity-{e1} goto endpoint-{e1}"
    assert rules_of(dump, f"endpoint-{e1}")[1] == f"update @affinity-{e1} {{ ip saddr }}"
    assert (
        f"add set ip kube-proxy affinity-{e1}"
        " { type ipv4_addr ; flags dynamic,timeout ; timeout 60s ; }" in dump
    )
    # A new timeout re-adds the sets (nothing else of the service changes).
    objs[1]["spec"]["sessionAffinityConfig"]["clientIP"]["timeoutSeconds"] = 120
    h.feed([objs[1]])
    r = h.sync()
    assert all(line.startswith("add set ") and "timeout 120s" in line for line in commands_of(r))
    assert len(commands_of(r)) == 2
    # Affinity off: the sets go, after the chains that used them are rewritten.
    del objs[1]["spec"]["sessionAffinity"], objs[1]["spec"]["sessionAffinityConfig"]
    h.feed([objs[1]])
    r = h.sync()
    cmds = commands_of(r)
    assert f"delete set ip kube-proxy affinity-{e1}" in cmds
    assert cmds.index(f"flush chain ip kube-proxy {svc}") < cmds.index(
        f"delete set ip kube-proxy affinity-{e1}"
    )
    assert "affinity-" not in h.dump()


def test_masquerade_all() -> None:
    h = Harness(
        [*overall_objects()[:2], overall_objects()[7]],
        {**UPSTREAM, "nftables": {"masqueradeAll": True}},
    )
    h.sync()
    assert rules_of(h.dump(), "service-ULMVA6XW-ns1/svc1/tcp/p80")[0] == (
        "ip daddr 172.30.0.41 tcp dport 80 jump mark-for-masquerade"
    )


def local_nodeport_objects() -> list[dict[str, Any]]:
    """A NodePort Service with Local policy and its one endpoint on this node."""
    return [
        node_obj(),
        svc1("NodePort", externalTrafficPolicy="Local"),
        endpoint_slice("ns1", "svc1", [ep("10.180.0.1", NODE)]),
    ]


@pytest.mark.parametrize(
    ("fields", "not_local", "local"),
    [
        ({"clusterCIDR": "10.0.0.0/8"}, "ip saddr != 10.0.0.0/8", "ip saddr 10.0.0.0/8"),
        (
            {"detectLocalMode": "BridgeInterface", "detectLocal": {"bridgeInterface": "cbr0"}},
            'iifname != "cbr0"',
            'iifname "cbr0"',
        ),
        (
            {
                "detectLocalMode": "InterfaceNamePrefix",
                "detectLocal": {"interfaceNamePrefix": "veth"},
            },
            'iifname != "veth*"',
            'iifname "veth*"',
        ),
    ],
)
def test_detect_local_modes(fields: dict[str, Any], not_local: str, local: str) -> None:
    h = Harness(local_nodeport_objects(), {"mode": "nftables", **fields})
    h.sync()
    dump = h.dump()
    assert rules_of(dump, "service-ULMVA6XW-ns1/svc1/tcp/p80")[0] == (
        f"ip daddr 172.30.0.41 tcp dport 80 {not_local} jump mark-for-masquerade"
    )
    assert rules_of(dump, "external-ULMVA6XW-ns1/svc1/tcp/p80")[0] == (
        f'{local} goto service-ULMVA6XW-ns1/svc1/tcp/p80 comment "short-circuit pod traffic"'
    )


def test_no_local_detector_means_no_masquerade_and_no_pod_short_circuit() -> None:
    h = Harness(local_nodeport_objects(), {"mode": "nftables"})
    h.sync()
    dump = h.dump()
    assert rules_of(dump, "service-ULMVA6XW-ns1/svc1/tcp/p80")[0].startswith("numgen")
    assert rules_of(dump, "external-ULMVA6XW-ns1/svc1/tcp/p80")[0].startswith("fib saddr")


@pytest.mark.parametrize(
    ("bit", "mark"), [(14, "0x00004000"), (0, "0x00000001"), (31, "0x80000000")]
)
def test_masquerade_bit(bit: int, mark: str) -> None:
    assert go_hex_mark(bit) == mark
    h = Harness([node_obj()], {**UPSTREAM, "nftables": {"masqueradeBit": bit}})
    h.sync()
    assert rules_of(h.dump(), "masquerading") == [
        f"mark and {mark} == 0 return",
        f"mark set mark xor {mark}",
        "masquerade fully-random",
    ]


def test_udp_service() -> None:
    h = Harness(
        [
            node_obj(),
            service("kube-system", "dns", "172.30.0.10", [port(53, "dns", "UDP")]),
            endpoint_slice("kube-system", "dns", [ep("10.180.0.9")], [port(53, "dns", "UDP")]),
        ]
    )
    h.sync()
    dump = h.dump()
    chain = "service-" + N.hash8("kube-system/dns/udp/dns") + "-kube-system/dns/udp/dns"
    assert elements_of(dump, "service-ips") == [f"{{ 172.30.0.10 . udp . 53 : goto {chain} }}"]
    assert "meta l4proto udp dnat to 10.180.0.9:53" in dump


def test_node_port_ips_are_among_the_nodes_own_addresses() -> None:
    """nftables reads no interface addresses: nodePortAddresses choose among the Node's (the
    rule itself is every mode's: tests/unit/test_nodeports.py)."""
    node = NodeInfo(NODE, addresses=("192.168.0.2", "192.168.1.2", "2001:db8::1"))

    def ips(addresses: list[str], family: IPFamily, on: NodeInfo = node) -> object:
        cfg = config({"mode": "nftables", "nodePortAddresses": addresses})
        return NftablesBackend(BackendContext(cfg, NODE)).settings(family, on).node_port_ips

    assert ips([], V4) == ("192.168.0.2",)  # the mode's default: "primary"
    assert ips(["primary"], V6) == ("2001:db8::1",)
    assert ips(["primary"], V6, NodeInfo(NODE, addresses=("192.168.0.2",))) is None
    assert ips(["0.0.0.0/0"], V4) is None
    assert ips(["192.168.0.0/16"], V4) == ("192.168.0.2", "192.168.1.2")
    assert ips(["192.168.0.0/16"], V6) is None  # no IPv6 CIDR: everywhere
    assert ips(["10.0.0.0/8"], V4) == ()  # matches nothing: no NodePorts


def test_localhost_never_gets_node_ports() -> None:
    s = FamilySettings(V4, node_port_ips=("127.0.0.1", "192.168.0.2"))
    text = "".join(setup_lines(s, recreate_base_chains=False))
    assert "add element ip kube-proxy nodeport-ips { 192.168.0.2 }" in text
    assert "127.0.0.1" not in text


def test_node_port_addresses_match_all_deletes_the_set() -> None:
    h = Harness([node_obj()], {**UPSTREAM, "nodePortAddresses": ["0.0.0.0/0"]})
    h.sync()
    dump = h.dump()
    assert "nodeport-ips" not in dump
    assert rules_of(dump, "services")[1] == (
        "fib daddr type local ip daddr != 127.0.0.0/8"
        " meta l4proto . th dport vmap @service-nodeports"
    )


def test_nftables_mode_defaults_node_port_addresses_to_primary() -> None:
    cfg = config({"mode": "nftables"})
    assert cfg.node_port_addresses == ("primary",)
