"""An in-memory IPVS kernel: virtual services, real servers, the dummy link, ipsets, iptables.

``FakeIpvs`` is a complete ``IpvsSeam`` (the ipvs mode's kernel seam, ``kubeplex.backends.ipvs``)
for tests and plugin authors. It keeps what the kernel would keep, per IP family:

* IPVS virtual services and their real servers, with connection counts you set by hand
  (``set_connections``) where the kernel would count traffic;
* the ``kube-ipvs0`` dummy link (absent until an ``add-link``) and its addresses;
* ipsets: created with a type and family, entries checked against the type's syntax
  (``hash:ip,port`` takes ``10.96.0.10,tcp:80``; ``hash:ip,port,ip`` a second address;
  ``hash:ip,port,net`` a second network; ``hash:ip`` an address; ``bitmap:port`` a port);
* iptables through a ``FakeIptables`` (``self.iptables``; see its own documentation).

It refuses what the kernel refuses, with the messages ipvsadm, ipset and ip print: adding a
service, real server, address, set, entry or link that exists; deleting or editing one that
does not; a real server or address of the other family; a scheduler this kernel lacks
(``schedulers``); destroying a set an iptables rule still names (``--match-set``); an entry of
the wrong syntax or family. ``send`` applies the operations in order and stops at the first
refused one (those before it stay), raising ``BackendError`` that names it.

Every operation received is logged (``sent``, refused ones too) and ``requests`` counts them
(one netlink request each, as the real kernel seam counts). What it cannot model: packets (no
connection is ever counted unless set), scheduling, timeouts (``timeouts`` records what was
set), and the kernel's module loading (``missing`` reports what ``lacking`` lists).

Usage::

    from kubeplex.core.dataplane.backend import BackendContext
    from kubeplex.testing.fakes import FakeIpvs

    kernel = FakeIpvs(addresses=("172.18.0.2",))
    backend = plugin_class(BackendContext(config, "node-1", kernel=kernel))
    backend.sync(state)
    print("\\n".join(kernel.dump(IPFamily.IPv4).lines()))   # as ip, ipset save, ipvsadm -S
    kernel.set_connections(IPFamily.IPv4, "-t 10.96.0.10:80", "10.244.1.5:8080", active=1)

The state objects it returns (``FamilyState``, ``Connections``) are the ipvs backend's own data
types, reached through its entry point (the test kit imports no backend directly).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from kubeplex.core.dataplane import plugins
from kubeplex.core.model.errors import BackendError
from kubeplex.core.model.types import IPFamily
from kubeplex.testing.fakes.iptables import FakeIptables

_PROTO = r"(tcp|udp|sctp)"
_PORT = r"(\d{1,5})"
#: Entry syntax per set type: the address parts, as ipset reads them.
_SYNTAX = {
    "hash:ip": re.compile(r"^(?P<ip>[^,]+)$"),
    "hash:ip,port": re.compile(rf"^(?P<ip>[^,]+),{_PROTO}:{_PORT}$"),
    "hash:ip,port,ip": re.compile(rf"^(?P<ip>[^,]+),{_PROTO}:{_PORT},(?P<ip2>[^,/]+)$"),
    "hash:ip,port,net": re.compile(rf"^(?P<ip>[^,]+),{_PROTO}:{_PORT},(?P<net>[^,]+/\d+)$"),
    "bitmap:port": re.compile(rf"^{_PORT}$"),
}
#: The schedulers of a stock kernel's ip_vs modules.
SCHEDULERS = frozenset(
    {"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "fo", "ovf", "mh", "twos"}
)


def _plan() -> Any:
    """The ipvs backend's data types (its ``plan`` module), through its entry point."""
    return plugins.load_backend_class("ipvs").plan  # type: ignore[attr-defined]


def _family_of(ip: str) -> IPFamily:
    return IPFamily.IPv6 if ":" in ip else IPFamily.IPv4


@dataclass
class _Family:
    services: dict[Any, Any] = field(default_factory=dict)
    reals: dict[Any, dict[Any, Any]] = field(default_factory=dict)
    conns: dict[tuple[Any, Any], tuple[int, int]] = field(default_factory=dict)


class FakeIpvs:
    """See the module's documentation."""

    writes: ClassVar[tuple[str, ...]] = ("send", "restore")

    def __init__(
        self,
        iptables: FakeIptables | None = None,
        *,
        addresses: tuple[str, ...] = (),
        schedulers: frozenset[str] = SCHEDULERS,
        lacking: Sequence[str] = (),
        types: Any = None,
    ) -> None:
        self.iptables = iptables if iptables is not None else FakeIptables(addresses=addresses)
        self.schedulers = schedulers
        #: What ``missing`` reports (e.g. "kernel module 'ip_vs' ...").
        self.lacking = list(lacking)
        self._types = types
        self.families: dict[IPFamily, _Family] = {f: _Family() for f in IPFamily}
        self.link = False
        self.link_addresses: set[str] = set()
        self.sets: dict[str, Any] = {}
        self.entries: dict[str, set[str]] = {}
        #: Every operation received, as its command line ("! " before a refused one).
        self.sent: list[str] = []
        self.requests = 0
        self.timeouts: tuple[int, int, int] = (900, 120, 300)
        self.sysctls = self.iptables.sysctls

    @property
    def types(self) -> Any:
        if self._types is None:
            self._types = _plan()
        return self._types

    # --- reads ------------------------------------------------------------------------------

    def dump(self, family: IPFamily, connections: bool = False) -> Any:
        t = self.types
        fam = self.families[family]
        conns = {}
        if connections:
            conns = {
                (vk, rk): t.Connections(*fam.conns.get((vk, rk), (0, 0)))
                for vk, reals in fam.reals.items()
                for rk in reals
            }
        sets = {n: s for n, s in self.sets.items() if s.family is family}
        return t.FamilyState(
            family,
            virtual=dict(fam.services),
            real={k: dict(v) for k, v in fam.reals.items()},
            addresses=frozenset(a for a in self.link_addresses if _family_of(a) is family),
            link=self.link,
            ipsets=sets,
            entries={n: frozenset(self.entries[n]) for n in sets},
            connections=conns,
        )

    def connections(self, family: IPFamily, reals: Sequence[tuple[Any, Any]]) -> Mapping[Any, Any]:
        t = self.types
        fam = self.families[family]
        self.requests += len({vk for vk, _ in reals})
        out = {}
        for vk, rk in reals:
            if rk in fam.reals.get(vk, {}):
                a, i = fam.conns.get((vk, rk), (0, 0))
                out[(vk, rk)] = t.Connections(a, i)
        return out

    def set_connections(
        self, family: IPFamily, service: str, real: str, active: int = 0, inactive: int = 0
    ) -> None:
        """Set a real server's connection counts; ``service`` as ipvsadm prints its key
        (``-t 10.96.0.10:80``), ``real`` as ``ip:port``."""
        fam = self.families[family]
        for vk, reals in fam.reals.items():
            if str(vk) == service:
                for rk in reals:
                    if str(rk) == real:
                        fam.conns[(vk, rk)] = (active, inactive)
                        return
        raise KeyError(f"no real server {real} of {service}")

    def interface_addresses(self) -> tuple[str, ...]:
        return tuple(a for a in self.iptables.interface_addresses() if a not in self.link_addresses)

    def save(self, family: IPFamily, table: str | None = None, counters: bool = False) -> str:
        return self.iptables.save(family, table, counters)

    def missing(self, scheduler: str) -> list[str]:
        out = list(self.lacking)
        if scheduler and scheduler not in self.schedulers:
            out.append(f"kernel module 'ip_vs_{scheduler}' is not loaded, built in or loadable")
        return out

    # --- writes -----------------------------------------------------------------------------

    def restore(self, family: IPFamily, text: str) -> None:
        self.iptables.restore(family, text)

    def sysctl(self, key: str, value: str) -> None:
        self.iptables.sysctl(key, value)

    def set_timeouts(self, tcp: int, tcp_fin: int, udp: int) -> None:
        """As the kernel: 0 leaves a timeout as it is."""
        old = self.timeouts
        self.timeouts = (tcp or old[0], tcp_fin or old[1], udp or old[2])

    def delete_link(self) -> bool:
        existed = self.link
        self.link = False
        self.link_addresses.clear()
        return existed

    def send(self, family: IPFamily, ops: Sequence[Any]) -> int:
        for i, op in enumerate(ops):
            self.requests += 1
            try:
                self._one(family, op)
            except _Refused as err:
                self.sent.append(f"! {op}")
                raise BackendError(f"{op}: {err} ({i} of {len(ops)} operations applied)") from None
            self.sent.append(str(op))
        return len(ops)

    def _one(self, family: IPFamily, op: Any) -> None:
        k: str = op.kind
        if op.family is not family:
            raise _Refused(f"operation of {op.family.value} sent as {family.value}")
        if k == "add-link":
            # Ensures the one link both families share (the kernel seam takes "exists").
            self.link = True
        elif k in ("add-address", "del-address"):
            self._address(family, k, op.address)
        elif k in ("create-set", "destroy-set", "add-entry", "del-entry"):
            self._ipset(family, k, op.ipset, op.entry)
        else:
            self._ipvs(family, k, op)

    def _address(self, family: IPFamily, kind: str, addr: str) -> None:
        if not self.link:
            raise _Refused('Cannot find device "kube-ipvs0"')
        ip = str(ipaddress.ip_address(addr))
        if _family_of(ip) is not family:
            raise _Refused("RTNETLINK answers: Address family not supported")
        if kind == "add-address":
            if ip in self.link_addresses:
                raise _Refused("RTNETLINK answers: File exists")
            self.link_addresses.add(ip)
        else:
            if ip not in self.link_addresses:
                raise _Refused("RTNETLINK answers: Cannot assign requested address")
            self.link_addresses.discard(ip)

    def _ipset(self, family: IPFamily, kind: str, spec: Any, entry: str) -> None:
        name = spec.name
        if kind == "create-set":
            if name in self.sets:
                raise _Refused("Set cannot be created: set with the same name already exists")
            if spec.kind not in _SYNTAX:
                raise _Refused(f"Unknown set type {spec.kind}")
            self.sets[name] = spec
            self.entries[name] = set()
            return
        if name not in self.sets:
            raise _Refused("The set with the given name does not exist")
        if kind == "destroy-set":
            for fam in IPFamily:
                if f"--match-set {name} " in self.iptables.save(fam):
                    raise _Refused("Set cannot be destroyed: it is in use by a kernel component")
            del self.sets[name]
            del self.entries[name]
            return
        self._check_entry(self.sets[name], entry)
        have = self.entries[name]
        if kind == "add-entry":
            if entry in have:
                raise _Refused("Element cannot be added to the set: it's already added")
            have.add(entry)
        else:
            if entry not in have:
                raise _Refused("Element cannot be deleted from the set: it's not added")
            have.discard(entry)

    def _check_entry(self, spec: Any, entry: str) -> None:
        m = _SYNTAX[spec.kind].match(entry)
        if m is None:
            raise _Refused(f"Syntax error: '{entry}' is not an entry of {spec.kind}")
        parts = m.groupdict()
        try:
            ips = [ipaddress.ip_address(parts[p]) for p in ("ip", "ip2") if parts.get(p)]
            if parts.get("net"):
                ips.append(ipaddress.ip_network(parts["net"]).network_address)
        except ValueError:
            raise _Refused(f"Syntax error: '{entry}' is not an entry of {spec.kind}") from None
        want = 6 if spec.family is IPFamily.IPv6 else 4
        if any(ip.version != want for ip in ips):
            raise _Refused(f"Syntax error: '{entry}': address family of the set is {want}")
        ports = [int(g) for g in m.groups() if g and g.isdigit()]
        if any(p > 65535 for p in ports):
            raise _Refused(f"Syntax error: '{entry}': port out of range")

    def _ipvs(self, family: IPFamily, kind: str, op: Any) -> None:
        fam = self.families[family]
        key = op.service.key if op.service is not None else op.key
        if _family_of(key.address) is not family:
            raise _Refused("Address family not supported")
        if kind == "add-service":
            if key in fam.services:
                raise _Refused("Service already exists")
            self._check_service(op.service)
            fam.services[key] = op.service
            fam.reals[key] = {}
            return
        if key not in fam.services:
            raise _Refused("No such service")
        if kind == "edit-service":
            self._check_service(op.service)
            fam.services[key] = op.service
            return
        if kind == "del-service":
            del fam.services[key]
            for rk in fam.reals.pop(key, {}):
                fam.conns.pop((key, rk), None)
            return
        real = op.real
        reals = fam.reals[key]
        if _family_of(real.key.address) is not family:
            raise _Refused("Address family not supported")
        if kind == "add-real":
            if real.key in reals:
                raise _Refused("Destination already exists")
            reals[real.key] = real
        elif real.key not in reals:
            raise _Refused("No such destination")
        elif kind == "edit-real":
            reals[real.key] = real
        else:
            del reals[real.key]
            fam.conns.pop((key, real.key), None)

    def _check_service(self, service: Any) -> None:
        if service.scheduler not in self.schedulers:
            raise _Refused("Scheduler not found")


class _Refused(Exception):
    pass
