"""The IPVS mode's state and plan as data: what the render wants, what the kernel holds, and the
operations between them.

Three kinds of kernel objects, each printed the way its own tool prints or reads it, so an
operator who knows upstream's IPVS mode can read a plan as they read ``ipvsadm -S -n``,
``ipset save`` and ``ip addr``:

* IPVS virtual services and their real servers (``VirtualServer``, ``RealServer``);
* addresses bound to the ``kube-ipvs0`` dummy link (every ClusterIP, externalIP and
  LoadBalancer ingress IP, as /32 or /128);
* ipsets (``IpsetSpec`` and their entries), which the fixed iptables rules match.

``FamilyState`` is one IP family's whole state of these (desired, or as the kernel holds it).
A sync's plan (``FamilyPlan``) is the difference between the two: the operations before the
iptables rules are restored (creations and additions, so the rules find the sets they name),
the rules, then the removals (after the rules no longer name what goes). Nothing is rebuilt:
an unchanged object is not in the plan.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import ClassVar, Literal, Protocol

from kubeplex.core.dataplane.backend import Rendered
from kubeplex.core.model.types import IPFamily
from kubeplex.core.model.types import Protocol as L4

#: The name of the dummy link that holds the service addresses, as upstream's.
DUMMY_LINK = "kube-ipvs0"
#: The API server's default NodePort range: a virtual service on a node address is the mode's
#: only in it (or when the render wants it), so a foreign one on another port stays.
NODE_PORTS = range(30000, 32768)

#: ipvsadm's option for a virtual service of each protocol.
_SERVICE_FLAG = {L4.TCP: "-t", L4.UDP: "-u", L4.SCTP: "--sctp-service"}


def host_port(ip: str, port: int) -> str:
    """``ip:port``, ``[ip]:port`` for IPv6 (as ipvsadm prints them)."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


# --- IPVS -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, order=True)
class VirtualKey:
    """What identifies a virtual service: protocol, address and port."""

    protocol: L4
    address: str
    port: int

    def __str__(self) -> str:
        return f"{_SERVICE_FLAG[self.protocol]} {host_port(self.address, self.port)}"


@dataclass(frozen=True, slots=True)
class VirtualServer:
    """One IPVS virtual service (``ipvsadm -A``)."""

    key: VirtualKey
    scheduler: str = "rr"
    #: Persistence (sessionAffinity ClientIP) timeout in seconds; 0: none.
    persistence: int = 0
    #: Scheduler flags (``--sched-flags``), e.g. ``flag-1`` (sh-fallback), ``flag-2`` (sh-port).
    flags: tuple[str, ...] = ()

    def options(self) -> str:
        out = f"{self.key} -s {self.scheduler}"
        if self.flags:
            out += f" -b {','.join(self.flags)}"
        if self.persistence:
            out += f" -p {self.persistence}"
        return out

    def __str__(self) -> str:
        return f"-A {self.options()}"


@dataclass(frozen=True, slots=True, order=True)
class RealKey:
    """What identifies a real server within its virtual service."""

    address: str
    port: int

    def __str__(self) -> str:
        return host_port(self.address, self.port)


@dataclass(frozen=True, slots=True)
class RealServer:
    """One real server of a virtual service, always masquerading (``ipvsadm -a ... -m``)."""

    key: RealKey
    weight: int = 1

    def options(self, vs: VirtualKey) -> str:
        return f"{vs} -r {self.key} -m -w {self.weight}"


@dataclass(frozen=True, slots=True)
class Connections:
    """A real server's connection counts, as the kernel reports them."""

    active: int = 0
    inactive: int = 0


# --- ipsets ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IpsetSpec:
    """One ipset as upstream creates it (its comment is the one its iptables rules carry)."""

    name: str
    #: ``hash:ip,port``, ``hash:ip,port,ip``, ``hash:ip,port,net``, ``hash:ip``, ``bitmap:port``.
    kind: str
    family: IPFamily
    comment: str = ""

    def create_line(self) -> str:
        """The ``ipset restore`` line that creates it."""
        if self.kind.startswith("bitmap:"):
            return f"create {self.name} {self.kind} range 0-65535"
        fam = "inet6" if self.family is IPFamily.IPv6 else "inet"
        return f"create {self.name} {self.kind} family {fam} hashsize 1024 maxelem 65536"


# --- a family's whole state -----------------------------------------------------------------


@dataclass(frozen=True)
class FamilyState:
    """One IP family's IPVS objects: desired (a render) or held (the kernel, or what the last
    apply left there)."""

    family: IPFamily
    virtual: Mapping[VirtualKey, VirtualServer] = field(default_factory=dict)
    real: Mapping[VirtualKey, Mapping[RealKey, RealServer]] = field(default_factory=dict)
    #: Addresses on the dummy link (normalized, without prefix length).
    addresses: Set[str] = frozenset()
    #: Whether the dummy link exists (always true in a desired state).
    link: bool = True
    ipsets: Mapping[str, IpsetSpec] = field(default_factory=dict)
    #: Entries per ipset, in ipset's own syntax (``10.96.0.10,tcp:53``, ``30080``).
    entries: Mapping[str, Set[str]] = field(default_factory=dict)
    #: Connection counts per real server (kernel states only; empty in a desired state).
    connections: Mapping[tuple[VirtualKey, RealKey], Connections] = field(default_factory=dict)

    def lines(self) -> list[str]:
        """The state as ``ip``, ``ipset save`` and ``ipvsadm -S -n`` would show it."""
        out = [f"link {DUMMY_LINK}" + ("" if self.link else " (absent)")]
        out += [f"addr {a}" for a in sorted(self.addresses)]
        for name in sorted(self.ipsets):
            out.append(self.ipsets[name].create_line())
            out += [f"add {name} {e}" for e in sorted(self.entries.get(name, ()))]
        for key in sorted(self.virtual):
            out.append(str(self.virtual[key]))
            reals = self.real.get(key, {})
            out += [f"-a {reals[rk].options(key)}" for rk in sorted(reals)]
        return out


# --- operations -----------------------------------------------------------------------------

OpKind = Literal[
    "add-link",
    "add-address",
    "del-address",
    "create-set",
    "add-entry",
    "del-entry",
    "destroy-set",
    "add-service",
    "edit-service",
    "del-service",
    "add-real",
    "edit-real",
    "del-real",
]


@dataclass(frozen=True, slots=True)
class Op:
    """One change to the kernel; ``str()`` is the command line that would make it by hand.

    Fields by kind: ``service`` for *-service; ``key`` + ``real`` for *-real (``real`` holds
    the new weight for edit-real, the old server for del-real); ``address`` for *-address;
    ``ipset`` (+ ``entry``) for the set kinds; nothing for add-link, which ensures the one
    link both families share (a link that exists is no error).
    """

    kind: OpKind
    family: IPFamily
    key: VirtualKey | None = None
    service: VirtualServer | None = None
    real: RealServer | None = None
    address: str = ""
    ipset: IpsetSpec | None = None
    entry: str = ""

    def __str__(self) -> str:
        k = self.kind
        if k == "add-link":
            return f"ip link add {DUMMY_LINK} type dummy"
        if k in ("add-address", "del-address"):
            plen = 128 if ":" in self.address else 32
            verb = "add" if k == "add-address" else "del"
            return f"ip addr {verb} {self.address}/{plen} dev {DUMMY_LINK}"
        if k in ("create-set", "destroy-set", "add-entry", "del-entry"):
            assert self.ipset is not None
            if k == "create-set":
                return f"ipset {self.ipset.create_line()}"
            if k == "destroy-set":
                return f"ipset destroy {self.ipset.name}"
            verb = "add" if k == "add-entry" else "del"
            return f"ipset {verb} {self.ipset.name} {self.entry}"
        if k in ("add-service", "edit-service"):
            assert self.service is not None
            return f"ipvsadm {'-A' if k == 'add-service' else '-E'} {self.service.options()}"
        if k == "del-service":
            assert self.key is not None
            return f"ipvsadm -D {self.key}"
        assert self.key is not None and self.real is not None
        if k == "del-real":
            return f"ipvsadm -d {self.key} -r {self.real.key}"
        return f"ipvsadm {'-a' if k == 'add-real' else '-e'} {self.real.options(self.key)}"


# --- the plan -------------------------------------------------------------------------------


@dataclass(frozen=True)
class FamilyPlan:
    """One family's part of a sync, in the order apply sends it."""

    family: IPFamily
    full: bool
    #: Creations and additions (link, sets and entries, services, real servers, addresses).
    before: tuple[Op, ...] = ()
    #: The fixed iptables rules (``iptables-restore --noflush`` input); None: unchanged.
    iptables: str | None = None
    #: Removals, once the rules no longer name them (real servers, services, addresses,
    #: entries, sets).
    after: tuple[Op, ...] = ()
    #: The state the kernel holds once this plan is applied (the next partial sync's base).
    result: FamilyState | None = field(default=None, compare=False, repr=False)

    def ops(self) -> tuple[Op, ...]:
        return self.before + self.after


@dataclass(frozen=True)
class IpvsRendered(Rendered):
    plans: tuple[FamilyPlan, ...]

    @property
    def full(self) -> bool:
        return any(p.full for p in self.plans)

    def kernel_inputs(self) -> Sequence[str]:
        out: list[str] = []
        for p in self.plans:
            out += [str(op) for op in p.before]
            if p.iptables is not None:
                out.append(p.iptables)
            out += [str(op) for op in p.after]
        return out

    def __str__(self) -> str:
        parts = []
        for p in self.plans:
            parts.append(f"# {p.family.value} ({'full' if p.full else 'partial'})\n")
            parts += [f"{op}\n" for op in p.before]
            if p.iptables is not None:
                parts.append(f"# iptables-restore --noflush ({p.family.value})\n{p.iptables}")
            parts += [f"{op}\n" for op in p.after]
        return "".join(parts)


# --- the kernel seam ------------------------------------------------------------------------


class IpvsSeam(Protocol):
    """A node's IPVS, dummy link, ipsets and iptables, both families (the real one talks
    netlink through pyroute2 and runs iptables-restore; ``kubeplex.testing.fakes`` has an
    in-memory one)."""

    #: The methods through which a sync writes.
    writes: ClassVar[tuple[str, ...]]

    def dump(self, family: IPFamily, connections: bool = False) -> FamilyState:
        """What the kernel holds of ``family``: every virtual service and real server, the
        dummy link's addresses, the KUBE-* ipsets and their entries (with connection counts
        if asked)."""
        ...

    def connections(
        self, family: IPFamily, reals: Sequence[tuple[VirtualKey, RealKey]]
    ) -> Mapping[tuple[VirtualKey, RealKey], Connections]:
        """Connection counts of these real servers only (graceful termination's check)."""
        ...

    def send(self, family: IPFamily, ops: Sequence[Op]) -> int:
        """Apply ``ops`` in order; the number of netlink requests it took. BackendError (with
        the failed op) if the kernel refused one; those before it stay applied."""
        ...

    def save(self, family: IPFamily, table: str | None = None, counters: bool = False) -> str:
        """``iptables-save`` of ``family`` (see ``IptablesSeam.save``)."""
        ...

    def restore(self, family: IPFamily, text: str) -> None:
        """``iptables-restore --noflush`` of ``family`` (see ``IptablesSeam.restore``)."""
        ...

    def interface_addresses(self) -> tuple[str, ...]:
        """Every address on the node's interfaces but the dummy link's."""
        ...

    def sysctl(self, key: str, value: str) -> None:
        """Set a sysctl if it differs."""
        ...

    def missing(self, scheduler: str) -> list[str]:
        """What this kernel lacks for the mode with ``scheduler`` (ip_vs and the scheduler's
        module, dummy links, ipset), one line each; empty: ready."""
        ...

    def set_timeouts(self, tcp: int, tcp_fin: int, udp: int) -> None:
        """IPVS's connection timeouts in seconds (``ipvsadm --set``); 0 leaves one as it is."""
        ...

    def delete_link(self) -> bool:
        """Delete the dummy link (with its addresses); whether it existed."""
        ...
