"""The namespace lab's specs and the address texts of its servers and clients, without bringing
a lab up (tests/kernel/test_netlab.py does)."""

from __future__ import annotations

import pytest
from kits.netlab_kit import CLIENT_IP6, EXTERNAL_IP6, small_spec

from kubeplex.testing.netclient import target_text
from kubeplex.testing.netlab import (
    CLIENT_POD,
    DEFAULT_SPEC,
    DUAL_STACK_SPEC,
    EXTERNAL,
    LAN,
    NODE1,
    NODE2,
    WEB_A,
    WEB_B,
    WEB_C,
    HostSpec,
    Lab,
    LabError,
    LabSpec,
    NodeSpec,
    PodSpec,
)
from kubeplex.testing.podserver import peer_text


def test_spec_validation() -> None:
    with pytest.raises(LabError, match="not a free host address"):
        LabSpec(
            nodes=(NodeSpec("n1", "172.18.0.5", "10.244.1.0/24"),),
            pods=(PodSpec("p1", "n1", "10.244.2.2"),),
        )
    with pytest.raises(LabError, match="duplicate names"):
        LabSpec(
            nodes=(NodeSpec("x", "172.18.0.5", "10.244.1.0/24"),),
            hosts=(HostSpec("x", "172.18.0.6"),),
        )
    with pytest.raises(LabError, match="reserved"):
        LabSpec(nodes=(NodeSpec(LAN, "172.18.0.5", "10.244.1.0/24"),))
    with pytest.raises(LabError, match="prefix"):
        Lab(small_spec(), "bad-prefix")


def test_default_spec_stays_ipv4_only() -> None:
    assert not DEFAULT_SPEC.dual_stack
    assert DEFAULT_SPEC.lan_cidr6 is None and DEFAULT_SPEC.lan_gateway6 is None
    assert all(n.host_ip6 is None and n.pod_cidr6 is None for n in DEFAULT_SPEC.nodes)
    assert all(p.ip6 is None for p in DEFAULT_SPEC.pods)
    assert all(h.ip6 is None for h in DEFAULT_SPEC.hosts)
    with pytest.raises(LabError, match="no IPv6 address"):
        DEFAULT_SPEC.ip_of(WEB_A, ipv6=True)


def test_dual_stack_spec_addresses() -> None:
    spec = DUAL_STACK_SPEC
    assert spec.dual_stack and spec.lan_cidr6 == "fd00:18::/64"
    assert spec.ip_of(NODE1, ipv6=True) == "fd00:18::5"
    assert spec.ip_of(NODE2, ipv6=True) == "fd00:18::4"
    assert spec.ip_of(EXTERNAL, ipv6=True) == EXTERNAL_IP6
    assert spec.ip_of(CLIENT_POD, ipv6=True) == CLIENT_IP6
    assert [spec.ip_of(p, ipv6=True) for p in (WEB_A, WEB_B, WEB_C)] == [
        "fd00:10:244:1::2",
        "fd00:10:244:2::2",
        "fd00:10:244:2::3",
    ]
    assert spec.node(NODE2).gateway6 == "fd00:10:244:2::1"
    # The IPv4 side is the default spec's, address for address.
    assert [spec.ip_of(n) for n in spec.names()] == [DEFAULT_SPEC.ip_of(n) for n in spec.names()]


def test_dual_stack_spec_validation() -> None:
    node = NodeSpec("n1", "172.18.0.5", "10.244.1.0/24", "fd00:18::5", "fd00:10:244:1::/64")
    v6 = {"lan_cidr6": "fd00:18::/64"}
    assert LabSpec(
        nodes=(node,), pods=(PodSpec("p1", "n1", "10.244.1.2", ip6="fd00:10:244:1::2"),), **v6
    )
    with pytest.raises(LabError, match="need lan_cidr6"):
        LabSpec(nodes=(node,))
    with pytest.raises(LabError, match=r"pod p1: needs an IPv6 address"):
        LabSpec(nodes=(node,), pods=(PodSpec("p1", "n1", "10.244.1.2"),), **v6)
    with pytest.raises(LabError, match=r"not a free host address of fd00:10:244:1::/64 \(::1"):
        LabSpec(
            nodes=(node,), pods=(PodSpec("p1", "n1", "10.244.1.2", ip6="fd00:10:244:1::1"),), **v6
        )
    with pytest.raises(LabError, match="not a free host address"):
        LabSpec(nodes=(node,), pods=(PodSpec("p1", "n1", "10.244.1.2", ip6="10.244.1.9"),), **v6)
    with pytest.raises(LabError, match="not a host address of lan fd00:18::/64"):
        LabSpec(nodes=(node,), hosts=(HostSpec("h1", "172.18.0.10", "fd00:19::10"),), **v6)
    with pytest.raises(LabError, match="duplicate IPv6 lan addresses"):
        LabSpec(nodes=(node,), hosts=(HostSpec("h1", "172.18.0.10", "fd00:18::5"),), **v6)
    with pytest.raises(LabError, match=r"lan_cidr6: .* is not an IPv6 network"):
        LabSpec(nodes=(node,), lan_cidr6="172.19.0.0/24")


def test_peer_and_target_text() -> None:
    assert peer_text(("10.244.1.3", 4000)) == "10.244.1.3:4000"  # IPv4 output unchanged
    assert peer_text(("fd00:10:244:1::3", 4000, 0, 0)) == "[fd00:10:244:1::3]:4000"
    assert peer_text(("::ffff:10.244.1.3", 4000, 0, 0)) == "10.244.1.3:4000"
    assert target_text("10.96.0.1", 80) == "10.96.0.1:80"
    assert target_text("[fd00:96::1]", 80) == target_text("fd00:96::1", 80) == "[fd00:96::1]:80"
