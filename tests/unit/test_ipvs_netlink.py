"""The hand-written netlink encoder (backends/ipvs/netlink.py) against pyroute2's own encoding.

Every operation kind the ipvs mode sends, both families and every ipset type, is built once
with pyroute2's message classes (as the mode built them before the encoder) and once by the
encoder; the bytes must be equal, header included.
"""

from __future__ import annotations

import socket
from typing import Any

import pytest
from pyroute2.netlink.generic import ipvs as g
from pyroute2.netlink.nfnetlink import ipset as s
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg

from kubeplex.backends.ipvs import netlink
from kubeplex.backends.ipvs.kernel import NetlinkSocket
from kubeplex.backends.ipvs.plan import IpsetSpec, Op, RealKey, RealServer, VirtualKey
from kubeplex.backends.ipvs.plan import VirtualServer as VS
from kubeplex.core.model.types import IPFamily
from kubeplex.core.model.types import Protocol as L4

V4, V6 = IPFamily.IPv4, IPFamily.IPv6
FAMILY_ID, IPSET_PROTOCOL, REVISION, LINK = 33, 7, 5, 9
REQ = 1 | 4  # NLM_F_REQUEST | NLM_F_ACK


def _af(family: IPFamily) -> int:
    return socket.AF_INET6 if family is V6 else socket.AF_INET


# --- pyroute2's encoding of the same messages ------------------------------------------------


def _service_key(key: VirtualKey, family: IPFamily) -> list[Any]:
    return [
        ("IPVS_SVC_ATTR_AF", _af(family)),
        ("IPVS_SVC_ATTR_PROTOCOL", netlink.PROTO_NUM[key.protocol]),
        ("IPVS_SVC_ATTR_ADDR", key.address),
        ("IPVS_SVC_ATTR_PORT", key.port),
    ]


def _pyroute2_ipvs(op: Op) -> Any:
    fam = op.family
    msg = g.ipvsmsg()
    msg["cmd"] = netlink.IPVS_CMD[op.kind]
    msg["version"] = 1
    if op.kind in ("add-service", "edit-service"):
        vs = op.service
        assert vs is not None
        flags = netlink.F_PERSISTENT if vs.persistence else 0
        for f in vs.flags:
            flags |= netlink.SCHED_FLAGS[f]
        attrs = [
            *_service_key(vs.key, fam),
            ("IPVS_SVC_ATTR_SCHED_NAME", vs.scheduler),
            ("IPVS_SVC_ATTR_FLAGS", {"flags": flags, "mask": 0xFFFF}),
            ("IPVS_SVC_ATTR_TIMEOUT", vs.persistence),
            ("IPVS_SVC_ATTR_NETMASK", "128.0.0.0" if fam is V6 else "255.255.255.255"),
        ]
        msg["attrs"] = [("IPVS_CMD_ATTR_SERVICE", {"attrs": attrs})]
        return msg
    assert op.key is not None
    svc = ("IPVS_CMD_ATTR_SERVICE", {"attrs": _service_key(op.key, fam)})
    if op.kind == "del-service":
        msg["attrs"] = [svc]
        return msg
    assert op.real is not None
    dest: list[Any] = [
        ("IPVS_DEST_ATTR_ADDR_FAMILY", _af(fam)),
        ("IPVS_DEST_ATTR_ADDR", op.real.key.address),
        ("IPVS_DEST_ATTR_PORT", op.real.key.port),
    ]
    if op.kind != "del-real":
        dest += [
            ("IPVS_DEST_ATTR_FWD_METHOD", 0),
            ("IPVS_DEST_ATTR_WEIGHT", op.real.weight),
            ("IPVS_DEST_ATTR_U_THRESH", 0),
            ("IPVS_DEST_ATTR_L_THRESH", 0),
        ]
    msg["attrs"] = [svc, ("IPVS_CMD_ATTR_DEST", {"attrs": dest})]
    return msg


def _pyroute2_address(op: Op) -> Any:
    six = ":" in op.address
    msg = ifaddrmsg()
    msg["family"] = socket.AF_INET6 if six else socket.AF_INET
    msg["prefixlen"] = 128 if six else 32
    msg["index"] = LINK
    msg["attrs"] = [("IFA_LOCAL", op.address), ("IFA_ADDRESS", op.address)]
    return msg


def _ip_attr(ip: str) -> Any:
    v = "IPSET_ATTR_IPADDR_IPV6" if ":" in ip else "IPSET_ATTR_IPADDR_IPV4"
    return {"attrs": [(v, ip)]}


def _entry_attrs(spec: IpsetSpec, entry: str) -> list[Any]:
    if spec.kind == "bitmap:port":
        return [("IPSET_ATTR_PORT", int(entry))]
    parts = entry.split(",")
    attrs: list[Any] = [("IPSET_ATTR_IP", _ip_attr(parts[0]))]
    if len(parts) > 1:
        proto, _, port = parts[1].partition(":")
        attrs += [("IPSET_ATTR_PORT", int(port)), ("IPSET_ATTR_PROTO", netlink.NAME_PROTO[proto])]
    if len(parts) > 2:
        ip2, _, cidr = parts[2].partition("/")
        attrs.append(("IPSET_ATTR_IP2", _ip_attr(ip2)))
        if spec.kind == "hash:ip,port,net":
            attrs.append(("IPSET_ATTR_CIDR2", int(cidr) if cidr else 32 if ":" not in ip2 else 128))
    return attrs


def _pyroute2_ipset(op: Op) -> Any:
    spec = op.ipset
    assert spec is not None
    fam = _af(spec.family)
    attrs: list[Any] = [("IPSET_ATTR_PROTOCOL", IPSET_PROTOCOL), ("IPSET_ATTR_SETNAME", spec.name)]
    if op.kind == "create-set":
        if spec.kind.startswith("bitmap:"):
            data = [("IPSET_ATTR_PORT_FROM", 0), ("IPSET_ATTR_PORT_TO", 65535)]
        else:
            data = [("IPSET_ATTR_HASHSIZE", 1024), ("IPSET_ATTR_MAXELEM", 65536)]
        attrs += [
            ("IPSET_ATTR_TYPENAME", spec.kind),
            ("IPSET_ATTR_REVISION", REVISION),
            ("IPSET_ATTR_FAMILY", fam),
            ("IPSET_ATTR_DATA", {"attrs": data}),
        ]
    elif op.kind != "destroy-set":
        attrs.append(("IPSET_ATTR_DATA", {"attrs": _entry_attrs(spec, op.entry)}))
    msg = s.ipset_msg()
    msg["nfgen_family"] = fam
    msg["attrs"] = attrs
    return msg


def _pyroute2_bytes(op: Op, msg_type: int, flags: int) -> bytes:
    if netlink.is_ipvs(op.kind):
        msg = _pyroute2_ipvs(op)
    elif op.kind.endswith("-address"):
        msg = _pyroute2_address(op)
    else:
        msg = _pyroute2_ipset(op)
    msg["header"]["type"] = msg_type
    msg["header"]["flags"] = flags
    msg["header"]["sequence_number"] = 42
    msg["header"]["pid"] = 0
    msg.encode()
    return bytes(msg.data)


def _ours(op: Op) -> tuple[bytes, int, int]:
    if netlink.is_ipvs(op.kind):
        return netlink.ipvs_payload(op), FAMILY_ID, netlink.ipvs_flags(op)
    if op.kind.endswith("-address"):
        return netlink.address_request(op, LINK)
    return netlink.ipset_request(op, IPSET_PROTOCOL, REVISION)


# --- the cases ---------------------------------------------------------------------------------

KEY4, KEY6 = VirtualKey(L4.TCP, "10.96.0.10", 80), VirtualKey(L4.UDP, "fd00:96::a", 53)
KEY_SCTP = VirtualKey(L4.SCTP, "172.18.0.2", 30080)
REAL4, REAL6 = RealServer(RealKey("10.244.1.5", 8080), 1), RealServer(RealKey("fd00::5", 53), 0)
SETS4 = {
    "hash:ip,port": "10.96.0.10,tcp:80",
    "hash:ip,port,ip": "10.96.0.10,udp:53,10.244.1.5",
    "hash:ip,port,net": "10.96.0.10,sctp:80,192.168.0.0/16",
    "hash:ip": "10.0.0.2",
    "bitmap:port": "30080",
}
SETS6 = {
    "hash:ip,port": "fd00:96::a,tcp:80",
    "hash:ip,port,ip": "fd00:96::a,udp:53,fd00::5",
    "hash:ip,port,net": "fd00:96::a,tcp:80,fd00::/64",
}


def _cases() -> list[Op]:
    out: list[Op] = []
    for fam, key, real in ((V4, KEY4, REAL4), (V6, KEY6, REAL6), (V4, KEY_SCTP, REAL4)):
        for svc in (
            VS(key),
            VS(key, "sh", 10800, ("flag-1", "flag-2")),
            VS(key, "mh", 0, ("flag-3",)),
        ):
            out += [Op("add-service", fam, service=svc), Op("edit-service", fam, service=svc)]
        out.append(Op("del-service", fam, key=key))
        for kind in ("add-real", "edit-real", "del-real"):
            out.append(Op(kind, fam, key=key, real=real))  # type: ignore[arg-type]
        out.append(Op("edit-real", fam, key=key, real=RealServer(real.key, 0)))
    for addr in ("10.96.0.10", "203.0.113.7", "fd00:96::a", "2001:db8::1"):
        fam = V6 if ":" in addr else V4
        out += [Op("add-address", fam, address=addr), Op("del-address", fam, address=addr)]
    for fam, sets in ((V4, SETS4), (V6, SETS6)):
        for kind, entry in sets.items():
            spec = IpsetSpec(
                f"KUBE-TEST-{kind.replace(':', '-').replace(',', '-').upper()}", kind, fam
            )
            out += [
                Op("create-set", fam, ipset=spec),
                Op("add-entry", fam, ipset=spec, entry=entry),
                Op("del-entry", fam, ipset=spec, entry=entry),
                Op("destroy-set", fam, ipset=spec),
            ]
    return out


CASES = _cases()


def test_every_operation_kind_is_covered() -> None:
    kinds = {op.kind for op in CASES}
    assert kinds == {k for k in netlink.KINDS if k != "add-link"}


@pytest.mark.parametrize("op", CASES, ids=[str(op) for op in CASES])
def test_bytes_equal_pyroute2s(op: Op) -> None:
    payload, msg_type, flags = _ours(op)
    ours = netlink.frame(payload, msg_type, flags | REQ, 42)
    assert ours.hex() == _pyroute2_bytes(op, msg_type, flags | REQ).hex()


def test_the_socket_frames_payloads_with_its_sequence_numbers() -> None:
    sock = NetlinkSocket.__new__(NetlinkSocket)
    sock.seq = 41
    op = Op("add-real", V4, key=KEY4, real=REAL4)
    seq, data = sock._encode(netlink.ipvs_payload(op), FAMILY_ID, REQ)
    assert seq == 42
    assert data == _pyroute2_bytes(op, FAMILY_ID, REQ)
