"""The shared netlink message module against the kernel, in a scratch network namespace: a
dump's answers, a get's and a refusal's, the acknowledgements of pipelined requests, errors
left waiting, and an nfnetlink batch committed as one transaction."""

from __future__ import annotations

import errno
import shutil
import socket
import struct
import subprocess
from collections.abc import Iterator

import pytest

from kubeplex.core.dataplane import netlink
from kubeplex.core.dataplane.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST

pytestmark = pytest.mark.kernel

RTM_GETLINK, RTM_NEWADDR = 18, 20
LOOPBACK_INDEX = 1


@pytest.fixture
def route(netns: str) -> Iterator[socket.socket]:
    sock = netlink.open_socket(netlink.NETLINK_ROUTE, netns, cap_ack=True)
    yield sock
    sock.close()


def get_link(index: int) -> bytes:
    return struct.pack("=BxHiII", socket.AF_UNSPEC, 0, index, 0, 0)  # ifinfomsg


def new_address(address: str) -> bytes:
    raw = socket.inet_aton(address)
    head = struct.pack("=BBBBI", socket.AF_INET, 32, 0, 0, LOOPBACK_INDEX)  # ifaddrmsg
    return head + netlink.attr(2, raw) + netlink.attr(1, raw)  # IFA_LOCAL, IFA_ADDRESS


def test_a_dump_a_get_and_a_refused_get_are_answered(route: socket.socket) -> None:
    route.settimeout(5.0)
    dump = NLM_F_REQUEST | netlink.NLM_F_DUMP
    route.send(netlink.message(RTM_GETLINK, dump, 1, get_link(0)))
    code, links = netlink.answers(route, 1)
    assert code == 0
    assert [netlink.string_attr(m, 3, 32) for m in links] == ["lo"]  # IFLA_IFNAME
    route.send(netlink.message(RTM_GETLINK, NLM_F_REQUEST, 2, get_link(LOOPBACK_INDEX)))
    code, (link,) = netlink.answers(route, 2, dump=False)
    assert code == 0 and netlink.string_attr(link, 3, 32) == "lo"
    route.send(netlink.message(RTM_GETLINK, NLM_F_REQUEST, 3, get_link(4242)))
    assert netlink.answers(route, 3, dump=False) == (-errno.ENODEV, [])


def test_pipelined_requests_are_acknowledged_one_by_one(route: socket.socket) -> None:
    route.settimeout(5.0)
    flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
    addresses = ["10.0.0.1", "10.0.0.2", "10.0.0.1", "10.0.0.3"]
    route.send(
        b"".join(
            netlink.message(RTM_NEWADDR, flags, 10 + i, new_address(a))
            for i, a in enumerate(addresses)
        )
    )
    codes = netlink.acks(route, 10, 13, bytearray(1 << 16))
    assert codes == {10: 0, 11: 0, 12: -errno.EEXIST, 13: 0}


def test_an_error_without_an_acknowledgement_waits_to_be_read(route: socket.socket) -> None:
    flags = NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL
    route.send(netlink.message(RTM_NEWADDR, flags, 20, new_address("10.0.0.9")))
    route.send(netlink.message(RTM_NEWADDR, flags, 21, new_address("10.0.0.9")))
    assert netlink.queued_errors(route) == [(21, -errno.EEXIST)]
    assert netlink.queued_errors(route) == []


def new_tables(seq: int, *bodies: bytes) -> bytes:
    """An nf_tables batch of NFT_MSG_NEWTABLE messages (ip family)."""
    nftables = 10  # NFNL_SUBSYS_NFTABLES
    return (
        netlink.batch_begin(seq, nftables)
        + b"".join(
            netlink.nfnl_message(nftables << 8, NLM_F_REQUEST, seq + 1 + i, socket.AF_INET, b)
            for i, b in enumerate(bodies)
        )
        + netlink.batch_end(seq + 1 + len(bodies), nftables)
    )


@pytest.mark.skipif(shutil.which("nft") is None, reason="needs nft to read the tables back")
def test_an_nfnetlink_batch_is_one_transaction(netns: str) -> None:
    def table(name: str, flags: int = 0) -> bytes:  # NFTA_TABLE_NAME, NFTA_TABLE_FLAGS
        return netlink.attr(1, name.encode() + b"\0") + netlink.attr(2, struct.pack(">I", flags))

    sock = netlink.open_socket(netlink.NETLINK_NETFILTER, netns)
    try:
        sock.send(new_tables(1, table("one"), table("two")))
        # An unknown table flag is refused, and with it the whole batch.
        sock.send(new_tables(10, table("three"), table("four", flags=0x80)))
        refused = netlink.queued_errors(sock)
        listed = subprocess.run(
            ["ip", "netns", "exec", netns, "nft", "list", "tables"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
    finally:
        sock.close()
    assert listed.splitlines() == ["table ip one", "table ip two"]
    assert [seq for seq, code in refused if code] == [12]
