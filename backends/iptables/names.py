"""Chain names, byte-for-byte as upstream kube-proxy's iptables mode makes them.

``KUBE-SVC-`` + the first 16 characters of base32(sha256(servicePortName + protocol)), where
servicePortName prints as ``ns/name`` or ``ns/name:port``, and protocol is lower case; the
endpoint chain hashes the endpoint's ``ip:port`` on top. Operators grep for these names, so
they must not drift.
"""

from __future__ import annotations

from kubeplex.backends.netfilter.hashing import hash16
from kubeplex.core.model.types import Endpoint, ServicePortName

# Fixed chains.
SERVICES = "KUBE-SERVICES"
EXTERNAL_SERVICES = "KUBE-EXTERNAL-SERVICES"
NODEPORTS = "KUBE-NODEPORTS"
POSTROUTING = "KUBE-POSTROUTING"
MARK_MASQ = "KUBE-MARK-MASQ"
FORWARD = "KUBE-FORWARD"
PROXY_FIREWALL = "KUBE-PROXY-FIREWALL"
CANARY = "KUBE-PROXY-CANARY"

#: Per-service chain prefixes; a nat chain with one of these is ours to delete when unused.
SERVICE_CHAIN_PREFIXES = ("KUBE-SVC-", "KUBE-SVL-", "KUBE-EXT-", "KUBE-FW-", "KUBE-SEP-")


def _port_proto(spn: ServicePortName) -> str:
    return str(spn) + spn.protocol.lower()


def service_chain(spn: ServicePortName) -> str:
    return "KUBE-SVC-" + hash16(_port_proto(spn))


def local_service_chain(spn: ServicePortName) -> str:
    return "KUBE-SVL-" + hash16(_port_proto(spn))


def external_chain(spn: ServicePortName) -> str:
    return "KUBE-EXT-" + hash16(_port_proto(spn))


def firewall_chain(spn: ServicePortName) -> str:
    return "KUBE-FW-" + hash16(_port_proto(spn))


def endpoint_chain(spn: ServicePortName, ep: Endpoint) -> str:
    return "KUBE-SEP-" + hash16(_port_proto(spn) + ep.address)


def is_service_chain(name: str) -> bool:
    return name.startswith(SERVICE_CHAIN_PREFIXES)
