"""Service, EndpointSlice and ServiceCIDR as kube-proxy keeps them once validated, and the
API server's rules for their names, which both the general parsers (``objects``) and their fast
paths (``objects_fast_paths``) check."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubeplex.core.model.types import IPFamily, Protocol, family_of

# Anchored with \Z, not $: "$" also matches before a trailing newline ("web\n" would pass).
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z"
)
# IANA_SVC_NAME as the API server enforces for port names.
PORT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
# Label values and zone names: what the API server allows in a label value.
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?\Z")

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer", "ExternalName")
DEFAULT_AFFINITY_TIMEOUT = 10800
MAX_AFFINITY_TIMEOUT = 86400

TRIGGER_TIME_ANNOTATION = "endpoints.kubernetes.io/last-change-trigger-time"


@dataclass(frozen=True, slots=True)
class PortSpec:
    name: str
    protocol: Protocol
    port: int
    node_port: int


@dataclass(frozen=True, slots=True)
class ServiceObject:
    """A validated Service; the trackers turn it into per-family ServicePorts."""

    namespace: str
    name: str
    type: str
    cluster_ips: tuple[str, ...]
    headless: bool
    ports: tuple[PortSpec, ...]
    external_ips: tuple[str, ...] = ()
    load_balancer_ingress_ips: tuple[str, ...] = ()
    load_balancer_source_ranges: tuple[str, ...] = ()
    session_affinity_client_ip: bool = False
    affinity_timeout: int = DEFAULT_AFFINITY_TIMEOUT
    external_traffic_policy: str = "Cluster"
    internal_traffic_policy: str = "Cluster"
    health_check_node_port: int = 0
    traffic_distribution: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def cluster_ip_of(self, family: IPFamily) -> str:
        for ip in self.cluster_ips:
            if family_of(ip) is family:
                return ip
        return ""


@dataclass(frozen=True, slots=True)
class SliceEndpoint:
    ip: str
    ready: bool
    serving: bool
    terminating: bool
    node_name: str
    zone: str
    zone_hints: frozenset[str]
    node_hints: frozenset[str]


@dataclass(frozen=True, slots=True)
class SlicePort:
    name: str
    protocol: Protocol
    port: int


@dataclass(frozen=True, slots=True)
class EndpointSliceObject:
    namespace: str
    name: str
    service_name: str
    address_type: str
    ports: tuple[SlicePort, ...]
    endpoints: tuple[SliceEndpoint, ...]
    trigger_time: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def service_key(self) -> str:
        return f"{self.namespace}/{self.service_name}"


def trigger_time(annotations: Mapping[str, Any]) -> str:
    """A slice's last-change trigger time, as annotated ("" when absent or not text)."""
    value = annotations.get(TRIGGER_TIME_ANNOTATION, "")
    return value if isinstance(value, str) else ""


@dataclass(frozen=True, slots=True)
class ServiceCIDRObject:
    """A validated networking.k8s.io/v1 ServiceCIDR: a range ClusterIPs are allocated from."""

    name: str
    cidrs: tuple[str, ...]
