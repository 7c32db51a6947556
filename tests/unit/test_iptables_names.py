"""iptables chain names: byte-for-byte upstream's hashes (pure, no root).

Upstream reference: pkg/proxy/iptables/proxier.go (portProtoHash, servicePortEndpointChainName):
``KUBE-SVC-`` + base32(sha256(servicePortName.String() + lower(protocol)))[:16], and the
endpoint chain hashes ``ip:port`` (``[ip]:port`` for IPv6) on top. Expected names come from the
seed article (a kind cluster's iptables-save) and from upstream's proxier_test.go.
"""

from __future__ import annotations

import base64
import hashlib

import pytest

from kubeplex.backends.iptables import names
from kubeplex.core.model.types import Endpoint, Protocol, ServicePortName

WEB = ServicePortName("default", "web")
WEB_NODEPORT = ServicePortName("default", "web-nodeport")


def _independent_hash(text: str) -> str:
    """The hash as the docstring above describes it, written out separately from names.py."""
    return base64.b32encode(hashlib.sha256(text.encode()).digest()).decode()[:16]


# --- the seed lab's names (iptables-save on deepdive-kubeproxy-worker) ------------------------


def test_seed_service_chains() -> None:
    assert names.service_chain(WEB) == "KUBE-SVC-LOLE4ISW44XBNF3G"
    assert names.service_chain(WEB_NODEPORT) == "KUBE-SVC-GCYSPZR5VVR6P7RM"
    assert names.external_chain(WEB_NODEPORT) == "KUBE-EXT-GCYSPZR5VVR6P7RM"


@pytest.mark.parametrize(
    ("ip", "chain"),
    [
        ("10.244.1.2", "KUBE-SEP-PXJ2U7QYT2QW5545"),
        ("10.244.2.2", "KUBE-SEP-5Q3P56IRA2PP7VYF"),
        ("10.244.2.3", "KUBE-SEP-G2TK3RG32KUOAWKQ"),
    ],
)
def test_seed_endpoint_chains(ip: str, chain: str) -> None:
    assert names.endpoint_chain(WEB, Endpoint(ip, 8080)) == chain


def test_same_endpoint_of_another_service_gets_another_chain() -> None:
    ep = Endpoint("10.244.1.2", 8080)
    assert names.endpoint_chain(WEB_NODEPORT, ep) != names.endpoint_chain(WEB, ep)


def test_all_per_service_chains_share_one_hash() -> None:
    suffix = "GCYSPZR5VVR6P7RM"
    assert names.local_service_chain(WEB_NODEPORT) == f"KUBE-SVL-{suffix}"
    assert names.firewall_chain(WEB_NODEPORT) == f"KUBE-FW-{suffix}"


# --- names from upstream's proxier_test.go ----------------------------------------------------


@pytest.mark.parametrize(
    ("spn", "suffix"),
    [
        (ServicePortName("ns1", "svc1", "p80"), "XPGD46QRK7WJZT7O"),
        (ServicePortName("ns2", "svc2", "p80"), "GNZBNJ2PO5MGZ6GT"),
        (ServicePortName("ns3", "svc3", "p80"), "X27LE4BHSL4DOUIK"),
        (ServicePortName("ns4", "svc4", "p80"), "4SW47YFZTEDKD3PK"),
        (ServicePortName("ns5", "svc5", "p80"), "NUKIZ6OKUXPJNT4C"),
        # An unnamed port prints as ns/name, without the colon.
        (ServicePortName("ns1", "svc1"), "AQI2S6QIMU7PVVRP"),
    ],
)
def test_upstream_service_chains(spn: ServicePortName, suffix: str) -> None:
    assert names.service_chain(spn) == f"KUBE-SVC-{suffix}"


@pytest.mark.parametrize(
    ("spn", "ip", "port", "chain"),
    [
        (ServicePortName("ns1", "svc1", "p80"), "10.180.0.1", 80, "KUBE-SEP-SXIVWICOYRO3J4NJ"),
        (ServicePortName("ns1", "svc1", "p80"), "10.180.2.1", 80, "KUBE-SEP-ZX7GRIZKSNUQ3LAJ"),
        (ServicePortName("ns1", "svc1", "p80"), "10.244.0.1", 80, "KUBE-SEP-6KG6DFHVBKBK53RU"),
        (ServicePortName("ns1", "svc1"), "10.0.1.1", 80, "KUBE-SEP-3JOIVZTXZZRGORX4"),
        (ServicePortName("ns1", "svc1"), "10.0.1.5", 80, "KUBE-SEP-EQCHZ7S2PJ72OHAY"),
        # IPv6 endpoints hash as "[ip]:port" (upstream's Endpoint.String()).
        (ServicePortName("ns1", "svc1", "p80"), "ff06::c1", 80, "KUBE-SEP-LIGRYQQLSZN4UWQ5"),
        (ServicePortName("ns1", "svc1", "p80"), "ff06::c2", 80, "KUBE-SEP-XJJ5QXWGJG344QDZ"),
    ],
)
def test_upstream_endpoint_chains(spn: ServicePortName, ip: str, port: int, chain: str) -> None:
    assert names.endpoint_chain(spn, Endpoint(ip, port)) == chain


# --- how the hashed text is composed -------------------------------------------------------------


def test_named_port_hash_is_ns_name_colon_port_plus_lower_protocol() -> None:
    spn = ServicePortName("kube-system", "kube-dns", "dns-tcp", Protocol.TCP)
    assert str(spn) == "kube-system/kube-dns:dns-tcp"
    assert names.service_chain(spn) == "KUBE-SVC-" + _independent_hash(
        "kube-system/kube-dns:dns-tcp" + "tcp"
    )


@pytest.mark.parametrize("protocol", [Protocol.TCP, Protocol.UDP, Protocol.SCTP])
def test_protocol_is_part_of_the_hash(protocol: Protocol) -> None:
    spn = ServicePortName("kube-system", "kube-dns", "dns", protocol)
    expected = _independent_hash("kube-system/kube-dns:dns" + protocol.value.lower())
    assert names.service_chain(spn) == f"KUBE-SVC-{expected}"


def test_tcp_and_udp_ports_of_one_name_get_different_chains() -> None:
    tcp = ServicePortName("kube-system", "kube-dns", "dns", Protocol.TCP)
    udp = ServicePortName("kube-system", "kube-dns", "dns", Protocol.UDP)
    assert names.service_chain(tcp) != names.service_chain(udp)


def test_endpoint_hash_appends_ip_port() -> None:
    spn = ServicePortName("ns1", "svc1", "p80", Protocol.UDP)
    chain = names.endpoint_chain(spn, Endpoint("10.1.2.3", 53))
    assert chain == "KUBE-SEP-" + _independent_hash("ns1/svc1:p80" + "udp" + "10.1.2.3:53")


def test_ipv6_endpoint_hash_uses_brackets() -> None:
    spn = ServicePortName("ns1", "svc1", "p80")
    ep = Endpoint("2001:db8::7", 8080)
    assert ep.address == "[2001:db8::7]:8080"
    assert names.endpoint_chain(spn, ep) == "KUBE-SEP-" + _independent_hash(
        "ns1/svc1:p80tcp[2001:db8::7]:8080"
    )
    assert names.endpoint_chain(spn, ep) != "KUBE-SEP-" + _independent_hash(
        "ns1/svc1:p80tcp2001:db8::7:8080"
    )


def test_chain_names_fit_iptables_limit() -> None:
    # iptables chain names are at most 28 characters; the 16-character hash keeps them at 25.
    longest = ServicePortName("n" * 63, "s" * 63, "p" * 15, Protocol.SCTP)
    for chain in (
        names.service_chain(longest),
        names.local_service_chain(longest),
        names.external_chain(longest),
        names.firewall_chain(longest),
        names.endpoint_chain(longest, Endpoint("fd00::1", 65535)),
    ):
        assert len(chain) <= 28, chain


def test_is_service_chain() -> None:
    for chain in ("KUBE-SVC-X", "KUBE-SVL-X", "KUBE-EXT-X", "KUBE-FW-X", "KUBE-SEP-X"):
        assert names.is_service_chain(chain)
    for chain in (
        "KUBE-SERVICES",
        "KUBE-NODEPORTS",
        "KUBE-FIREWALL",
        "KUBE-PROXY-FIREWALL",
        "KUBE-MARK-MASQ",
    ):
        assert not names.is_service_chain(chain)
