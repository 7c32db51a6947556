"""Which node addresses serve NodePorts (upstream's NodePortAddresses), for every mode, as a
function of the addresses seen."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from kubeplex.core.model.types import IPFamily, NodeInfo, family_of

#: nodePortAddresses' keyword for the Node's primary addresses (only ever alone: validated).
PRIMARY = "primary"


def node_port_ips(
    addresses: Sequence[str], node: NodeInfo, family: IPFamily, local: Sequence[str]
) -> tuple[str, ...] | None:
    """Upstream's NodePortAddresses for one family (pkg/proxy/util, with cmd/kube-proxy's
    "primary"), the same in every mode: None means every local address (MatchAll: no CIDR of
    the family, or one of prefix 0); else the addresses of ``local`` in the family's CIDRs,
    by CIDR. "primary" stands for the Node's first address of each family as a /32 or /128,
    unless it is loopback, so a family without one serves NodePorts everywhere.

    ``local``: the node's addresses to choose from, where the mode reads them (its
    interfaces' addresses; a mode that does not read them passes the Node's own).
    """
    entries = list(addresses)
    if entries == [PRIMARY]:
        entries = [
            f"{ip}/{32 if fam is IPFamily.IPv4 else 128}"
            for fam in (IPFamily.IPv4, IPFamily.IPv6)
            for ip in node.addresses_of(fam)[:1]
            if not ipaddress.ip_address(ip).is_loopback
        ]
    nets = [
        ipaddress.ip_network(e, strict=False)
        for e in entries
        if e != PRIMARY and family_of(e) is family
    ]
    if not nets or any(n.prefixlen == 0 for n in nets):
        return None
    mine = [ip for ip in dict.fromkeys(local) if family_of(ip) is family]
    return tuple(
        dict.fromkeys(ip for net in nets for ip in mine if ipaddress.ip_address(ip) in net)
    )
