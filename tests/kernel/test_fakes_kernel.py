"""The in-memory kernels of kubeplex.testing.fakes against the real tools: the same inputs go
through iptables-restore and nft in a scratch namespace and through the fake, and the outcomes
are compared (tests/unit/test_fakes.py pins the fake's behaviour without root)."""

from __future__ import annotations

import subprocess

import pytest
from kits.fakes_kit import SETUP, SETUP_LISTED, T

from kubeplex.backends.nftables.listing import parse_listing, parse_table
from kubeplex.core.model.errors import BackendError
from kubeplex.core.model.types import IPFamily
from kubeplex.testing.fakes import FakeIptables, FakeNftables

V4 = IPFamily.IPv4


def _run(ns: str, argv: list[str], text: str) -> bool:
    proc = subprocess.run(
        ["ip", "netns", "exec", ns, *argv], input=text, capture_output=True, text=True
    )
    return proc.returncode == 0


IPTABLES_INPUTS = [
    "*filter\n:KEEP - [0:0]\n:FL - [0:0]\n-A KEEP -j RETURN\n-A FL -j RETURN\n"
    "-A OUTPUT -j KEEP\n-A OUTPUT -j FL\nCOMMIT\n",
    "*filter\n:FL - [0:0]\n-A FL -p udp -j RETURN\nCOMMIT\n",
    "*filter\n:T1 - [0:0]\n-A T1 -j RETURN\nCOMMIT\n*nat\n:N1 - [0:0]\n-A N1 -j NOPE\nCOMMIT\n"
    "*mangle\n:M1 - [0:0]\nCOMMIT\n",
    "*filter\n:REF - [0:0]\n-A T1 -j REF\nCOMMIT\n",
    "*filter\n-X REF\nCOMMIT\n",
    "*filter\n-X REF\n:T1 - [0:0]\nCOMMIT\n",
    "*filter\n:T1 - [0:0]\n-X REF\nCOMMIT\n",
    "*filter\n-X GHOST\nCOMMIT\n",
    "*filter\n:NE - [0:0]\n-A NE -j RETURN\nCOMMIT\n",
    "*filter\n-X NE\nCOMMIT\n",
    "*filter\n:P - [0:0]\n-A P -s 1.1.1.1/32 -j RETURN\n-A P -s 2.2.2.2/32 -j RETURN\n"
    "-I P 1 -s 3.3.3.3/32 -j RETURN\n-I P 3 -s 4.4.4.4/32 -j RETURN\n"
    "-I P -s 5.5.5.5/32 -j RETURN\n-I P 6 -s 6.6.6.6/32 -j RETURN\nCOMMIT\n",
    "*filter\n-I P 9 -s 7.7.7.7/32 -j RETURN\nCOMMIT\n",
    "*filter\n-D P -s 4.4.4.4/32 -j RETURN\n-D P 1\nCOMMIT\n",
    "*filter\n-D P -s 9.9.9.9/32 -j RETURN\nCOMMIT\n",
    "*filter\n:NOCOMMIT - [0:0]\n",
    "*nat\n:ZED - [0:0]\n:ALPHA - [0:0]\n-A ZED -j ACCEPT\n-A ALPHA -j RETURN\n"
    "-A OUTPUT -j ZED\nCOMMIT\n*raw\n:R - [0:0]\nCOMMIT\n*filter\n:a_b - [0:0]\n:A-b - [0:0]\n"
    ':C - [0:0]\n-A C -m comment --comment "ns/svc:p" -j RETURN\n'
    '-A C -m comment --comment "has space" -j RETURN\n-A C -m comment --comment word -j RETURN\n'
    "-A C -s 10.0.0.1 -j RETURN\nCOMMIT\n",
    "*filter\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n",
    "*filter\n-A GHOST -j RETURN\nCOMMIT\n",
    "*filter\n-N FL\nCOMMIT\n",
    "*filter\nhello\nCOMMIT\n",
]


@pytest.mark.kernel
def test_fake_iptables_does_what_iptables_restore_does(netns: str) -> None:
    fake = FakeIptables()
    for text in IPTABLES_INPUTS:
        real_ok = _run(netns, ["iptables-restore", "--noflush"], text)
        try:
            fake.restore(V4, text)
            fake_ok = True
        except BackendError:
            fake_ok = False
        assert fake_ok == real_ok, text
    real = subprocess.run(
        ["ip", "netns", "exec", netns, "iptables-save", "-c"], capture_output=True, text=True
    ).stdout
    strip = lambda text: [ln for ln in text.splitlines() if not ln.startswith("#")]  # noqa: E731
    assert strip(fake.save(V4, counters=True)) == strip(real)


NFT_INPUTS = [
    SETUP,
    f"add chain {T} t1\nflush chain {T} ghost\n",
    f"delete chain {T} ghost\n",
    f"flush set {T} ghost\n",
    f"delete map {T} ghost\n",
    "delete table ip ghost\n",
    f"add chain {T} ep\n",
    f"create chain {T} ep\n",
    f"add element {T} cluster-ips {{ 10.0.0.1 }}\n",
    f"create element {T} cluster-ips {{ 10.0.0.1 }}\n",
    f"delete element {T} cluster-ips {{ 10.9.9.9 }}\n",
    f"add element {T} cluster-ips {{ 10.0.0.9, 10.0.0.10 }}\ndelete element {T} cluster-ips"
    " { 10.0.0.9 }\n",
    f"add element {T} service-ips {{ 10.0.0.1 . tcp . 80 : jump service-X }}\n",
    f"add element {T} service-ips {{ 10.0.0.2 : goto ep }}\n",
    f"delete chain {T} ep\n",
    f"delete chain {T} mark-for-masquerade\n",
    f"delete chain {T} service-X\n",
    f"delete set {T} aff\n",
    f"add chain {T} e1\nadd rule {T} services jump e1\ndelete chain {T} e1\n",
    f"add rule {T} ghost accept\n",
    f"add rule {T} services jump ghost\n",
    f"add rule {T} services ip saddr @ghost accept\n",
    f"add set {T} cluster-ips {{ type ipv6_addr ; }}\n",
    f"create table {T}\n",
    f"add chain {T} nat-output {{ type nat hook output priority -90 ; }}\n",
    f"add chain {T} r1\nadd rule {T} r1 accept\ndelete chain {T} r1\n",
    f"flush chain {T} service-X\ndelete element {T} service-ips {{ 10.0.0.1 . tcp . 80 }}\n"
    f"delete chain {T} service-X\n",
    "add table ip6 kube-proxy\nadd chain ip6 kube-proxy c6\n"
    "add map ip6 kube-proxy m6 { type ipv6_addr . inet_proto . inet_service : verdict ; }\n"
    "add element ip6 kube-proxy m6 { fd00::1 . tcp . 80 : goto c6 }\n",
    "add element ip6 kube-proxy m6 { 10.0.0.1 . tcp . 80 : goto c6 }\n",
]


def _objects(text: str) -> dict[str, object]:
    found = parse_listing(text)
    return {fam: (o.chains, o.sets, o.maps) for fam, o in found.items()}


@pytest.mark.kernel
def test_fake_nftables_does_what_nft_does(netns: str) -> None:
    fake = FakeNftables()
    for i, text in enumerate(NFT_INPUTS):
        real_ok = _run(netns, ["nft", "-f", "-"], text)
        try:
            fake.run(text)
            fake_ok = True
        except BackendError:
            fake_ok = False
        assert fake_ok == real_ok, text
        if i == 0:
            listed = ["ip", "netns", "exec", netns, "nft", "list", "table", "ip", "kube-proxy"]
            real = subprocess.run(listed, capture_output=True, text=True, check=True).stdout
            assert real == SETUP_LISTED == fake.list(f"list table {T}")
    for family in ("ip", "ip6"):
        commands = f"list chains {family}\nlist sets {family}\nlist maps {family}\n"
        real = "".join(
            subprocess.run(
                ["ip", "netns", "exec", netns, "nft", "-t", *line.split()],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            for line in commands.splitlines()
        )
        assert _objects(fake.list(commands, terse=True)) == _objects(real)
        for name in ("cluster-ips", "service-ips", "noep", "m6"):
            real_table = subprocess.run(
                ["ip", "netns", "exec", netns, "nft", "list", "table", family, "kube-proxy"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            want = parse_table(real_table).sets.get(name)
            got = parse_table(fake.list(f"list table {family} kube-proxy")).sets.get(name)
            assert (got and sorted(got.elements)) == (want and sorted(want.elements)), name


@pytest.mark.kernel
def test_fake_nftables_dump_makes_the_same_table_in_nft(netns: str) -> None:
    fake = FakeNftables()
    fake.run(SETUP)
    assert _run(netns, ["nft", "-f", "-"], fake.dump("ip", "kube-proxy"))
    listed = ["ip", "netns", "exec", netns, "nft", "list", "table", "ip", "kube-proxy"]
    assert subprocess.run(listed, capture_output=True, text=True, check=True).stdout == SETUP_LISTED
