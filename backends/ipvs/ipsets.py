"""Upstream's ipsets of the IPVS mode: names, types, comments and entry syntax.

Mirrors pkg/proxy/ipvs/ipset.go (the names and comments), the ``ipsetInfo`` table of
pkg/proxy/ipvs/proxier.go (the types) and ``Entry.String`` of pkg/proxy/ipvs/ipset (the
entries). IPv6 sets are named with ``KUBE-6-`` instead of ``KUBE-`` and cut to ipset's 31
characters, as upstream's NewIPSet does.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from types import MappingProxyType

from kubeplex.backends.ipvs.plan import IpsetSpec
from kubeplex.core.model.types import IPFamily

LOOP_BACK = "KUBE-LOOP-BACK"
CLUSTER_IP = "KUBE-CLUSTER-IP"
EXTERNAL_IP = "KUBE-EXTERNAL-IP"
EXTERNAL_IP_LOCAL = "KUBE-EXTERNAL-IP-LOCAL"
LOAD_BALANCER = "KUBE-LOAD-BALANCER"
LOAD_BALANCER_LOCAL = "KUBE-LOAD-BALANCER-LOCAL"
LOAD_BALANCER_FW = "KUBE-LOAD-BALANCER-FW"
LOAD_BALANCER_SOURCE_IP = "KUBE-LOAD-BALANCER-SOURCE-IP"
LOAD_BALANCER_SOURCE_CIDR = "KUBE-LOAD-BALANCER-SOURCE-CIDR"
NODE_PORT_TCP = "KUBE-NODE-PORT-TCP"
NODE_PORT_LOCAL_TCP = "KUBE-NODE-PORT-LOCAL-TCP"
NODE_PORT_UDP = "KUBE-NODE-PORT-UDP"
NODE_PORT_LOCAL_UDP = "KUBE-NODE-PORT-LOCAL-UDP"
NODE_PORT_SCTP = "KUBE-NODE-PORT-SCTP-HASH"
NODE_PORT_LOCAL_SCTP = "KUBE-NODE-PORT-LOCAL-SCTP-HASH"
HEALTH_CHECK_NODE_PORT = "KUBE-HEALTH-CHECK-NODE-PORT"
IPVS_IPS = "KUBE-IPVS-IPS"

HASH_IP_PORT = "hash:ip,port"
HASH_IP_PORT_IP = "hash:ip,port,ip"
HASH_IP_PORT_NET = "hash:ip,port,net"
HASH_IP = "hash:ip"
BITMAP_PORT = "bitmap:port"

#: Upstream's ipsetInfo, in its order: base (IPv4) name -> (type, comment).
SETS: MappingProxyType[str, tuple[str, str]] = MappingProxyType(
    {
        LOOP_BACK: (
            HASH_IP_PORT_IP,
            "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose",
        ),
        CLUSTER_IP: (HASH_IP_PORT, "Kubernetes service cluster ip + port for masquerade purpose"),
        EXTERNAL_IP: (
            HASH_IP_PORT,
            "Kubernetes service external ip + port for masquerade and filter purpose",
        ),
        EXTERNAL_IP_LOCAL: (
            HASH_IP_PORT,
            "Kubernetes service external ip + port with externalTrafficPolicy=local",
        ),
        LOAD_BALANCER: (HASH_IP_PORT, "Kubernetes service lb portal"),
        LOAD_BALANCER_FW: (
            HASH_IP_PORT,
            "Kubernetes service load balancer ip + port for load balancer with sourceRange",
        ),
        LOAD_BALANCER_LOCAL: (
            HASH_IP_PORT,
            "Kubernetes service load balancer ip + port with externalTrafficPolicy=local",
        ),
        LOAD_BALANCER_SOURCE_IP: (
            HASH_IP_PORT_IP,
            "Kubernetes service load balancer ip + port + source IP for packet filter purpose",
        ),
        LOAD_BALANCER_SOURCE_CIDR: (
            HASH_IP_PORT_NET,
            "Kubernetes service load balancer ip + port + source cidr for packet filter purpose",
        ),
        NODE_PORT_TCP: (BITMAP_PORT, "Kubernetes nodeport TCP port for masquerade purpose"),
        NODE_PORT_LOCAL_TCP: (
            BITMAP_PORT,
            "Kubernetes nodeport TCP port with externalTrafficPolicy=local",
        ),
        NODE_PORT_UDP: (BITMAP_PORT, "Kubernetes nodeport UDP port for masquerade purpose"),
        NODE_PORT_LOCAL_UDP: (
            BITMAP_PORT,
            "Kubernetes nodeport UDP port with externalTrafficPolicy=local",
        ),
        NODE_PORT_SCTP: (
            HASH_IP_PORT,
            "Kubernetes nodeport SCTP port for masquerade purpose with type 'hash ip:port'",
        ),
        NODE_PORT_LOCAL_SCTP: (
            HASH_IP_PORT,
            "Kubernetes nodeport SCTP port with externalTrafficPolicy=local with type"
            " 'hash ip:port'",
        ),
        HEALTH_CHECK_NODE_PORT: (BITMAP_PORT, "Kubernetes health check node port"),
        IPVS_IPS: (HASH_IP, "Addresses on the ipvs interface"),
    }
)

#: ipset's longest set name (IPSET_MAXNAMELEN - 1).
NAME_MAX = 31


def set_name(base: str, family: IPFamily) -> str:
    """The set's name in ``family``: ``KUBE-6-...`` for IPv6, cut to 31 characters."""
    if family is IPFamily.IPv6 and base.startswith("KUBE-"):
        return ("KUBE-6-" + base[len("KUBE-") :])[:NAME_MAX]
    return base


def specs(family: IPFamily) -> dict[str, IpsetSpec]:
    """Every set of the mode in ``family``, by its name there (upstream creates them all)."""
    out = {}
    for base, (kind, comment) in SETS.items():
        name = set_name(base, family)
        out[name] = IpsetSpec(name, kind, family, comment)
    return out


@cache
def names(family: IPFamily) -> Mapping[str, str]:
    """Base name -> the name in ``family``."""
    return MappingProxyType({base: set_name(base, family) for base in SETS})


def is_ours(name: str) -> bool:
    """Whether a set of this name belongs to the mode (either family)."""
    return name in SETS or name in _V6_NAMES


_V6_NAMES = frozenset(set_name(b, IPFamily.IPv6) for b in SETS)


# --- entries, as Entry.String() writes them ------------------------------------------------


def ip_port(ip: str, proto: str, port: int) -> str:
    """hash:ip,port: ``10.96.0.10,tcp:53`` (IPv6 unbracketed, as upstream)."""
    return f"{ip},{proto}:{port}"


def ip_port_ip(ip: str, proto: str, port: int, ip2: str) -> str:
    """hash:ip,port,ip: ``10.244.1.2,tcp:8080,10.244.1.2``."""
    return f"{ip},{proto}:{port},{ip2}"


def ip_port_net(ip: str, proto: str, port: int, net: str) -> str:
    """hash:ip,port,net: ``1.2.3.4,tcp:80,203.0.113.0/25``."""
    return f"{ip},{proto}:{port},{net}"


def bitmap_port(port: int) -> str:
    """bitmap:port: ``30080``."""
    return str(port)
