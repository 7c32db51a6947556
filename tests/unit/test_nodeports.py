"""nodePortAddresses, one rule for every mode (core/dataplane/nodeports.py), as upstream's
NodePortAddresses with cmd/kube-proxy's "primary"; the modes differ only in the addresses
they choose from (the iptables and ipvs modes read the interfaces', nftables the Node's)."""

from __future__ import annotations

from kubeplex.core.dataplane.nodeports import node_port_ips
from kubeplex.core.model.types import IPFamily, NodeInfo

V4, V6 = IPFamily.IPv4, IPFamily.IPv6
NODE = NodeInfo("node-a", addresses=("192.168.0.2", "192.168.1.2", "2001:db8::1"))
V4_ONLY = NodeInfo("node-a", addresses=("192.168.0.2",))
#: The node's interfaces: the Node's addresses and others.
LOCAL = ("10.0.0.9", "192.168.1.2", "127.0.0.1", "192.168.0.2", "2001:db8::1", "fe80::1")


def test_no_cidr_of_the_family_or_one_of_prefix_zero_means_every_local_address() -> None:
    assert node_port_ips([], NODE, V4, LOCAL) is None
    assert node_port_ips(["0.0.0.0/0", "10.0.0.0/8"], NODE, V4, LOCAL) is None
    assert node_port_ips(["192.168.0.0/16"], NODE, V6, LOCAL) is None


def test_the_local_addresses_in_the_cidrs_in_the_order_of_the_cidrs() -> None:
    got = node_port_ips(["10.0.0.0/8", "192.168.0.0/16", "127.0.0.0/8"], NODE, V4, LOCAL)
    assert got == ("10.0.0.9", "192.168.1.2", "192.168.0.2", "127.0.0.1")
    assert node_port_ips(["172.16.0.0/12"], NODE, V4, LOCAL) == ()  # none: no NodePorts
    assert node_port_ips(["fe80::/10", "2001:db8::/64"], NODE, V6, LOCAL) == (
        "fe80::1",
        "2001:db8::1",
    )


def test_primary_is_the_nodes_first_address_of_each_family_where_it_is_local() -> None:
    assert node_port_ips(["primary"], NODE, V4, LOCAL) == ("192.168.0.2",)
    assert node_port_ips(["primary"], NODE, V6, LOCAL) == ("2001:db8::1",)
    # A primary address on no interface serves nothing (upstream: a /32 no local one is in).
    assert node_port_ips(["primary"], NODE, V4, ("10.0.0.9",)) == ()


def test_primary_without_an_address_of_the_family_serves_it_everywhere() -> None:
    assert node_port_ips(["primary"], V4_ONLY, V6, LOCAL) is None
    loopback = NodeInfo("node-a", addresses=("127.0.0.1", "::1"))
    assert node_port_ips(["primary"], loopback, V4, LOCAL) is None
