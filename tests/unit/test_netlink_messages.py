"""The shared netlink message module without the kernel: the layout of headers, attributes
and nfnetlink batches, and the walks over what the kernel sends (tests/kernel/
test_netlink_kernel.py sends them to the kernel)."""

from __future__ import annotations

import socket
import struct

from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg

from kubeplex.core.dataplane import netlink

RTM_NEWADDR = 20


def test_an_attribute_is_padded_to_four_bytes_and_its_length_is_unpadded() -> None:
    assert netlink.attr(3, b"ab") == struct.pack("=HH", 6, 3) + b"ab\0\0"
    assert netlink.attr(3, b"abcd") == struct.pack("=HH", 8, 3) + b"abcd"
    assert netlink.nested(1, netlink.attr(2, b"x")) == (
        struct.pack("=HH", 12, 1 | netlink.NLA_F_NESTED) + struct.pack("=HH", 5, 2) + b"x\0\0\0"
    )


def test_a_message_is_framed_as_pyroute2_frames_it() -> None:
    msg = ifaddrmsg()
    msg["family"], msg["prefixlen"], msg["index"] = socket.AF_INET, 32, 7
    msg["attrs"] = [("IFA_LOCAL", "10.0.0.1"), ("IFA_ADDRESS", "10.0.0.1")]
    msg["header"].update(type=RTM_NEWADDR, flags=0x605, sequence_number=9, pid=0)
    msg.encode()
    raw = socket.inet_aton("10.0.0.1")
    payload = struct.pack("=BBBBI", socket.AF_INET, 32, 0, 0, 7)
    payload += netlink.attr(2, raw) + netlink.attr(1, raw)
    assert netlink.message(RTM_NEWADDR, 0x605, 9, payload) == bytes(msg.data)


def test_an_nfnetlink_message_carries_the_family_and_the_resource_id_in_network_order() -> None:
    data = netlink.nfnl_message(0x0A00, 1, 5, socket.AF_INET, b"\1\2")
    assert netlink.NFNL_HEADER.unpack_from(data) == (22, 0x0A00, 1, 5, 0, 2, 0, 0)
    assert data[20:] == b"\1\2\0\0"
    begin = netlink.batch_begin(1, 10)
    assert netlink.NFNL_HEADER.unpack(begin) == (20, 16, 1, 1, 0, 0, 0, socket.htons(10))
    assert netlink.NFNL_HEADER.unpack(netlink.batch_end(4, 10))[:4] == (20, 17, 1, 4)


def test_the_walks_stop_at_what_is_too_short_to_read() -> None:
    two = netlink.message(3, 2, 1, b"") + netlink.message(2, 0, 2, struct.pack("=i", -17))
    assert [m[:3] for m in netlink.messages(two)] == [(3, 2, 1), (2, 0, 2)]
    off = list(netlink.messages(two))[1][3]
    assert netlink.error_code(two, off) == -17
    broken = netlink.HEADER.pack(8, 2, 0, 3, 0) + bytes(8)
    assert list(netlink.messages(broken + two)) == []
    attrs = netlink.attr(1, b"kube-proxy\0") + netlink.attr(2, b"x\0")
    assert netlink.string_attr(attrs, 1) == "kube-proxy"
    assert netlink.string_attr(attrs, 2) == "x"
    assert netlink.string_attr(attrs + struct.pack("=HH", 99, 3), 3) is None
    assert [k for k, _, _ in netlink.attributes(attrs, 0, len(attrs))] == [1, 2]
