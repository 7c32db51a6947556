"""What the kernel cases share: the lab's names, Service builders, probes, and the contract's
read-back hooks (``inspect``, ``leftovers``) as the cases use them."""

from __future__ import annotations

import re
from typing import Any

from kubeplex.core.dataplane.backend import ProgrammedService
from kubeplex.core.model.types import IPFamily, ServicePortName
from kubeplex.testing.conformance.common import check
from kubeplex.testing.dataplane import DataplaneCluster, NodeAgent, endpoint_slice, service
from kubeplex.testing.netlab import WEB_A, WEB_B, WEB_C, ProbeResult

V4, V6 = IPFamily.IPv4, IPFamily.IPv6
WEB = "web"
WEB_VIP = "10.96.88.59"
WEB_VIP6 = "fd00:96::59"
NODEPORT = 30080
WEBS = (WEB_A, WEB_B, WEB_C)
#: chi-square critical value at p = 0.001 with 2 degrees of freedom (three endpoints).
CHI2_CRIT_2DOF_0001 = 13.82


def spn(name: str, namespace: str = "default") -> ServicePortName:
    """The service port of a kit Service (one unnamed TCP port)."""
    return ServicePortName(namespace, name)


def capabilities(dc: DataplaneCluster) -> frozenset[str]:
    return next(iter(dc.agents.values())).backend.capabilities


def ip_of(dc: DataplaneCluster, name: str, *, ipv6: bool = False) -> str:
    """A pod's, node's or host's address in the lab."""
    return dc.lab.spec.ip_of(name, ipv6=ipv6)


def web(
    dc: DataplaneCluster,
    pods: tuple[str, ...] = WEBS,
    *,
    name: str = WEB,
    vip: str = WEB_VIP,
    **svc: Any,
) -> list[dict[str, Any]]:
    """Service ``name`` (port 80) and its EndpointSlice of ``pods`` on 8080."""
    return web_in(dc, V4, pods, name=name, vip=vip, **svc)


def web_in(
    dc: DataplaneCluster,
    family: IPFamily,
    pods: tuple[str, ...] = WEBS,
    *,
    name: str = WEB,
    vip: str = WEB_VIP,
    vip6: str = WEB_VIP6,
    port: int = 80,
    target_port: int = 8080,
    protocol: str = "TCP",
    **svc: Any,
) -> list[dict[str, Any]]:
    """Service ``name`` and the EndpointSlices of ``pods`` to reach it in ``family``: for
    IPv4 a single-stack Service (``vip``) and one slice; for IPv6 a dual-stack Service
    (``vip``, ``vip6``) and one slice per family."""
    if family is V4:
        return [
            service(name, vip, port, target_port=target_port, protocol=protocol, **svc),
            endpoint_slice(name, dc.endpoints(*pods), port=target_port, protocol=protocol),
        ]
    return [
        service(
            name,
            vip,
            port,
            target_port=target_port,
            protocol=protocol,
            secondary_cluster_ip=vip6,
            **svc,
        ),
        endpoint_slice(
            name, dc.endpoints(*pods), port=target_port, protocol=protocol, name=f"{name}-v4"
        ),
        endpoint_slice(
            name,
            dc.endpoints(*pods, family=V6),
            port=target_port,
            protocol=protocol,
            name=f"{name}-v6",
            address_type="IPv6",
        ),
    ]


def synced(dc: DataplaneCluster, *objects: dict[str, Any]) -> None:
    dc.set(*objects)
    dc.sync_or_raise()


def hosts(results: list[ProbeResult]) -> set[str]:
    """The client addresses pods reported (``ip:port`` / ``[ip]:port``, without the port)."""
    out = set()
    for r in results:
        host = (r.body or "").rsplit(":", 1)[0]
        out.add(host[1:-1] if host.startswith("[") else host)
    return out


def all_ok(results: list[ProbeResult]) -> bool:
    return all(r.ok for r in results)


def chi2_even(counts: dict[str, int], names: tuple[str, ...], total: int) -> float:
    expected = total / len(names)
    return sum((counts.get(n, 0) - expected) ** 2 / expected for n in names)


# --- the contract's read-back --------------------------------------------------------------


def view(
    agent: NodeAgent, port: ServicePortName, family: IPFamily = V4
) -> ProgrammedService | None:
    """What ``agent``'s kernel holds for ``port`` in ``family``; None if the backend cannot
    read its kernel back (``inspect`` returns None). AssertionError if nothing is there."""
    views = agent.backend.inspect(port)
    if views is None:
        return None
    mine = [v for v in views if v.family is family]
    check(mine, f"{agent.node}: inspect({port}) holds nothing in {family.value}: {views}")
    check(len(mine) == 1, f"{agent.node}: inspect({port}) has {len(mine)} {family.value} views")
    return mine[0]


def targets(v: ProgrammedService) -> list[str]:
    return sorted(e.target for e in v.endpoints)


def check_even_split(v: ProgrammedService, n: int) -> None:
    """``n`` distinct endpoints, each given 1/n of new connections where the kernel says."""
    check(len(v.endpoints) == n, f"{v.service}: {len(v.endpoints)} endpoints, not {n}: {v}")
    check(len(set(targets(v))) == n, f"{v.service}: endpoint targets repeat: {targets(v)}")
    shares = [e.share for e in v.endpoints]
    if all(s is None for s in shares):
        return  # the kernel does not say (contract: share None)
    check(
        all(s is not None and abs(s - 1 / n) < 0.01 for s in shares),
        f"{v.service}: shares {shares}, not 1/{n} each",
    )


def packets(v: ProgrammedService) -> int | None:
    """New connections (or packets) the kernel counted for the Service port, if it counts."""
    if v.packets is not None:
        return v.packets
    counted = [e.packets for e in v.endpoints]
    if counted and all(p is not None for p in counted):
        return sum(p for p in counted if p is not None)
    return None


def leftovers(agent: NodeAgent) -> list[str]:
    found = agent.backend.leftovers()
    check(isinstance(found, list), f"leftovers() returned {type(found).__name__}, not a list")
    return found


def named_in(name: str, lines: list[str]) -> list[str]:
    """The lines that name the kernel object ``name`` (as a whole word)."""
    word = re.compile(rf"(?<![\w/-]){re.escape(name)}(?![\w/-])")
    return [ln for ln in lines if word.search(ln)]
