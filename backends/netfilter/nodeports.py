"""Which node addresses the IPVS mode binds NodePorts to; the nodePortAddresses rule every mode
shares is kubeplex.core.dataplane.nodeports."""

from __future__ import annotations

import ipaddress

from kubeplex.core.model.types import IPFamily, family_of


def usable_node_address(ip: str, family: IPFamily) -> bool:
    """Upstream's isValidForSet (IPVS netlink handle): of the family, not loopback, and for
    IPv6 not link-local."""
    if family_of(ip) is not family:
        return False
    addr = ipaddress.ip_address(ip)
    if addr.is_loopback:
        return False
    return not (family is IPFamily.IPv6 and addr.is_link_local)
