"""Object names, byte for byte as upstream kube-proxy's nftables mode makes them.

Everything lives in one table per family (``ip kube-proxy``, ``ip6 kube-proxy``), so the fixed
names need no prefix. Per-service chains are ``<kind>-`` + a base made by upstream's
``hashAndTruncate``: the first 8 characters of base32(sha256(text)), "-", then the text itself,
where the text is ``ns/name/proto/portname`` (``default/web/tcp/`` for an unnamed port), and
``ns/name/proto/portname__ip/port`` for an endpoint (an IPv6 endpoint's colons become dots,
which nft names cannot hold). Operators grep for these names, so they must not drift.
"""

from __future__ import annotations

from kubeplex.backends.netfilter.hashing import BASE_LENGTH_MAX as BASE_LENGTH_MAX
from kubeplex.backends.netfilter.hashing import NAME_LENGTH_MAX as NAME_LENGTH_MAX
from kubeplex.backends.netfilter.hashing import cached_base as cached_base
from kubeplex.backends.netfilter.hashing import hash8 as hash8
from kubeplex.backends.netfilter.hashing import hash_and_truncate as hash_and_truncate
from kubeplex.core.model.types import Endpoint, ServicePortName

TABLE = "kube-proxy"

# Base chains: "<type>-<hook>" (upstream's filter-*-pre-dnat run before DNAT).
FILTER_PREROUTING_PRE_DNAT = "filter-prerouting-pre-dnat"
FILTER_OUTPUT_PRE_DNAT = "filter-output-pre-dnat"
FILTER_INPUT = "filter-input"
FILTER_FORWARD = "filter-forward"
FILTER_OUTPUT = "filter-output"
NAT_PREROUTING = "nat-prerouting"
NAT_OUTPUT = "nat-output"
NAT_POSTROUTING = "nat-postrouting"

# Service dispatch.
SERVICES = "services"
SERVICE_IPS = "service-ips"
SERVICE_NODEPORTS = "service-nodeports"
NODEPORT_IPS = "nodeport-ips"
CLUSTER_IPS = "cluster-ips"

# Services without (usable) endpoints.
SERVICE_ENDPOINTS_CHECK = "service-endpoints-check"
NODEPORT_ENDPOINTS_CHECK = "nodeport-endpoints-check"
NO_ENDPOINT_SERVICES = "no-endpoint-services"
NO_ENDPOINT_NODEPORTS = "no-endpoint-nodeports"
REJECT_CHAIN = "reject-chain"

# Unused ports of ClusterIPs, unallocated addresses of the service CIDRs.
CLUSTER_IPS_CHECK = "cluster-ips-check"

# loadBalancerSourceRanges.
FIREWALL_IPS = "firewall-ips"
FIREWALL_CHECK = "firewall-check"

# Masquerading.
MARK_MASQ = "mark-for-masquerade"
MASQUERADING = "masquerading"

# Per-service prefixes.
SERVICE_PREFIX = "service-"
LOCAL_PREFIX = "local-"
EXTERNAL_PREFIX = "external-"
FIREWALL_PREFIX = "firewall-"
ENDPOINT_PREFIX = "endpoint-"
AFFINITY_PREFIX = "affinity-"


def port_text(spn: ServicePortName) -> str:
    """``ns/name/proto/portname``: what a service port's chains are named after."""
    return f"{spn.namespace}/{spn.name}/{spn.protocol.lower()}/{spn.port}"


def endpoint_text(port_text: str, ip: str, port: int) -> str:
    """``ns/name/proto/portname__ip/port`` (an IPv6 address with dots for colons)."""
    if ":" in ip:
        ip = ip.replace(":", ".")
    return f"{port_text}__{ip}/{port}"


def service_base(spn: ServicePortName) -> str:
    """``HASH-ns/name/proto/port``, e.g. ``ULMVA6XW-ns1/svc1/tcp/p80``."""
    return cached_base(port_text(spn))


def endpoint_base(spn: ServicePortName, ep: Endpoint) -> str:
    """``HASH-ns/name/proto/port__ip/port``, e.g. ``5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80``."""
    return cached_base(endpoint_text(port_text(spn), ep.ip, ep.port))


def service_chain(spn: ServicePortName) -> str:
    """The chain of the Cluster traffic policy (upstream's clusterPolicyChainName)."""
    return SERVICE_PREFIX + service_base(spn)


def local_chain(spn: ServicePortName) -> str:
    return LOCAL_PREFIX + service_base(spn)


def external_chain(spn: ServicePortName) -> str:
    return EXTERNAL_PREFIX + service_base(spn)


def firewall_chain(spn: ServicePortName) -> str:
    return FIREWALL_PREFIX + service_base(spn)


def endpoint_chain(spn: ServicePortName, ep: Endpoint) -> str:
    return ENDPOINT_PREFIX + endpoint_base(spn, ep)


def affinity_set(spn: ServicePortName, ep: Endpoint) -> str:
    return AFFINITY_PREFIX + endpoint_base(spn, ep)


def is_service_chain(name: str) -> bool:
    """Per-service chains always hold a "/"; none of the fixed chains does (upstream's test)."""
    return "/" in name


def is_affinity_set(name: str) -> bool:
    return name.startswith(AFFINITY_PREFIX)
