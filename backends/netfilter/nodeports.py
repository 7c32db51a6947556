"""Which node addresses serve NodePorts (upstream's NodePortAddresses), for every netfilter
mode: the same decision the iptables mode makes, as a function of the addresses seen."""

from __future__ import annotations

import ipaddress

from kubeplex.core.model.types import IPFamily, NodeInfo, family_of


def node_port_ips(
    addresses: tuple[str, ...], node: NodeInfo, family: IPFamily, local: tuple[str, ...]
) -> tuple[str, ...] | None:
    """nodePortAddresses for one family: None means every local address (upstream's
    MatchAll), else the local addresses in the configured CIDRs ("primary": the Node's
    first address of the family)."""
    mine = [a for a in addresses if a == "primary" or family_of(a) is family]
    if not mine:
        return None
    ips: list[str] = []
    for entry in mine:
        if entry == "primary":
            ips += node.addresses_of(family)[:1]
            continue
        net = ipaddress.ip_network(entry, strict=False)
        if net.prefixlen == 0:
            return None
        ips += [ip for ip in local if family_of(ip) is family and ipaddress.ip_address(ip) in net]
    return tuple(dict.fromkeys(ips))


def usable_node_address(ip: str, family: IPFamily) -> bool:
    """Upstream's isValidForSet (IPVS netlink handle): of the family, not loopback, and for
    IPv6 not link-local."""
    if family_of(ip) is not family:
        return False
    addr = ipaddress.ip_address(ip)
    if addr.is_loopback:
        return False
    return not (family is IPFamily.IPv6 and addr.is_link_local)
