"""Everything the IPVS render depends on besides the graph, as one frozen value per family.

A renderer made for one ``IpvsSettings`` re-renders everything when they change (a node
address, a config value): every cached service contribution may depend on them.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from kubeplex.backends.netfilter.marks import masquerade_mark
from kubeplex.backends.netfilter.nodeports import usable_node_address
from kubeplex.core.config.kubeproxy import KubeProxyConfiguration
from kubeplex.core.config.localdetect import LocalDetector, local_detector
from kubeplex.core.dataplane.nodeports import node_port_ips
from kubeplex.core.model.types import IPFamily, NodeInfo, family_of

#: Upstream's defaultScheduler.
DEFAULT_SCHEDULER = "rr"

#: Scheduler flags upstream sets per scheduler: FlagSourceHash (0x10, IP_VS_SVC_F_SCHED2,
#: ipvsadm's ``flag-2``) for ``mh``, so Maglev hashes the source port too.
SCHEDULER_FLAGS: dict[str, tuple[str, ...]] = {"mh": ("flag-2",)}


@dataclass(frozen=True)
class IpvsSettings:
    family: IPFamily
    scheduler: str = DEFAULT_SCHEDULER
    #: The masquerade mark as upstream writes it (``0x00004000``).
    masquerade_mark: str = "0x00004000"
    masquerade_all: bool = False
    local: LocalDetector = field(default_factory=LocalDetector)
    #: The Node's own IP of this family (upstream's nodeIP): a loadBalancerSourceRange that
    #: holds it lets the node reach the LB IP; "" if the Node has none.
    node_ip: str = ""
    #: Where NodePort virtual services listen (empty: no NodePort virtual service).
    node_port_ips: tuple[str, ...] = ()
    #: The node's addresses on other interfaces than kube-ipvs0: an externalIP or LB IP that
    #: is one of them is not bound to the dummy link (upstream's nodeAddressSet).
    local_addresses: frozenset[str] = frozenset()
    #: ipvs.excludeCIDRs of this family: virtual services there are never deleted (apply's).
    exclude_cidrs: tuple[str, ...] = ()

    @property
    def ipv6(self) -> bool:
        return self.family is IPFamily.IPv6

    @property
    def flags(self) -> tuple[str, ...]:
        return SCHEDULER_FLAGS.get(self.scheduler, ())


def ipvs_settings(
    cfg: KubeProxyConfiguration,
    node: NodeInfo,
    family: IPFamily,
    interface_addresses: tuple[str, ...] | None = None,
) -> IpvsSettings:
    """One family's settings from the configuration, the Node, and the node's interface
    addresses but kube-ipvs0's (the seam's ``interface_addresses``; None: the Node's
    addresses, so a render without a kernel still has NodePorts)."""
    seen = node.addresses if interface_addresses is None else interface_addresses
    local = tuple(dict.fromkeys(a for a in seen if usable_node_address(a, family)))
    wanted = node_port_ips(tuple(cfg.node_port_addresses), node, family, seen)
    if wanted is None:  # every address: upstream's nodeAddressSet (no loopback, no fe80::)
        ports = local
    else:  # the configured CIDRs' addresses, loopback left out (upstream's GetNodeIPs)
        ports = tuple(a for a in wanted if not ipaddress.ip_address(a).is_loopback)
    return IpvsSettings(
        family=family,
        scheduler=cfg.ipvs.scheduler or DEFAULT_SCHEDULER,
        masquerade_mark=masquerade_mark(cfg.iptables.masquerade_bit),
        masquerade_all=cfg.iptables.masquerade_all,
        local=local_detector(cfg, node, family),
        node_ip=next(iter(node.addresses_of(family)), ""),
        node_port_ips=ports,
        local_addresses=frozenset(local),
        exclude_cidrs=tuple(str(c) for c in cfg.ipvs.exclude_cidrs if family_of(str(c)) is family),
    )
