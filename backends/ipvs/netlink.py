"""Hand-written netlink encoding of the few messages a sync sends, byte for byte as pyroute2's.

pyroute2's generic encoder walks attribute maps and builds nested message objects for each
request (about 200 µs each on a fast machine); a full sync at 1,000 Services x 10 endpoints is
some 14,000 requests. The mode sends only six shapes (IPVS service and real server, a
``kube-ipvs0`` address, ipset create / destroy / entry), so they are packed here with
``struct``, in the same attribute order, flags and padding pyroute2 uses
(tests/unit/test_ipvs_netlink.py compares the two for every operation kind). pyroute2 stays
for dumps, the link, family and protocol lookups and everything else that is not hot.

Each function returns a request's payload (what follows the 16-byte netlink header), its
message type and its flags (without NLM_F_REQUEST / NLM_F_ACK); ``frame`` adds the header.
Headers and attributes are the shared netlink module's (``kubeplex.core.dataplane.netlink``).
"""

from __future__ import annotations

import socket
import struct
from functools import lru_cache
from typing import get_args

from kubeplex.backends.ipvs.plan import (
    IpsetSpec,
    Op,
    OpKind,
    RealServer,
    VirtualKey,
    VirtualServer,
)
from kubeplex.core.dataplane.netlink import (
    NLA,
    NLA_F_NESTED,
    NLA_F_NET_BYTEORDER,
    NLM_F_CREATE,
    NLM_F_EXCL,
    attr,
    message,
)
from kubeplex.core.model.types import IPFamily
from kubeplex.core.model.types import Protocol as L4

RTM_NEWADDR, RTM_DELADDR = 20, 21
NFNL_SUBSYS_IPSET = 6
IPVS_CMD = {
    "add-service": 1,
    "edit-service": 2,
    "del-service": 3,
    "add-real": 5,
    "edit-real": 6,
    "del-real": 7,
}
#: Every operation kind (add-link goes through pyroute2: once per node, not hot).
KINDS: tuple[OpKind, ...] = get_args(OpKind)
IPSET_CMD_CREATE, IPSET_CMD_DESTROY, IPSET_CMD_ADD, IPSET_CMD_DEL = 2, 3, 9, 10
#: IPVS service flags: persistent; scheduler flags 1-3 (as ipvsadm's --sched-flags).
F_PERSISTENT = 0x1
SCHED_FLAGS = {"flag-1": 0x8, "flag-2": 0x10, "flag-3": 0x20}
PROTO_NUM = {L4.TCP: socket.IPPROTO_TCP, L4.UDP: socket.IPPROTO_UDP, L4.SCTP: 132}
NAME_PROTO = {"tcp": 6, "udp": 17, "sctp": 132}

_GENL = struct.Struct("=BBH")
_IFADDR = struct.Struct("=BBBBI")
_NFGEN = struct.Struct("=BB2s")
_U32 = struct.Struct("=HHI")


def _u16(kind: int, value: int) -> bytes:
    return NLA.pack(6, kind) + struct.pack("=H2x", value)


def _u32(kind: int, value: int) -> bytes:
    return _U32.pack(8, kind, value)


def _be16(kind: int, value: int) -> bytes:
    return NLA.pack(6, kind) + struct.pack("!H2x", value)


def _u8(kind: int, value: int) -> bytes:
    return NLA.pack(5, kind) + struct.pack("=B3x", value)


def _asciiz(kind: int, text: str) -> bytes:
    return attr(kind, text.encode() + b"\0")


@lru_cache(maxsize=65536)
def _ip(address: str) -> bytes:
    """An address's bytes (the same few recur across services and real servers)."""
    return socket.inet_pton(socket.AF_INET6 if ":" in address else socket.AF_INET, address)


def _af(family: IPFamily) -> int:
    return socket.AF_INET6 if family is IPFamily.IPv6 else socket.AF_INET


def frame(payload: bytes, msg_type: int, flags: int, seq: int) -> bytes:
    """A whole netlink message: the header (port id 0: the kernel's) and the payload."""
    return message(msg_type, flags, seq, payload)


# --- IPVS (generic netlink; the family id is resolved once by the caller) ------------------


@lru_cache(maxsize=65536)
def _service_key(key: VirtualKey, af: int) -> bytes:
    return (
        _u16(1, af)  # IPVS_SVC_ATTR_AF
        + _u16(2, PROTO_NUM[key.protocol])  # IPVS_SVC_ATTR_PROTOCOL
        + attr(3, _ip(key.address))  # IPVS_SVC_ATTR_ADDR
        + _be16(4, key.port)  # IPVS_SVC_ATTR_PORT
    )


def _service(vs: VirtualServer, af: int) -> bytes:
    flags = F_PERSISTENT if vs.persistence else 0
    for f in vs.flags:
        flags |= SCHED_FLAGS[f]
    # IPv4: the persistence netmask; IPv6: the prefix length, in the same 4 bytes.
    netmask = b"\x80\0\0\0" if af == socket.AF_INET6 else b"\xff\xff\xff\xff"
    return (
        _service_key(vs.key, af)
        + _asciiz(6, vs.scheduler)  # IPVS_SVC_ATTR_SCHED_NAME
        + attr(7, struct.pack("=II", flags, 0xFFFF))  # IPVS_SVC_ATTR_FLAGS
        + _u32(8, vs.persistence)  # IPVS_SVC_ATTR_TIMEOUT
        + attr(9, netmask)  # IPVS_SVC_ATTR_NETMASK
    )


def _dest(real: RealServer, af: int, full: bool) -> bytes:
    out = (
        _u16(11, af)  # IPVS_DEST_ATTR_ADDR_FAMILY
        + attr(1, _ip(real.key.address))  # IPVS_DEST_ATTR_ADDR
        + _be16(2, real.key.port)  # IPVS_DEST_ATTR_PORT
    )
    if full:
        # FWD_METHOD (masquerade), WEIGHT, U_THRESH, L_THRESH
        out += _u32(3, 0) + _u32(4, real.weight) + _u32(5, 0) + _u32(6, 0)
    return out


def is_ipvs(kind: str) -> bool:
    return kind in IPVS_CMD


def ipvs_payload(op: Op) -> bytes:
    """An IPVS operation's generic netlink payload (command header and attributes)."""
    k = op.kind
    af = _af(op.family)
    head = _GENL.pack(IPVS_CMD[k], 1, 0)
    if k in ("add-service", "edit-service"):
        assert op.service is not None
        return head + attr(1, _service(op.service, af))  # IPVS_CMD_ATTR_SERVICE
    key = op.key if op.key is not None else op.service.key if op.service else None
    assert key is not None
    svc = attr(1, _service_key(key, af))
    if k == "del-service":
        return head + svc
    assert op.real is not None
    return head + svc + attr(2, _dest(op.real, af, k != "del-real"))  # IPVS_CMD_ATTR_DEST


def ipvs_flags(op: Op) -> int:
    return NLM_F_CREATE | NLM_F_EXCL if op.kind in ("add-service", "add-real") else 0


# --- rtnetlink: an address on the dummy link -------------------------------------------------


def address_request(op: Op, index: int) -> tuple[bytes, int, int]:
    """``ip addr add|del ADDR/32|/128 dev kube-ipvs0`` (``index``: the link's)."""
    raw = _ip(op.address)
    six = len(raw) == 16
    head = _IFADDR.pack(socket.AF_INET6 if six else socket.AF_INET, 128 if six else 32, 0, 0, index)
    payload = head + attr(2, raw) + attr(1, raw)  # IFA_LOCAL, IFA_ADDRESS
    if op.kind == "add-address":
        return payload, RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL
    return payload, RTM_DELADDR, 0


# --- nfnetlink: ipsets ---------------------------------------------------------------------


def _ipset_ip(kind: int, address: str) -> bytes:
    raw = _ip(address)
    # IPSET_ATTR_IPADDR_IPV4 / _IPV6, in network byte order, nested in IP or IP2.
    inner = attr((2 if len(raw) == 16 else 1) | NLA_F_NET_BYTEORDER, raw)
    return attr(kind | NLA_F_NESTED, inner)


def _nbo_u8(kind: int, value: int) -> bytes:
    return _u8(kind | NLA_F_NET_BYTEORDER, value)


def _nbo_be16(kind: int, value: int) -> bytes:
    return _be16(kind | NLA_F_NET_BYTEORDER, value)


def _nbo_be32(kind: int, value: int) -> bytes:
    return NLA.pack(8, kind | NLA_F_NET_BYTEORDER) + struct.pack("!I", value)


def entry_data(spec: IpsetSpec, entry: str) -> bytes:
    """An entry in ipset's syntax (``10.96.0.10,tcp:80``) as the ADT data attributes."""
    if spec.kind == "bitmap:port":
        return _nbo_be16(4, int(entry))  # IPSET_ATTR_PORT
    parts = entry.split(",")
    out = _ipset_ip(1, parts[0])  # IPSET_ATTR_IP
    if len(parts) > 1:
        proto, _, port = parts[1].partition(":")
        out += _nbo_be16(4, int(port)) + _nbo_u8(7, NAME_PROTO[proto])  # PORT, PROTO
    if len(parts) > 2:
        ip2, _, cidr = parts[2].partition("/")
        out += _ipset_ip(20, ip2)  # IPSET_ATTR_IP2
        if spec.kind == "hash:ip,port,net":
            plen = int(cidr) if cidr else 32 if ":" not in ip2 else 128
            out += _nbo_u8(21, plen)  # IPSET_ATTR_CIDR2
    return out


def ipset_request(op: Op, protocol: int, revision: int = 0) -> tuple[bytes, int, int]:
    """An ipset operation (``revision``: the set type's, for create-set only)."""
    spec = op.ipset
    assert spec is not None
    fam = _af(spec.family)
    head = _NFGEN.pack(fam, 0, b"\0\0") + _u8(1, protocol) + _asciiz(2, spec.name)
    k = op.kind
    if k == "create-set":
        if spec.kind.startswith("bitmap:"):
            data = _nbo_be16(4, 0) + _nbo_be16(5, 65535)  # PORT_FROM, PORT_TO
        else:
            data = _nbo_be32(18, 1024) + _nbo_be32(19, 65536)  # HASHSIZE, MAXELEM
        payload = (
            head
            + _asciiz(3, spec.kind)  # IPSET_ATTR_TYPENAME
            + _u8(4, revision)  # IPSET_ATTR_REVISION
            + _u8(5, fam)  # IPSET_ATTR_FAMILY
            + attr(7 | NLA_F_NESTED, data)  # IPSET_ATTR_DATA
        )
        return payload, (NFNL_SUBSYS_IPSET << 8) | IPSET_CMD_CREATE, NLM_F_EXCL
    if k == "destroy-set":
        return head, (NFNL_SUBSYS_IPSET << 8) | IPSET_CMD_DESTROY, 0
    cmd = IPSET_CMD_ADD if k == "add-entry" else IPSET_CMD_DEL
    payload = head + attr(7 | NLA_F_NESTED, entry_data(spec, op.entry))
    return payload, (NFNL_SUBSYS_IPSET << 8) | cmd, NLM_F_EXCL
