"""The node's IPVS, dummy link, ipsets and iptables: the real ``IpvsSeam``.

Everything on the data path is netlink: IPVS (generic netlink), the ``kube-ipvs0`` link and its
addresses (rtnetlink), ipsets (nfnetlink); no ``ipvsadm`` or ``ipset`` process. A sync's writes
are packed by netlink.py (byte for byte as pyroute2 would, at a fraction of the cost); dumps,
the link and the family and protocol lookups use pyroute2's message classes. The iptables
rules go through the netfilter library's ``Iptables`` (iptables-restore). One socket per
protocol, opened at first use (a render never opens one) inside ``netns``, and kept.

Writes are pipelined: the operations bound for one socket are sent in windows of
``WINDOW`` requests without waiting for each answer, then the acknowledgements are read (the
kernel handles a socket's requests in order). A refusal names the first refused operation;
the operations before it are applied, and so may be some after it in the same window (the
backend's next sync is full and reads the kernel back). Dumps go one at a time (the kernel
runs one dump per socket).
"""

from __future__ import annotations

import errno
import ipaddress
import os
import platform
import socket
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from kubeplex.backends.ipvs import ipsets, netlink
from kubeplex.backends.ipvs.plan import (
    DUMMY_LINK,
    Connections,
    FamilyState,
    IpsetSpec,
    Op,
    RealKey,
    RealServer,
    VirtualKey,
    VirtualServer,
)
from kubeplex.backends.netfilter.iptables import Iptables
from kubeplex.core.dataplane import netlink as nl
from kubeplex.core.dataplane.netlink import (
    NETLINK_GENERIC,
    NETLINK_NETFILTER,
    NETLINK_ROUTE,
    NLM_F_ACK,
    NLM_F_CREATE,
    NLM_F_DUMP,
    NLM_F_EXCL,
    NLM_F_REQUEST,
)
from kubeplex.core.dataplane.requirements import module_unavailable
from kubeplex.core.model.errors import BackendError
from kubeplex.core.model.types import IPFamily
from kubeplex.core.model.types import Protocol as L4

RTM_NEWLINK, RTM_DELLINK, RTM_GETLINK = 16, 17, 18
RTM_GETADDR = 22
NFNL_SUBSYS_IPSET = 6
#: Requests in flight on one socket before their acknowledgements are read.
WINDOW = 256

_PROTO_NUM = {L4.TCP: socket.IPPROTO_TCP, L4.UDP: socket.IPPROTO_UDP, L4.SCTP: 132}
_NUM_PROTO = {v: k for k, v in _PROTO_NUM.items()}
_PROTO_NAME = {6: "tcp", 17: "udp", 132: "sctp"}
#: IPVS service flags: persistent, hashed (the kernel's own), scheduler flags 1-3.
F_PERSISTENT, F_HASHED = 0x1, 0x2
_SCHED_FLAGS = {"flag-1": 0x8, "flag-2": 0x10, "flag-3": 0x20}
#: IP_VS_CONN_F_MASQ.
FWD_MASQ = 0


def _af(family: IPFamily) -> int:
    return socket.AF_INET6 if family is IPFamily.IPv6 else socket.AF_INET


class NetlinkSocket:
    """One raw netlink socket of ``proto`` (in ``netns``), with pipelined requests."""

    def __init__(self, proto: int, netns: str | None) -> None:
        # Acknowledgements without the request echoed.
        self.sock = nl.open_socket(proto, netns, cap_ack=True, buffers=4 << 20)
        self.seq = 0
        self._buf = bytearray(1 << 20)

    def close(self) -> None:
        self.sock.close()

    def _encode(self, msg: Any, msg_type: int, flags: int) -> tuple[int, bytes]:
        """``msg``: a pyroute2 message, or a payload packed by netlink.py."""
        self.seq += 1
        if isinstance(msg, bytes):
            return self.seq, netlink.frame(msg, msg_type, flags, self.seq)
        msg["header"]["type"] = msg_type
        msg["header"]["flags"] = flags
        msg["header"]["sequence_number"] = self.seq
        msg["header"]["pid"] = 0
        msg.encode()
        return self.seq, bytes(msg.data)

    def requests(self, msgs: Sequence[tuple[Any, int, int]]) -> list[int]:
        """Send (message, type, flags) requests, ``WINDOW`` at a time; each one's errno (0:
        acknowledged), in order."""
        out: list[int] = []
        for start in range(0, len(msgs), WINDOW):
            window = msgs[start : start + WINDOW]
            encoded = [self._encode(m, t, f | NLM_F_REQUEST | NLM_F_ACK) for m, t, f in window]
            first = encoded[0][0]
            buf = bytearray()
            for _, data in encoded:
                if len(buf) + len(data) > 60_000:
                    self.sock.send(bytes(buf))
                    buf.clear()
                buf += data
            if buf:
                self.sock.send(bytes(buf))
            codes = nl.acks(self.sock, first, first + len(window) - 1, self._buf)
            out += [-codes.get(first + i, 0) for i in range(len(window))]
        return out

    def request(self, msg: Any, msg_type: int, flags: int = 0) -> int:
        return self.requests([(msg, msg_type, flags)])[0]

    def dump(self, msg: Any, msg_type: int, decode: type, flags: int = NLM_F_DUMP) -> list[Any]:
        """One dump (or get) request; its answers decoded with ``decode``."""
        seq, data = self._encode(msg, msg_type, flags | NLM_F_REQUEST)
        self.sock.send(data)
        code, answers = nl.answers(self.sock, seq, dump=bool(flags & NLM_F_DUMP), size=1 << 20)
        if code:
            raise OSError(-code, os.strerror(-code))
        out: list[Any] = []
        for part in answers:
            m = decode(part)
            m.decode()
            out.append(m)
        return out


class IpvsKernel:
    """The node's IPVS (in network namespace ``netns``; None: the host's)."""

    writes: ClassVar[tuple[str, ...]] = ("send", "restore")

    def __init__(self, netns: str | None = None) -> None:
        self.netns = netns
        self.iptables = Iptables(netns)
        self._socks: dict[int, NetlinkSocket] = {}
        self._ipvs_id: int | None = None
        self._ipset_proto = 0
        self._revisions: dict[tuple[str, int], int] = {}
        self._link_index: int | None = None
        #: Netlink requests sent so far (writes, dumps and lookups).
        self.requests_sent = 0

    def _sock(self, proto: int) -> NetlinkSocket:
        s = self._socks.get(proto)
        if s is None:
            s = self._socks[proto] = NetlinkSocket(proto, self.netns)
        return s

    def close(self) -> None:
        for s in self._socks.values():
            s.close()
        self._socks.clear()

    # --- generic netlink: IPVS --------------------------------------------------------------

    def _ipvs(self) -> tuple[NetlinkSocket, int]:
        sock = self._sock(NETLINK_GENERIC)
        if self._ipvs_id is None:
            from pyroute2.netlink import CTRL_CMD_GETFAMILY, GENL_ID_CTRL, ctrlmsg

            msg = ctrlmsg()
            msg["cmd"] = CTRL_CMD_GETFAMILY
            msg["version"] = 1
            msg["attrs"] = [["CTRL_ATTR_FAMILY_NAME", "IPVS"]]
            self.requests_sent += 1
            # The kernel loads ip_vs for an unknown family by its alias
            # (net-pf-16-proto-16-family-IPVS) before it answers.
            try:
                (reply,) = sock.dump(msg, GENL_ID_CTRL, ctrlmsg, flags=0)
            except OSError as err:
                if err.errno != errno.ENOENT:
                    raise BackendError(f"IPVS generic netlink family: {err}") from err
                why = module_unavailable("ip_vs") or (
                    "kernel module 'ip_vs' did not load when the kernel was asked for it"
                )
                raise BackendError(
                    f"this kernel has no IPVS (no generic netlink family 'IPVS'): {why}"
                ) from err
            self._ipvs_id = int(reply.get_attr("CTRL_ATTR_FAMILY_ID"))
        return sock, self._ipvs_id

    @staticmethod
    def _ipvs_msg(cmd: int, attrs: list[Any]) -> Any:
        from pyroute2.netlink.generic.ipvs import ipvsmsg

        msg = ipvsmsg()
        msg["cmd"] = cmd
        msg["version"] = 1
        msg["attrs"] = attrs
        return msg

    @staticmethod
    def _service_key(key: VirtualKey, family: IPFamily) -> list[Any]:
        return [
            ("IPVS_SVC_ATTR_AF", _af(family)),
            ("IPVS_SVC_ATTR_PROTOCOL", _PROTO_NUM[key.protocol]),
            ("IPVS_SVC_ATTR_ADDR", key.address),
            ("IPVS_SVC_ATTR_PORT", key.port),
        ]

    def _services(self, family: IPFamily) -> list[Any]:
        from pyroute2.netlink.generic import ipvs as g

        sock, fid = self._ipvs()
        self.requests_sent += 1
        out = []
        for m in sock.dump(self._ipvs_msg(g.IPVS_CMD_GET_SERVICE, []), fid, g.ipvsmsg):
            svc = m.get_attr("IPVS_CMD_ATTR_SERVICE")
            if svc is None or svc.get_attr("IPVS_SVC_ATTR_AF") != _af(family):
                continue
            proto = _NUM_PROTO.get(svc.get_attr("IPVS_SVC_ATTR_PROTOCOL") or 0)
            if proto is None or svc.get_attr("IPVS_SVC_ATTR_FWMARK"):
                continue  # fwmark services are never ours
            out.append((proto, svc))
        return out

    @staticmethod
    def _virtual(proto: L4, svc: Any) -> VirtualServer:
        raw = svc.get_attr("IPVS_SVC_ATTR_FLAGS")
        flags = int(raw["flags"]) if raw is not None else 0
        key = VirtualKey(
            proto,
            str(ipaddress.ip_address(svc.get_attr("IPVS_SVC_ATTR_ADDR"))),
            int(svc.get_attr("IPVS_SVC_ATTR_PORT")),
        )
        persistence = int(svc.get_attr("IPVS_SVC_ATTR_TIMEOUT") or 0) if flags & 1 else 0
        sched = tuple(n for n, bit in sorted(_SCHED_FLAGS.items()) if flags & bit)
        return VirtualServer(key, str(svc.get_attr("IPVS_SVC_ATTR_SCHED_NAME")), persistence, sched)

    def _dests(self, key: VirtualKey, family: IPFamily) -> list[tuple[RealServer, Connections]]:
        from pyroute2.netlink.generic import ipvs as g

        sock, fid = self._ipvs()
        svc = ("IPVS_CMD_ATTR_SERVICE", {"attrs": self._service_key(key, family)})
        self.requests_sent += 1
        out = []
        for m in sock.dump(self._ipvs_msg(g.IPVS_CMD_GET_DEST, [svc]), fid, g.ipvsmsg):
            d = m.get_attr("IPVS_CMD_ATTR_DEST")
            if d is None:
                continue
            rk = RealKey(
                str(ipaddress.ip_address(d.get_attr("IPVS_DEST_ATTR_ADDR"))),
                int(d.get_attr("IPVS_DEST_ATTR_PORT")),
            )
            # The raw forwarding method: a real server that does not masquerade is not ours
            # to keep as it is; weight -1 makes the reconcile rewrite it.
            fwd = int(d.get_attr("IPVS_DEST_ATTR_FWD_METHOD") or 0) & 0x7
            weight = int(d.get_attr("IPVS_DEST_ATTR_WEIGHT") or 0) if fwd == FWD_MASQ else -1
            conns = Connections(
                int(d.get_attr("IPVS_DEST_ATTR_ACTIVE_CONNS") or 0),
                int(d.get_attr("IPVS_DEST_ATTR_INACT_CONNS") or 0),
            )
            out.append((RealServer(rk, weight), conns))
        return out

    def set_timeouts(self, tcp: int, tcp_fin: int, udp: int) -> None:
        from pyroute2.netlink.generic import ipvs as g

        class config(g.ipvsmsg):  # type: ignore[misc]
            nla_map = (
                ("IPVS_CMD_ATTR_UNSPEC", "none"),
                ("IPVS_CMD_ATTR_SERVICE", "hex"),
                ("IPVS_CMD_ATTR_DEST", "hex"),
                ("IPVS_CMD_ATTR_DAEMON", "hex"),
                ("IPVS_CMD_ATTR_TIMEOUT_TCP", "uint32"),
                ("IPVS_CMD_ATTR_TIMEOUT_TCP_FIN", "uint32"),
                ("IPVS_CMD_ATTR_TIMEOUT_UDP", "uint32"),
            )

        sock, fid = self._ipvs()
        msg = config()
        msg["cmd"] = g.IPVS_CMD_SET_CONFIG
        msg["version"] = 1
        msg["attrs"] = [
            ("IPVS_CMD_ATTR_TIMEOUT_TCP", tcp),
            ("IPVS_CMD_ATTR_TIMEOUT_TCP_FIN", tcp_fin),
            ("IPVS_CMD_ATTR_TIMEOUT_UDP", udp),
        ]
        self.requests_sent += 1
        code = sock.request(msg, fid)
        if code:
            raise BackendError(f"ipvsadm --set {tcp} {tcp_fin} {udp}: {os.strerror(code)}")

    # --- rtnetlink: the dummy link and its addresses ----------------------------------------

    def _link(self) -> int | None:
        """kube-ipvs0's index (None: no such link)."""
        if self._link_index is not None:
            return self._link_index
        from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

        msg = ifinfmsg()
        msg["attrs"] = [("IFLA_IFNAME", DUMMY_LINK)]
        self.requests_sent += 1
        try:
            (reply,) = self._sock(NETLINK_ROUTE).dump(msg, RTM_GETLINK, ifinfmsg, flags=0)
        except OSError as err:
            if err.errno in (errno.ENODEV, errno.ENOENT):
                return None
            raise BackendError(f"ip link show {DUMMY_LINK}: {err}") from err
        self._link_index = int(reply["index"])
        return self._link_index

    def _add_link(self) -> None:
        from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

        msg = ifinfmsg()
        # No queue, as upstream's (a link that is never up has no use for one).
        msg["attrs"] = [
            ("IFLA_IFNAME", DUMMY_LINK),
            ("IFLA_TXQLEN", 0),
            ("IFLA_LINKINFO", {"attrs": [("IFLA_INFO_KIND", "dummy")]}),
        ]
        self.requests_sent += 1
        code = self._sock(NETLINK_ROUTE).request(msg, RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL)
        # Both families' plans ensure the one link (as upstream's EnsureDummyDevice): the
        # first made it.
        if code and code != errno.EEXIST:
            raise BackendError(f"ip link add {DUMMY_LINK} type dummy: {os.strerror(code)}")
        self._link_index = None

    def delete_link(self) -> bool:
        index = self._link()
        if index is None:
            return False
        from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

        msg = ifinfmsg()
        msg["index"] = index
        self.requests_sent += 1
        code = self._sock(NETLINK_ROUTE).request(msg, RTM_DELLINK)
        self._link_index = None
        if code and code != errno.ENODEV:
            raise BackendError(f"ip link del {DUMMY_LINK}: {os.strerror(code)}")
        return not code

    def _addresses(self) -> list[tuple[int, str]]:
        """(link index, address) of every address on the node."""
        from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg

        msg = ifaddrmsg()
        msg["family"] = socket.AF_UNSPEC
        self.requests_sent += 1
        out = []
        for m in self._sock(NETLINK_ROUTE).dump(msg, RTM_GETADDR, ifaddrmsg):
            addr = m.get_attr("IFA_LOCAL") or m.get_attr("IFA_ADDRESS")
            if addr:
                out.append((int(m["index"]), str(ipaddress.ip_address(addr.split("%")[0]))))
        return out

    def interface_addresses(self) -> tuple[str, ...]:
        index = self._link()
        return tuple(dict.fromkeys(a for i, a in self._addresses() if i != index))

    # --- nfnetlink: ipsets ------------------------------------------------------------------

    def _ipset_msg(self, attrs: list[Any], family: int = socket.AF_INET) -> Any:
        from pyroute2.netlink.nfnetlink.ipset import ipset_msg

        msg = ipset_msg()
        msg["nfgen_family"] = family
        msg["attrs"] = [("IPSET_ATTR_PROTOCOL", self._ipset_protocol()), *attrs]
        return msg

    def _ipset_protocol(self) -> int:
        if not self._ipset_proto:
            from pyroute2.netlink.nfnetlink.ipset import IPSET_CMD_PROTOCOL, ipset_msg

            msg = ipset_msg()
            msg["nfgen_family"] = socket.AF_INET
            msg["attrs"] = [("IPSET_ATTR_PROTOCOL", 6)]
            self.requests_sent += 1
            (reply,) = self._sock(NETLINK_NETFILTER).dump(
                msg, (NFNL_SUBSYS_IPSET << 8) | IPSET_CMD_PROTOCOL, ipset_msg, flags=0
            )
            self._ipset_proto = int(reply.get_attr("IPSET_ATTR_PROTOCOL"))
        return self._ipset_proto

    def _revision(self, kind: str, family: int) -> int:
        got = self._revisions.get((kind, family))
        if got is None:
            from pyroute2.netlink.nfnetlink.ipset import IPSET_CMD_TYPE, ipset_msg

            msg = self._ipset_msg(
                [("IPSET_ATTR_TYPENAME", kind), ("IPSET_ATTR_FAMILY", family)], family
            )
            self.requests_sent += 1
            (reply,) = self._sock(NETLINK_NETFILTER).dump(
                msg, (NFNL_SUBSYS_IPSET << 8) | IPSET_CMD_TYPE, ipset_msg, flags=0
            )
            got = self._revisions[(kind, family)] = int(reply.get_attr("IPSET_ATTR_REVISION"))
        return got

    def list_sets(self, family: IPFamily) -> tuple[dict[str, IpsetSpec], dict[str, frozenset[str]]]:
        """The mode's sets of ``family`` (by name) and their entries."""
        from pyroute2.netlink.nfnetlink.ipset import IPSET_CMD_LIST, ipset_msg

        msg = self._ipset_msg([])
        self.requests_sent += 1
        try:
            answers = self._sock(NETLINK_NETFILTER).dump(
                msg, (NFNL_SUBSYS_IPSET << 8) | IPSET_CMD_LIST, ipset_msg
            )
        except OSError as err:
            raise BackendError(f"ipset list: {err}") from err
        specs: dict[str, IpsetSpec] = {}
        entries: dict[str, set[str]] = {}
        for m in answers:
            name = m.get_attr("IPSET_ATTR_SETNAME")
            kind = m.get_attr("IPSET_ATTR_TYPENAME")
            if not name or not ipsets.is_ours(name):
                continue
            fam = IPFamily.IPv6 if name.startswith("KUBE-6-") else IPFamily.IPv4
            if fam is not family:
                continue
            if kind:
                specs.setdefault(name, IpsetSpec(name, kind, fam))
            adt = m.get_attr("IPSET_ATTR_ADT")
            have = entries.setdefault(name, set())
            if adt is None or name not in specs:
                continue
            for data in adt.get_attrs("IPSET_ATTR_DATA"):
                have.add(entry_text(specs[name].kind, data))
        return specs, {n: frozenset(entries.get(n, ())) for n in specs}

    # --- the seam ---------------------------------------------------------------------------

    def dump(self, family: IPFamily, connections: bool = False) -> FamilyState:
        try:
            index = self._link()
            addresses = frozenset(a for i, a in self._addresses() if i == index and index)
            addresses = frozenset(a for a in addresses if (":" in a) == (family is IPFamily.IPv6))
            virtual, real, conns = {}, {}, {}
            for proto, svc in self._services(family):
                vs = self._virtual(proto, svc)
                virtual[vs.key] = vs
                dests = self._dests(vs.key, family)
                real[vs.key] = {r.key: r for r, _ in dests}
                if connections:
                    conns.update({(vs.key, r.key): c for r, c in dests})
            specs, entries = self.list_sets(family)
        except OSError as err:
            raise BackendError(f"reading IPVS state ({family.value}): {err}") from err
        return FamilyState(
            family,
            virtual=virtual,
            real=real,
            addresses=addresses,
            link=index is not None,
            ipsets=specs,
            entries=entries,
            connections=conns,
        )

    def connections(
        self, family: IPFamily, reals: Sequence[tuple[VirtualKey, RealKey]]
    ) -> Mapping[tuple[VirtualKey, RealKey], Connections]:
        wanted: dict[VirtualKey, set[RealKey]] = {}
        for vk, rk in reals:
            wanted.setdefault(vk, set()).add(rk)
        out = {}
        for vk, rks in wanted.items():
            try:
                dests = self._dests(vk, family)
            except OSError:  # the service is gone: so are its real servers
                continue
            out.update({(vk, r.key): c for r, c in dests if r.key in rks})
        return out

    def send(self, family: IPFamily, ops: Sequence[Op]) -> int:
        sent = 0
        i = 0
        while i < len(ops):
            kind = ops[i].kind
            if kind == "add-link":
                self._add_link()
                sent += 1
                i += 1
                continue
            group = _group(kind)
            j = i
            while j < len(ops) and _group(ops[j].kind) == group:
                j += 1
            batch = ops[i:j]
            if group == "address":
                index = self._link()
                if index is None:
                    raise BackendError(f"{batch[0]}: Cannot find device {DUMMY_LINK!r}")
                sock = self._sock(NETLINK_ROUTE)
                reqs = [netlink.address_request(o, index) for o in batch]
            elif group == "ipset":
                sock = self._sock(NETLINK_NETFILTER)
                proto = self._ipset_protocol()
                reqs = [
                    netlink.ipset_request(
                        o,
                        proto,
                        self._revision(o.ipset.kind, _af(o.ipset.family))
                        if o.kind == "create-set" and o.ipset is not None
                        else 0,
                    )
                    for o in batch
                ]
            else:
                sock, fid = self._ipvs()
                reqs = [(netlink.ipvs_payload(o), fid, netlink.ipvs_flags(o)) for o in batch]
            codes = sock.requests(reqs)
            sent += len(reqs)
            self.requests_sent += len(reqs)
            for o, code in zip(batch, codes, strict=True):
                if code:
                    raise BackendError(f"{o}: {_strerror(group, code)}")
            i = j
        return sent

    def save(self, family: IPFamily, table: str | None = None, counters: bool = False) -> str:
        return self.iptables.save(family, table, counters)

    def restore(self, family: IPFamily, text: str) -> None:
        self.iptables.restore(family, text)

    def sysctl(self, key: str, value: str) -> None:
        """Through /proc/sys where this process sees the namespace's, else the sysctl tool."""
        path = "/proc/sys/" + key.replace(".", "/")
        if self.netns is None:
            try:
                with open(path) as f:
                    if f.read().strip() == value:
                        return
                with open(path, "w") as f:
                    f.write(value)
                return
            except OSError as err:
                raise BackendError(f"sysctl {key}={value}: {err}") from err
        self.iptables.sysctl(key, value)

    def missing(self, scheduler: str) -> list[str]:
        """In the words of the trust list's own check (so the two say each lack once). The
        kernel asks for ip_vs, dummy and ip_set by their aliases, a scheduler by its name."""
        release = platform.release()
        wanted = {m: True for m in ("ip_vs", "dummy", "ip_set")}
        wanted[f"ip_vs_{scheduler or 'rr'}"] = False
        return [
            why
            for m, on_demand in wanted.items()
            if (why := module_unavailable(m, release, on_demand=on_demand))
        ]


def _group(kind: str) -> str:
    if kind.endswith("-address"):
        return "address"
    if kind.endswith("-set") or kind.endswith("-entry"):
        return "ipset"
    return "ipvs"


_IPVS_ERRORS = {
    errno.EEXIST: "already exists",
    errno.ESRCH: "No such service",
    errno.ENOENT: "No such destination (or scheduler not found)",
}
_IPSET_ERRORS = {
    4103: "Element cannot be added/deleted: it's already added/not added",
    4101: "Set cannot be created: set with the same name already exists",
    4100: "Set cannot be destroyed: it is in use by a kernel component",
    4098: "Kernel error received: set type not supported",
}


def _strerror(group: str, code: int) -> str:
    if group == "ipset" and code in _IPSET_ERRORS:
        return _IPSET_ERRORS[code]
    if group == "ipvs" and code in _IPVS_ERRORS:
        return _IPVS_ERRORS[code]
    try:
        return os.strerror(code)
    except ValueError:
        return f"error {code}"


# --- ipset entries: text <-> attributes -------------------------------------------------------


def _ip_of(nested: Any) -> str:
    value = nested.get_attr("IPSET_ATTR_IPADDR_IPV4") or nested.get_attr("IPSET_ATTR_IPADDR_IPV6")
    return str(ipaddress.ip_address(value))


def _get(data: Any, *names: str) -> Any:
    """An attribute by any of its names (pyroute2 decodes a shared number as the last one)."""
    for n in names:
        v = data.get_attr(n)
        if v is not None:
            return v
    return None


def entry_text(kind: str, data: Any) -> str:
    """A listed entry's attributes in ipset's syntax (as ``ipset save`` and the render)."""
    port = _get(data, "IPSET_ATTR_PORT", "IPSET_ATTR_PORT_FROM")
    if kind == "bitmap:port":
        return str(port)
    out = _ip_of(_get(data, "IPSET_ATTR_IP", "IPSET_ATTR_IP_FROM"))
    if "port" in kind:
        proto = _PROTO_NAME.get(int(data.get_attr("IPSET_ATTR_PROTO") or 0), "tcp")
        out += f",{proto}:{port}"
    if kind == "hash:ip,port,ip":
        out += f",{_ip_of(data.get_attr('IPSET_ATTR_IP2'))}"
    elif kind == "hash:ip,port,net":
        ip2 = _ip_of(data.get_attr("IPSET_ATTR_IP2"))
        cidr = data.get_attr("IPSET_ATTR_CIDR2")
        out += f",{ipaddress.ip_network(f'{ip2}/{cidr}')}"
    return out
