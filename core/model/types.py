"""Immutable value types of the normalized endpoint graph.

These are what every dataplane renders from. They carry no Kubernetes client types and no
backend knowledge: a backend sees the same values whether the objects came from the API
server or from a folder of manifests.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, TypeVar

_T = TypeVar("_T")


class Protocol(StrEnum):
    TCP = "TCP"
    UDP = "UDP"
    SCTP = "SCTP"


class IPFamily(StrEnum):
    IPv4 = "IPv4"
    IPv6 = "IPv6"

    @property
    def other(self) -> IPFamily:
        return IPFamily.IPv6 if self is IPFamily.IPv4 else IPFamily.IPv4


def family_of(ip: str) -> IPFamily:
    """Family of an address or CIDR string that has been validated already."""
    return IPFamily.IPv6 if ":" in ip else IPFamily.IPv4


@dataclass(frozen=True, slots=True, order=True)
class ServicePortName:
    """One port of one Service; prints like upstream's ``ns/name:port`` (``ns/name`` if unnamed)."""

    namespace: str
    name: str
    port: str = ""
    protocol: Protocol = Protocol.TCP

    @property
    def namespaced_name(self) -> str:
        return f"{self.namespace}/{self.name}"

    def __str__(self) -> str:
        base = f"{self.namespace}/{self.name}"
        return f"{base}:{self.port}" if self.port else base


@dataclass(frozen=True, slots=True)
class ServicePort:
    """What a dataplane needs to know about one Service port in one IP family.

    Addresses are normalized strings (``ipaddress`` compressed form), so they can be written
    into rules as they are and compared cheaply.
    """

    name: ServicePortName
    family: IPFamily
    cluster_ip: str
    port: int
    protocol: Protocol = Protocol.TCP
    node_port: int = 0
    external_ips: tuple[str, ...] = ()
    load_balancer_vips: tuple[str, ...] = ()
    load_balancer_source_ranges: tuple[str, ...] = ()
    session_affinity_client_ip: bool = False
    sticky_max_age_seconds: int = 10800
    internal_policy_local: bool = False
    external_policy_local: bool = False
    health_check_node_port: int = 0
    traffic_distribution: str = ""

    @property
    def externally_accessible(self) -> bool:
        return self.node_port != 0 or bool(self.load_balancer_vips) or bool(self.external_ips)

    @property
    def uses_cluster_endpoints(self) -> bool:
        # Even with externalTrafficPolicy Local, cluster endpoints are needed for the
        # short-circuit of pod and host traffic to external addresses.
        return not self.internal_policy_local or self.externally_accessible

    @property
    def uses_local_endpoints(self) -> bool:
        return self.internal_policy_local or (
            self.external_policy_local and self.externally_accessible
        )


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One backend of a Service port, after the slices of a Service were merged."""

    ip: str
    port: int
    ready: bool = True
    serving: bool = True
    terminating: bool = False
    is_local: bool = False
    node_name: str = ""
    zone: str = ""
    zone_hints: frozenset[str] = field(default_factory=frozenset)
    node_hints: frozenset[str] = field(default_factory=frozenset)

    @property
    def address(self) -> str:
        """``ip:port``, ``[ip]:port`` for IPv6: upstream's Endpoint.String()."""
        return f"[{self.ip}]:{self.port}" if ":" in self.ip else f"{self.ip}:{self.port}"

    def __str__(self) -> str:
        return self.address


def fast_init(cls: type[_T]) -> Callable[..., _T]:
    """A constructor of a frozen, slotted dataclass that takes every field, in order, and
    fills the slots directly, at half the cost of the generated __init__ (which goes through
    object.__setattr__ per field): a first checkout makes an object per endpoint and port."""
    names = tuple(f.name for f in fields(cls))  # type: ignore[arg-type]
    if (
        names != getattr(cls, "__slots__", None)
        or any(not f.init for f in fields(cls))  # type: ignore[arg-type]
        or hasattr(cls, "__post_init__")
        or any(name.startswith("_") for name in names)
    ):
        raise TypeError(f"{cls.__name__}: not a plain frozen, slotted dataclass")
    env: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    env.update((f"_set_{name}", getattr(cls, name).__set__) for name in names)
    body = "".join(f"    _set_{name}(_obj, {name})\n" for name in names)
    exec(f"def new({', '.join(names)}):\n    _obj = _new(_cls)\n{body}    return _obj\n", env)
    new: Callable[..., _T] = env["new"]
    new.__qualname__ = new.__name__ = f"new_{cls.__name__}"
    return new


#: Endpoint(ip, port, ready, serving, terminating, is_local, node_name, zone, zone_hints,
#: node_hints), every field given.
new_endpoint: Callable[
    [str, int, bool, bool, bool, bool, str, str, frozenset[str], frozenset[str]], Endpoint
] = fast_init(Endpoint)
#: ServicePortName(namespace, name, port, protocol).
new_service_port_name: Callable[[str, str, str, Protocol], ServicePortName] = fast_init(
    ServicePortName
)
#: ServicePort with every field given, in order.
new_service_port: Callable[..., ServicePort] = fast_init(ServicePort)


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """The node kubeplex runs on, as far as rules depend on it."""

    name: str
    labels: tuple[tuple[str, str], ...] = ()
    pod_cidrs: tuple[str, ...] = ()
    addresses: tuple[str, ...] = ()
    deleting: bool = False

    @property
    def zone(self) -> str:
        return dict(self.labels).get("topology.kubernetes.io/zone", "")

    def addresses_of(self, family: IPFamily) -> tuple[str, ...]:
        return tuple(a for a in self.addresses if family_of(a) is family)

    def pod_cidrs_of(self, family: IPFamily) -> tuple[str, ...]:
        return tuple(c for c in self.pod_cidrs if family_of(c) is family)


def normalize_ip(text: str) -> str:
    """Canonical text of an address; raises ValueError for anything that is not one."""
    # ipaddress accepts an IPv6 scope ("fe80::1%eth0") with arbitrary text after the "%",
    # spaces and newlines included; Kubernetes never accepts a scope, and it must not reach a rule.
    if "%" in text:
        raise ValueError(f"{text!r}: an IP address with a scope is not allowed")
    text = text.strip()
    if ":" not in text:
        # inet_pton is as strict as ipaddress for IPv4 (four decimal parts, no leading zeros)
        # and much faster, which counts at 100,000 endpoints; and what it accepts is
        # the canonical text already (inet_ntop would print it back unchanged).
        try:
            packed = socket.inet_pton(socket.AF_INET, text)
        except (OSError, UnicodeError):
            raise ValueError(f"{text!r} does not appear to be an IPv4 address") from None
        return text if type(text) is str else socket.inet_ntop(socket.AF_INET, packed)
    return str(ipaddress.ip_address(text))


def normalize_cidr(text: str) -> str:
    """Canonical text of a network (host bits must be zero, as the API server requires)."""
    if "%" in text:
        raise ValueError(f"{text!r}: a network with a scope is not allowed")
    return str(ipaddress.ip_network(text.strip(), strict=False))
