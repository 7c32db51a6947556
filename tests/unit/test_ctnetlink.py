"""The ctnetlink codec without the kernel: the one-unpack shapes agree with the attribute by
attribute way (tests/kernel/test_conntrack_kernel.py checks both against the kernel and the
conntrack tool)."""

from __future__ import annotations

import errno
import socket
import struct
from dataclasses import replace

import pytest

from kubeplex.core.daemon import ctnetlink as ct
from kubeplex.core.daemon.ctnetlink import ConntrackError, Flow, delete_message, parse_dump
from kubeplex.core.dataplane import netlink

V4 = Flow(17, "10.244.0.3", "10.96.0.10", 40000, 53, "10.244.2.2", "10.244.0.3", 8081, 40000)
V6 = Flow(17, "fd00::3", "fd00:96::a", 40000, 53, "fd00:244::2", "fd00::3", 8081, 40000)
SEQ = 7


def entry(flow: Flow, *, tuple_zone: bool = False, ct_id: int = 0xDEADBEEF) -> bytes:
    """A dumped entry as the kernel writes one: tuples, then other attributes, the id among
    them; ``tuple_zone`` puts a CTA_TUPLE_ZONE in each tuple (a shape of its own)."""
    af = socket.AF_INET6 if ":" in flow.orig_src else socket.AF_INET
    zone = netlink.attr(3, struct.pack(">H", 5)) if tuple_zone else b""
    orig = ct._tuple(af, flow.orig_src, flow.orig_dst, flow.proto, flow.orig_sport,
                     flow.orig_dport)  # fmt: skip
    reply = ct._tuple(af, flow.reply_src, flow.reply_dst, flow.proto, flow.reply_sport,
                      flow.reply_dport)  # fmt: skip
    attrs = (
        netlink.nested(ct._CTA_TUPLE_ORIG, orig + zone)
        + netlink.nested(ct._CTA_TUPLE_REPLY, reply + zone)
        + netlink.attr(3, struct.pack(">I", 0x188))  # CTA_STATUS
        + netlink.attr(ct._CTA_TIMEOUT, struct.pack(">I", 30))
        + netlink.attr(ct._CTA_ID, struct.pack(">I", ct_id))
        + netlink.attr(11, struct.pack(">I", 1))  # CTA_USE
    )
    return netlink.nfnl_message(ct._CT_NEW, 0x2, SEQ, af, attrs)


def done() -> bytes:
    return netlink.HEADER.pack(20, 3, 0x2, SEQ, 0) + struct.pack("=i", 0)


@pytest.mark.parametrize("flow", [V4, V6], ids=["IPv4", "IPv6"])
def test_the_usual_shape_and_any_other_decode_alike(flow: Flow) -> None:
    flows: list[Flow] = []
    names: dict[bytes, str] = {}
    data = entry(flow) + entry(flow, tuple_zone=True, ct_id=1) + entry(flow, ct_id=2)
    assert not parse_dump(data, SEQ, flows, names)
    assert parse_dump(done(), SEQ, flows, names)
    assert flows == [
        replace(flow, ct_id=0xDEADBEEF),
        replace(flow, ct_id=1),
        replace(flow, ct_id=2),
    ]


def test_a_dump_skips_other_requests_answers_and_reports_a_refusal() -> None:
    flows: list[Flow] = []
    assert not parse_dump(entry(V4).replace(struct.pack("=I", SEQ), struct.pack("=I", 99), 1),
                          SEQ, flows, {})  # fmt: skip
    assert flows == []
    refusal = netlink.HEADER.pack(36, 2, 0, SEQ, 0) + struct.pack("=i", -errno.EPERM)
    with pytest.raises(ConntrackError) as err:
        parse_dump(refusal + bytes(16), SEQ, flows, {})
    assert err.value.errno == errno.EPERM


@pytest.mark.parametrize("flow", [V4, V6], ids=["IPv4", "IPv6"])
def test_a_deletion_by_tuple_and_id_is_written_as_attribute_by_attribute(flow: Flow) -> None:
    af = socket.AF_INET6 if flow is V6 else socket.AF_INET
    with_id = replace(flow, ct_id=0x01020304)
    tup = ct._tuple(af, flow.orig_src, flow.orig_dst, flow.proto, flow.orig_sport,
                    flow.orig_dport)  # fmt: skip
    attrs = netlink.nested(ct._CTA_TUPLE_ORIG, tup) + netlink.attr(ct._CTA_ID, bytes((1, 2, 3, 4)))
    for ack, flags in ((False, 0x1), (True, 0x5)):
        assert delete_message(SEQ, af, with_id, ack=ack) == netlink.nfnl_message(
            ct._CT_DELETE, flags, SEQ, af, attrs
        )
