"""Chain names, byte-for-byte as upstream kube-proxy's iptables mode makes them.

``KUBE-SVC-`` + the first 16 characters of base32(sha256(servicePortName + protocol)), where
servicePortName prints as ``ns/name`` or ``ns/name:port``, and protocol is lower case; the
endpoint chain hashes the endpoint's ``ip:port`` on top. Operators grep for these names, so
they must not drift.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

from kubeplex.core.model import Endpoint, ServicePortName

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


_B32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
# Two base32 digits per 10 bits: the first 16 digits are exactly the first 80 bits (10 bytes).
_PAIRS = [a + b for a in _B32 for b in _B32]


@lru_cache(maxsize=1 << 18)
def _hash(text: str) -> str:
    """First 16 characters of base32(sha256(text)); base64.b32encode is too slow at 100k names."""
    v = int.from_bytes(hashlib.sha256(text.encode()).digest()[:10], "big")
    return "".join([_PAIRS[(v >> s) & 1023] for s in (70, 60, 50, 40, 30, 20, 10, 0)])


def _port_proto(spn: ServicePortName) -> str:
    return str(spn) + spn.protocol.lower()


def service_chain(spn: ServicePortName) -> str:
    return "KUBE-SVC-" + _hash(_port_proto(spn))


def local_service_chain(spn: ServicePortName) -> str:
    return "KUBE-SVL-" + _hash(_port_proto(spn))


def external_chain(spn: ServicePortName) -> str:
    return "KUBE-EXT-" + _hash(_port_proto(spn))


def firewall_chain(spn: ServicePortName) -> str:
    return "KUBE-FW-" + _hash(_port_proto(spn))


def endpoint_chain(spn: ServicePortName, ep: Endpoint) -> str:
    return "KUBE-SEP-" + _hash(_port_proto(spn) + ep.address)


def is_service_chain(name: str) -> bool:
    return name.startswith(SERVICE_CHAIN_PREFIXES)
