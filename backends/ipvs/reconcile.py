"""Reconcile, never rebuild: the desired state against what the kernel holds -> one family's plan.

Pure. A full sync diffs everything the render wants against what the kernel holds (the
observed dump, or nothing when rendering without an observation); a partial sync diffs only the
keys the changed services touched (``Desired.touched_*``) against the state the previous apply
left (``Held``, kept by the backend), plus the real servers waiting for their connections to
close, so a one-endpoint change costs the same few operations whatever the cluster's size.

What is ours, as upstream's ``cleanLegacyService``: a virtual service whose address is bound to
kube-ipvs0 (or wanted there) or is one NodePorts are served on, and not in ``ipvs.excludeCIDRs``;
anything else the kernel holds (another load balancer's services, another program's ipsets) is
never touched. Sets are created, never destroyed by a sync (upstream keeps every set it knows);
``cleanup`` destroys them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Protocol

from kubeplex.backends.ipvs.plan import (
    NODE_PORTS,
    Connections,
    FamilyPlan,
    FamilyState,
    IpsetSpec,
    Op,
    OpKind,
    RealKey,
    RealServer,
    VirtualKey,
    VirtualServer,
)
from kubeplex.backends.ipvs.termination import BOUND, Real, Terminating, expired
from kubeplex.core.model.types import IPFamily

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

#: The order operations are sent in: creations and additions before the iptables rules...
BEFORE: tuple[OpKind, ...] = (
    "add-link",
    "create-set",
    "add-entry",
    "add-service",
    "edit-service",
    "add-real",
    "edit-real",
    "add-address",
)
#: ... removals after them, once no rule names what goes.
AFTER: tuple[OpKind, ...] = ("del-real", "del-service", "del-address", "del-entry", "destroy-set")


class Desired(Protocol):
    """What the renderer hands over for one family (its ``DesiredUpdate``)."""

    @property
    def full(self) -> bool: ...
    @property
    def state(self) -> FamilyState: ...
    @property
    def touched_virtual(self) -> AbstractSet[VirtualKey]: ...
    @property
    def touched_addresses(self) -> AbstractSet[str]: ...
    @property
    def touched_entries(self) -> AbstractSet[tuple[str, str]]: ...
    @property
    def iptables(self) -> str: ...


class Holding(Protocol):
    """What the kernel holds of one family: a ``FamilyState`` or a ``Held``."""

    @property
    def family(self) -> IPFamily: ...
    @property
    def link(self) -> bool: ...
    @property
    def virtual(self) -> Mapping[VirtualKey, VirtualServer]: ...
    @property
    def real(self) -> Mapping[VirtualKey, Mapping[RealKey, RealServer]]: ...
    @property
    def addresses(self) -> AbstractSet[str]: ...
    @property
    def ipsets(self) -> Mapping[str, IpsetSpec]: ...
    @property
    def entries(self) -> Mapping[str, AbstractSet[str]]: ...


@dataclass
class Held:
    """The state of one family the last apply left in the kernel, mutable: a partial sync's
    base, updated by each applied plan's operations (never copied on a partial sync)."""

    family: IPFamily
    link: bool = False
    virtual: dict[VirtualKey, VirtualServer] = field(default_factory=dict)
    real: dict[VirtualKey, dict[RealKey, RealServer]] = field(default_factory=dict)
    addresses: set[str] = field(default_factory=set)
    ipsets: dict[str, IpsetSpec] = field(default_factory=dict)
    entries: dict[str, set[str]] = field(default_factory=dict)

    @classmethod
    def of(cls, state: Holding) -> Held:
        return cls(
            state.family,
            state.link,
            dict(state.virtual),
            {k: dict(v) for k, v in state.real.items()},
            set(state.addresses),
            dict(state.ipsets),
            {k: set(v) for k, v in state.entries.items()},
        )

    def apply(self, ops: Iterable[Op]) -> None:
        """What the kernel holds once ``ops`` are applied."""
        for op in ops:
            k = op.kind
            if k == "add-link":
                self.link = True
            elif k == "add-address":
                self.addresses.add(op.address)
            elif k == "del-address":
                self.addresses.discard(op.address)
            elif k == "create-set" and op.ipset is not None:
                self.ipsets[op.ipset.name] = op.ipset
                self.entries.setdefault(op.ipset.name, set())
            elif k == "destroy-set" and op.ipset is not None:
                self.ipsets.pop(op.ipset.name, None)
                self.entries.pop(op.ipset.name, None)
            elif k == "add-entry" and op.ipset is not None:
                self.entries.setdefault(op.ipset.name, set()).add(op.entry)
            elif k == "del-entry" and op.ipset is not None:
                self.entries.get(op.ipset.name, set()).discard(op.entry)
            elif k in ("add-service", "edit-service") and op.service is not None:
                self.virtual[op.service.key] = op.service
                self.real.setdefault(op.service.key, {})
            elif k == "del-service" and op.key is not None:
                self.virtual.pop(op.key, None)
                self.real.pop(op.key, None)
            elif k in ("add-real", "edit-real") and op.key is not None and op.real is not None:
                self.real.setdefault(op.key, {})[op.real.key] = op.real
            elif k == "del-real" and op.key is not None and op.real is not None:
                self.real.get(op.key, {}).pop(op.real.key, None)

    def state(self) -> FamilyState:
        """A frozen copy (O(size): for tests and full syncs)."""
        return FamilyState(
            self.family,
            dict(self.virtual),
            {k: dict(v) for k, v in self.real.items()},
            frozenset(self.addresses),
            self.link,
            dict(self.ipsets),
            {k: frozenset(v) for k, v in self.entries.items()},
        )


@dataclass(frozen=True)
class Ownership:
    """Which of the kernel's virtual services a sync may change or delete."""

    #: ``ipvs.excludeCIDRs``: virtual services in these ranges are never deleted.
    exclude: tuple[Network, ...] = ()
    #: Addresses NodePorts are served on (the node's), beside kube-ipvs0's.
    node_addresses: frozenset[str] = frozenset()

    def excluded(self, address: str) -> bool:
        ip = ipaddress.ip_address(address)
        return any(ip.version == n.version and ip in n for n in self.exclude)


@dataclass(frozen=True)
class Reconciled:
    """One family's plan, and the terminating list once it is applied."""

    plan: FamilyPlan
    terminating: Terminating
    #: The kernel's state after the plan (full syncs only; a partial one updates ``Held``).
    held: Held | None = None


def empty(family: IPFamily) -> FamilyState:
    """A kernel without anything of the mode (no dummy link either)."""
    return FamilyState(family, link=False)


def reconcile(
    want: Desired,
    held: Holding,
    *,
    ownership: Ownership = Ownership(),
    terminating: Terminating | None = None,
    connections: Mapping[Real, Connections] | None = None,
    now: float = 0.0,
    bound: float = BOUND,
    last_iptables: str | None = None,
) -> Reconciled:
    """The plan from ``held`` to ``want``.

    ``connections``: the counts the kernel reported (full sync: every real server's; partial:
    the terminating ones'). ``last_iptables``: the rules text the last apply wrote (a partial
    plan restores the rules only when they changed).
    """
    state = want.state
    t = terminating.copy() if terminating is not None else Terminating()
    conns = connections if connections is not None else {}
    ops: dict[OpKind, list[Op]] = {k: [] for k in (*BEFORE, *AFTER)}
    fam = state.family

    def op(kind: OpKind, **kw: object) -> None:
        ops[kind].append(Op(kind, fam, **kw))  # type: ignore[arg-type]

    if not held.link:
        op("add-link")

    def owned(key: VirtualKey) -> bool:
        """On kube-ipvs0's addresses, wanted by the render, or a NodePort on a node address
        (looked up set by set: a partial sync must not copy every address)."""
        ours = (
            key.address in held.addresses
            or key.address in state.addresses
            or key in state.virtual
            or (key.address in ownership.node_addresses and key.port in NODE_PORTS)
        )
        return ours and not ownership.excluded(key.address)

    # --- virtual services and real servers
    if want.full:
        keys: Collection[VirtualKey] = set(state.virtual) | set(held.virtual)
    else:
        keys = set(want.touched_virtual) | t.services()
    for key in sorted(keys):
        wanted, have = state.virtual.get(key), held.virtual.get(key)
        if wanted is None and have is None:
            continue
        if have is None:
            assert wanted is not None
            op("add-service", service=wanted)
            reals = state.real.get(key, {})
            for rk in sorted(reals):
                op("add-real", key=key, real=reals[rk])
            continue
        if wanted is None:
            if owned(key):
                op("del-service", key=key, service=have)
                for real in [r for r in t.since if r[0] == key]:
                    del t.since[real]
            continue
        if wanted != have:
            op("edit-service", key=key, service=wanted)
        _reals(key, state.real.get(key, {}), held.real.get(key, {}), t, conns, now, bound, op)

    # --- sets and their entries (sets: created, never destroyed here)
    for name in sorted(state.ipsets):
        if name not in held.ipsets:
            op("create-set", ipset=state.ipsets[name])
    pairs: Iterable[tuple[str, str]]
    if want.full:
        pairs = sorted(
            (name, e)
            for name in state.ipsets
            for e in set(state.entries.get(name, ())) | set(held.entries.get(name, ()))
        )
    else:
        pairs = sorted(want.touched_entries)
    for name, entry in pairs:
        spec = state.ipsets.get(name)
        if spec is None:
            continue
        inw = entry in state.entries.get(name, ())
        inh = name in held.ipsets and entry in held.entries.get(name, ())
        if inw and not inh:
            op("add-entry", ipset=spec, entry=entry)
        elif inh and not inw:
            op("del-entry", ipset=spec, entry=entry)

    # --- addresses on kube-ipvs0 (the link is ours: every address not wanted goes)
    addrs: Iterable[str]
    if want.full:
        addrs = sorted(set(state.addresses) | set(held.addresses))
    else:
        addrs = sorted(want.touched_addresses)
    for addr in addrs:
        inw, inh = addr in state.addresses, addr in held.addresses
        if inw and not inh:
            op("add-address", address=addr)
        elif inh and not inw:
            op("del-address", address=addr)

    iptables: str | None = want.iptables
    if not want.full and want.iptables == last_iptables:
        iptables = None
    before = tuple(o for k in BEFORE for o in ops[k])
    after = tuple(o for k in AFTER for o in ops[k])
    result: Held | None = None
    if want.full:
        result = Held.of(held)
        result.apply(before + after)
    plan = FamilyPlan(
        fam,
        want.full,
        before,
        iptables,
        after,
        result=result.state() if result is not None else None,
    )
    return Reconciled(plan, t, result)


def _reals(
    key: VirtualKey,
    wanted: Mapping[RealKey, RealServer],
    have: Mapping[RealKey, RealServer],
    t: Terminating,
    conns: Mapping[Real, Connections],
    now: float,
    bound: float,
    op: _OpSink,
) -> None:
    for rk in sorted(wanted):
        real = wanted[rk]
        t.since.pop((key, rk), None)  # back while terminating: it gets its weight back
        if rk not in have:
            op("add-real", key=key, real=real)
        elif have[rk].weight != real.weight:
            op("edit-real", key=key, real=real)
    for rk in sorted(set(have) - set(wanted)):
        if expired(t, (key, rk), conns, now, bound):
            op("del-real", key=key, real=have[rk])
            t.since.pop((key, rk), None)
            continue
        if have[rk].weight != 0:
            op("edit-real", key=key, real=RealServer(rk, 0))
        t.since.setdefault((key, rk), now)


class _OpSink(Protocol):
    def __call__(self, kind: OpKind, **kw: object) -> None: ...


def counts(ops: Sequence[Op]) -> dict[str, int]:
    """Operations per kind (for logs and benchmarks)."""
    out: dict[str, int] = {}
    for o in ops:
        out[o.kind] = out.get(o.kind, 0) + 1
    return out
