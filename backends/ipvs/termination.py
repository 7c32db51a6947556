"""Graceful termination of real servers, as upstream's (pkg/proxy/ipvs/graceful_termination.go).

A real server whose endpoint went away is not deleted at once when it still carries
connections: it first gets weight 0 (no new connection is scheduled to it, the established
ones keep flowing) and is deleted once the kernel counts no connection on it any more (active
and inactive, as upstream), or once it has waited ``BOUND`` seconds (upstream waits forever; a
bound keeps a connection that never closes from pinning a dead endpoint). UDP and SCTP real
servers are deleted at once, as upstream's ``IsRsGracefulTerminationNeeded``: the kernel drops
their flows on the next packet (``expire_nodest_conn``).

The list is the backend's; only its servers' connection counts are read (``IpvsSeam.connections``)
at every sync, and the periodic sync (``ipvs.syncPeriod``, 30 s by default; upstream checks once
a minute) makes sure it is read even when nothing changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kubeplex.backends.ipvs.plan import Connections, RealKey, VirtualKey
from kubeplex.core.model.types import Protocol as L4

#: The longest a real server waits at weight 0 for its connections to close, in seconds:
#: IPVS's own default idle timeout of an established TCP connection.
BOUND = 900.0

Real = tuple[VirtualKey, RealKey]


def graceful(key: VirtualKey) -> bool:
    """Whether a removed real server of this virtual service waits for its connections."""
    return key.protocol is L4.TCP


def idle(conns: Connections) -> bool:
    return conns.active + conns.inactive == 0


@dataclass
class Terminating:
    """One family's real servers at weight 0, with the time each started waiting."""

    since: dict[Real, float] = field(default_factory=dict)

    def copy(self) -> Terminating:
        return Terminating(dict(self.since))

    def __contains__(self, real: object) -> bool:
        return real in self.since

    def __len__(self) -> int:
        return len(self.since)

    def keys(self) -> list[Real]:
        return sorted(self.since)

    def services(self) -> set[VirtualKey]:
        return {vk for vk, _ in self.since}


def expired(
    terminating: Terminating,
    real: Real,
    conns: Mapping[Real, Connections],
    now: float,
    bound: float = BOUND,
) -> bool:
    """Whether a terminating (or just removed) real server may be deleted now.

    ``conns``: the counts the kernel reported. A real server just removed whose counts were
    not read (a partial sync reads only the terminating ones') waits until the next check; a
    terminating one the kernel did not report is gone already.
    """
    if not graceful(real[0]):
        return True
    counts = conns.get(real)
    if counts is None:
        return real in terminating
    if idle(counts):
        return True
    since = terminating.since.get(real)
    return since is not None and now - since >= bound
