"""Conntrack cleanup after a sync, over netlink (pyroute2), optionally in a network namespace.

A connectionless flow (UDP, SCTP) has no end the kernel can see, so its conntrack entry keeps
the NAT decision of its first packet for as long as packets keep coming: a client that sends
from a fixed port to a Service keeps reaching the endpoint it first got, even after that
endpoint left the Service. Upstream kube-proxy therefore deletes, after each successful sync:

* for every **stale endpoint** (a serving UDP/SCTP endpoint that went away) of a Service that
  still exists: the entries whose original destination is one of the Service's IPs (cluster IP,
  external IPs, load-balancer IPs) or whose original destination port is its NodePort, and
  whose reply comes from that endpoint (it was DNATed there);
* for every **stale service IP** (the cluster IP of a deleted UDP/SCTP service port): the
  entries to that IP;
* for every **newly active** UDP/SCTP service (no endpoint before, one now): the entries to
  its IPs and NodePort, made while the traffic was rejected or went nowhere.

``stale_flow_filters`` turns one sync's ``ProxyState`` into those filters (pure); a
``ConntrackCleaner`` is the ``SyncListener`` that lists the table once per family and
protocol and deletes the matching entries. It never shells out to ``conntrack``.

Two refinements over upstream, both about not deleting live flows that are fine: an entry is
matched on the endpoint's port as well as its IP (an endpoint that moved to another port of
the same pod keeps its new flows), and a newly active Service's entries are matched on its
port. Deleting a healthy UDP flow is harmless (the next datagram is load-balanced again), so
the stale-IP case deletes every UDP entry to the IP, as upstream; for SCTP it is not (an
association cannot restart mid-stream), so SCTP entries of a stale IP are kept while another
SCTP port of a live Service still uses the IP.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from kubeplex.core.backend import SyncResult
from kubeplex.core.graph import ProxyState
from kubeplex.core.model import IPFamily, ServicePort
from kubeplex.core.model import Protocol as L4

log = logging.getLogger(__name__)

IPPROTO: dict[L4, int] = {L4.TCP: socket.IPPROTO_TCP, L4.UDP: socket.IPPROTO_UDP, L4.SCTP: 132}
UDP = socket.IPPROTO_UDP
SCTP = 132
AF: dict[IPFamily, int] = {IPFamily.IPv4: socket.AF_INET, IPFamily.IPv6: socket.AF_INET6}


@dataclass(frozen=True, slots=True)
class Flow:
    """One conntrack entry: the original and the reply tuple (ports None for portless)."""

    proto: int
    orig_src: str
    orig_dst: str
    orig_sport: int | None
    orig_dport: int | None
    reply_src: str
    reply_dst: str
    reply_sport: int | None
    reply_dport: int | None
    zone: int | None = None


@dataclass(frozen=True, slots=True)
class FlowFilter:
    """Entries to delete: every field that is set must match (upstream's conntrackFilter)."""

    proto: int
    orig_dst: str | None = None
    orig_dport: int | None = None
    reply_src: str | None = None
    reply_sport: int | None = None
    reason: str = ""

    def matches(self, flow: Flow) -> bool:
        return (
            flow.proto == self.proto
            and (self.orig_dst is None or flow.orig_dst == self.orig_dst)
            and (self.orig_dport is None or flow.orig_dport == self.orig_dport)
            and (self.reply_src is None or flow.reply_src == self.reply_src)
            and (self.reply_sport is None or flow.reply_sport == self.reply_sport)
        )


def _service_ips(svc: ServicePort) -> tuple[str, ...]:
    return tuple(dict.fromkeys((svc.cluster_ip, *svc.external_ips, *svc.load_balancer_vips)))


def stale_flow_filters(state: ProxyState) -> dict[IPFamily, list[FlowFilter]]:
    """What one sync makes stale, per IP family (families with nothing to do are left out)."""
    out: dict[IPFamily, list[FlowFilter]] = {}
    for family, changes in state.changes.items():
        graph = state.graphs.get(family)
        if graph is None:
            continue
        filters: list[FlowFilter] = []
        for stale in changes.stale_endpoints:
            svc = graph.services.get(stale.service)
            if svc is None:
                continue  # the Service went too: its cluster IP is a stale service IP
            proto = IPPROTO[svc.protocol]
            ep = stale.endpoint
            why = f"{stale.service} lost endpoint {ep.address}"
            for ip in _service_ips(svc):
                filters.append(FlowFilter(proto, ip, None, ep.ip, ep.port, why))
            if svc.node_port:
                filters.append(FlowFilter(proto, None, svc.node_port, ep.ip, ep.port, why))
        live_sctp_ips = {
            ip
            for svc in graph.services.values()
            if svc.protocol is L4.SCTP
            for ip in _service_ips(svc)
        }
        for ip in sorted(changes.stale_service_ips):
            why = f"service IP {ip} deleted"
            filters.append(FlowFilter(UDP, ip, reason=why))
            if ip not in live_sctp_ips:
                filters.append(FlowFilter(SCTP, ip, reason=why))
        for spn in sorted(changes.newly_active_services):
            svc = graph.services.get(spn)
            if svc is None or svc.protocol not in (L4.UDP, L4.SCTP):
                continue
            proto = IPPROTO[svc.protocol]
            why = f"{spn} has endpoints again"
            for ip in _service_ips(svc):
                filters.append(FlowFilter(proto, ip, svc.port, reason=why))
            if svc.node_port:
                filters.append(FlowFilter(proto, None, svc.node_port, reason=why))
        if filters:
            out[family] = list(dict.fromkeys(filters))  # same filter from two causes: once
    return out


# ---------------------------------------------------------------------------------- the table


class ConntrackTable(Protocol):
    """One IP family's conntrack table (netlink, or a fake in tests)."""

    def flows(self, proto: int) -> Iterable[Flow]: ...

    def delete(self, flow: Flow) -> bool:
        """Delete one entry; False if it was gone already."""
        ...

    def close(self) -> None: ...


TableFactory = Callable[[IPFamily], ConntrackTable]


def _norm(ip: Any) -> str:
    return str(ipaddress.ip_address(str(ip)))


class NetlinkConntrack:
    """The conntrack table of one family over ctnetlink (pyroute2), in ``netns`` if given."""

    def __init__(self, family: IPFamily, netns: str | None = None) -> None:
        from pyroute2 import Conntrack

        if netns is not None:
            path = netns if "/" in netns else os.path.join("/run/netns", netns)
            if not os.path.exists(path):
                raise FileNotFoundError(f"no network namespace {netns!r}")
        self.family = family
        self.netns = netns
        kwargs: dict[str, Any] = {"nfgen_family": AF[family]}
        if netns is not None:
            kwargs.update(netns=netns, flags=0)  # flags=0: never create the namespace
        self._ct: Any = Conntrack(**kwargs)

    def flows(self, proto: int) -> list[Flow]:
        from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple

        try:
            # Kernel-side filtering on the protocol (Linux >= 5.8) keeps a big table cheap.
            msgs = list(self._ct.dump(tuple_orig=NFCTAttrTuple(AF[self.family], proto=proto)))
        except Exception as err:
            log.debug("filtered conntrack dump failed (%s); dumping everything", err)
            msgs = list(self._ct.dump())
        out = []
        for msg in msgs:
            flow = self._flow(msg)
            if flow is not None and flow.proto == proto:
                out.append(flow)
        return out

    def _flow(self, msg: Any) -> Flow | None:
        suffix = "V4" if self.family is IPFamily.IPv4 else "V6"
        try:
            orig, reply = msg.get_attr("CTA_TUPLE_ORIG"), msg.get_attr("CTA_TUPLE_REPLY")
            oip, oproto = orig.get_attr("CTA_TUPLE_IP"), orig.get_attr("CTA_TUPLE_PROTO")
            rip, rproto = reply.get_attr("CTA_TUPLE_IP"), reply.get_attr("CTA_TUPLE_PROTO")
            return Flow(
                proto=int(oproto.get_attr("CTA_PROTO_NUM")),
                orig_src=_norm(oip.get_attr(f"CTA_IP_{suffix}_SRC")),
                orig_dst=_norm(oip.get_attr(f"CTA_IP_{suffix}_DST")),
                orig_sport=oproto.get_attr("CTA_PROTO_SRC_PORT"),
                orig_dport=oproto.get_attr("CTA_PROTO_DST_PORT"),
                reply_src=_norm(rip.get_attr(f"CTA_IP_{suffix}_SRC")),
                reply_dst=_norm(rip.get_attr(f"CTA_IP_{suffix}_DST")),
                reply_sport=rproto.get_attr("CTA_PROTO_SRC_PORT"),
                reply_dport=rproto.get_attr("CTA_PROTO_DST_PORT"),
                zone=msg.get_attr("CTA_ZONE"),
            )
        except (AttributeError, TypeError, ValueError):
            return None  # an entry without the parts a Service flow has

    def delete(self, flow: Flow) -> bool:
        from pyroute2.netlink.exceptions import NetlinkError
        from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple

        orig = NFCTAttrTuple(
            AF[self.family],
            saddr=flow.orig_src,
            daddr=flow.orig_dst,
            proto=flow.proto,
            sport=flow.orig_sport,
            dport=flow.orig_dport,
        )
        extra = {"zone": flow.zone} if flow.zone else {}
        try:
            self._ct.entry("del", tuple_orig=orig, **extra)
        except NetlinkError as err:
            if err.code == 2:  # ENOENT: expired or deleted meanwhile
                return False
            raise
        return True

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._ct.close()

    def __enter__(self) -> NetlinkConntrack:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def clear_flows(table: ConntrackTable, filters: Iterable[FlowFilter]) -> int:
    """Delete every entry that matches a filter; returns how many were deleted."""
    by_proto: dict[int, list[FlowFilter]] = {}
    for f in filters:
        by_proto.setdefault(f.proto, []).append(f)
    deleted = 0
    for proto, group in sorted(by_proto.items()):
        for flow in table.flows(proto):
            hit = next((f for f in group if f.matches(flow)), None)
            if hit is None:
                continue
            if table.delete(flow):
                deleted += 1
                log.debug("deleted conntrack entry %s (%s)", flow, hit.reason)
    return deleted


#: Told after each family's cleanup: (family, seconds it took, entries deleted).
CleanupHook = Callable[[IPFamily, float, int], None]


class ConntrackCleaner:
    """The SyncListener that clears stale UDP/SCTP conntrack entries after every sync.

    ``enabled`` can be switched off (tests show what happens without it). Errors are logged,
    never raised: a sync whose rules are in place has succeeded whatever conntrack says.
    """

    def __init__(
        self,
        netns: str | None = None,
        *,
        table_factory: TableFactory | None = None,
        on_cleaned: CleanupHook | None = None,
        enabled: bool = True,
    ) -> None:
        self.netns = netns
        self.enabled = enabled
        self._factory: TableFactory = table_factory or (lambda fam: NetlinkConntrack(fam, netns))
        self._on_cleaned = on_cleaned
        #: Entries deleted so far, per family (for logs and tests).
        self.deleted: dict[IPFamily, int] = {}
        self.errors = 0

    def __call__(self, state: ProxyState, result: SyncResult, elapsed: float) -> None:
        if not self.enabled:
            return
        for family, filters in stale_flow_filters(state).items():
            self.clean(family, filters)

    def clean(self, family: IPFamily, filters: list[FlowFilter]) -> int:
        start = time.monotonic()
        deleted = 0
        try:
            table = self._factory(family)
            try:
                deleted = clear_flows(table, filters)
            finally:
                table.close()
        except Exception as err:
            self.errors += 1
            log.error("conntrack cleanup (%s) failed: %s", family.value, err)
        took = time.monotonic() - start
        self.deleted[family] = self.deleted.get(family, 0) + deleted
        log.info(
            "conntrack cleanup (%s): %d filters, %d entries deleted in %.1f ms",
            family.value,
            len(filters),
            deleted,
            took * 1000,
        )
        if self._on_cleaned is not None:
            try:
                self._on_cleaned(family, took, deleted)
            except Exception:
                log.exception("conntrack cleanup hook failed")
        return deleted
