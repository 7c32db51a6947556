"""The nftables backend's chain, set and map names, hashed and truncated as upstream's
(pkg/proxy/nftables/proxier.go: servicePortChainNameBase, hashAndTruncate).
"""

from __future__ import annotations

import pytest

from kubeplex.backends.nftables import names as N
from kubeplex.core.model.types import Endpoint, Protocol, ServicePortName


@pytest.mark.parametrize(
    ("text", "hashed"),
    [
        # From upstream's expected dumps.
        ("ns1/svc1/tcp/p80", "ULMVA6XW"),
        ("ns2/svc2/tcp/p80", "42NFTM6N"),
        ("ns3/svc3/tcp/p80", "4AT6LBPK"),
        ("ns4/svc4/tcp/p80", "LAUZTJTB"),
        ("ns5/svc5/tcp/p80", "HVFWP5L3"),
        ("ns2/svc2/tcp/p8080", "MHHHYRWA"),
        ("ns1/svc1/tcp/p80__10.180.0.1/80", "5OJB2KTY"),
        ("ns2/svc2/tcp/p80__10.180.0.2/80", "SGOXE6O3"),
        ("ns4/svc4/tcp/p80__10.180.0.5/80", "5RFCDDV7"),
        ("ns5/svc5/tcp/p80__10.180.0.3/80", "GTK6MW7G"),
        ("ns3/svc3/tcp/p80__10.0.3.2/80", "SWWHDC7X"),
        # The seed's nft listing.
        ("default/web/tcp/", "PFISGYVC"),
    ],
)
def test_hash8_matches_upstream(text: str, hashed: str) -> None:
    import base64
    import hashlib

    assert N.hash8(text) == hashed
    assert base64.b32encode(hashlib.sha256(text.encode()).digest()).decode()[:8] == hashed


def test_chain_names() -> None:
    spn = ServicePortName("ns1", "svc1", "p80", Protocol.TCP)
    assert N.service_chain(spn) == "service-ULMVA6XW-ns1/svc1/tcp/p80"
    assert N.local_chain(spn) == "local-ULMVA6XW-ns1/svc1/tcp/p80"
    assert N.external_chain(spn) == "external-ULMVA6XW-ns1/svc1/tcp/p80"
    assert N.firewall_chain(spn) == "firewall-ULMVA6XW-ns1/svc1/tcp/p80"
    e = Endpoint("10.180.0.1", 80)
    assert N.endpoint_chain(spn, e) == "endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"
    assert N.affinity_set(spn, e) == "affinity-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"
    assert N.service_chain(ServicePortName("default", "web")) == "service-PFISGYVC-default/web/tcp/"
    udp = ServicePortName("kube-system", "dns", "dns", Protocol.UDP)
    assert N.service_chain(udp).endswith("-kube-system/dns/udp/dns")


def test_ipv6_endpoint_names_have_no_colons() -> None:
    spn = ServicePortName("ns1", "svc1", "p80")
    name = N.endpoint_chain(spn, Endpoint("fd00:10:180::2:1", 80))
    assert name.endswith("-ns1/svc1/tcp/p80__fd00.10.180..2.1/80") and ":" not in name
    assert N.hash8("ns1/svc1/tcp/p80__fd00.10.180..2.1/80") in name


def test_long_names_are_truncated_like_upstream() -> None:
    spn = ServicePortName("n" * 63, "s" * 63, "p" * 63)
    base = N.endpoint_base(spn, Endpoint("fd00:1111:2222:3333:4444:5555:6666:7777", 65535))
    assert len(base) == N.BASE_LENGTH_MAX and base.endswith("...")
    assert len(N.ENDPOINT_PREFIX + base) <= N.NAME_LENGTH_MAX
    assert len(N.service_base(spn)) < N.BASE_LENGTH_MAX  # never truncated (205 at most)


def test_service_chain_test() -> None:
    assert N.is_service_chain("service-ULMVA6XW-ns1/svc1/tcp/p80")
    assert not any(N.is_service_chain(c) for c in ("services", "reject-chain", "nat-output"))
    assert N.is_affinity_set("affinity-X-a/b/tcp/__1.2.3.4/80")
