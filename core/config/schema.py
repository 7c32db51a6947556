"""The ``KubeProxyConfiguration`` schema: its sections, fields, v1alpha1 names and defaults.

Each field's metadata names its decoder kind (see :mod:`kubeplex.core.config.decoding`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from kubeplex.core.config.addresses import IPNetwork, parse_cidr
from kubeplex.core.config.decoding import LOGGING_DEFAULTS, encode, freeze

API_VERSION = "kubeproxy.config.k8s.io/v1alpha1"
KIND = "KubeProxyConfiguration"
DEFAULT_KNOWN_MODES: tuple[str, ...] = ("iptables", "nftables", "ipvs", "kernelspace")

# pkg/cluster/ports: ProxyHealthzPort and ProxyStatusPort.
HEALTHZ_PORT = 10256
METRICS_PORT = 10249

LOCAL_MODES = ("ClusterCIDR", "NodeCIDR", "BridgeInterface", "InterfaceNamePrefix")
NODE_PORT_PRIMARY = "primary"
# Upstream stopped validating the scheduler and hands it to the kernel, so accept every
# scheduler the Linux IPVS code ships rather than only the ten upstream once listed.
IPVS_SCHEDULERS = frozenset(
    {"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "fo", "ovf", "mh", "twos"}
)
#: The modes with a section of their own (validated only when the mode is active, as upstream
#: does); every other mode reads, and is validated by, the iptables section. Which settings a
#: backend takes from its section is the backend's business (``Backend.sync_periods``).
MODE_SECTIONS: Mapping[str, str] = MappingProxyType({"ipvs": "ipvs", "nftables": "nftables"})


def _meta(
    json_name: str, kind: str, *, zero_is_unset: bool = False, section: type[Any] | None = None
) -> dict[str, Any]:
    """A field's v1alpha1 name and decoder kind. ``zero_is_unset`` mirrors upstream defaulting
    of non-pointer Go fields: there a zero value is indistinguishable from "not set"."""
    return {"json": json_name, "kind": kind, "zero_is_unset": zero_is_unset, "cls": section}


def _spec(json_name: str, kind: str, default: Any, *, zero_is_unset: bool = False) -> Any:
    """An immutable scalar field."""
    return field(default=default, metadata=_meta(json_name, kind, zero_is_unset=zero_is_unset))


def _frozen_map(json_name: str, kind: str, default: Mapping[str, Any]) -> Any:
    # Mappings are not hashable; leave them out of the hash so the object stays hashable.
    return field(
        default_factory=lambda: freeze(default), metadata=_meta(json_name, kind), hash=False
    )


@dataclass(frozen=True)
class ClientConnectionConfiguration:
    kubeconfig: str = _spec("kubeconfig", "str", "")
    accept_content_types: str = _spec("acceptContentTypes", "str", "")
    content_type: str = _spec(
        "contentType", "str", "application/vnd.kubernetes.protobuf", zero_is_unset=True
    )
    qps: float = _spec("qps", "float", 5.0, zero_is_unset=True)
    burst: int = _spec("burst", "int32", 10, zero_is_unset=True)


@dataclass(frozen=True)
class KubeProxyIPTablesConfiguration:
    masquerade_bit: int = _spec("masqueradeBit", "int32", 14)
    masquerade_all: bool = _spec("masqueradeAll", "bool", False)
    localhost_node_ports: bool = _spec("localhostNodePorts", "bool", True)
    sync_period: float = _spec("syncPeriod", "duration", 30.0, zero_is_unset=True)
    # Upstream defaults a zero minSyncPeriod to 1s, so 0 cannot be configured here.
    min_sync_period: float = _spec("minSyncPeriod", "duration", 1.0, zero_is_unset=True)


@dataclass(frozen=True)
class KubeProxyIPVSConfiguration:
    sync_period: float = _spec("syncPeriod", "duration", 30.0, zero_is_unset=True)
    min_sync_period: float = _spec("minSyncPeriod", "duration", 0.0)
    scheduler: str = _spec("scheduler", "str", "")
    exclude_cidrs: tuple[IPNetwork, ...] = _spec("excludeCIDRs", "cidr_list", ())
    strict_arp: bool = _spec("strictARP", "bool", False)
    tcp_timeout: float = _spec("tcpTimeout", "duration", 0.0)
    tcp_fin_timeout: float = _spec("tcpFinTimeout", "duration", 0.0)
    udp_timeout: float = _spec("udpTimeout", "duration", 0.0)


@dataclass(frozen=True)
class KubeProxyNFTablesConfiguration:
    masquerade_bit: int = _spec("masqueradeBit", "int32", 14)
    masquerade_all: bool = _spec("masqueradeAll", "bool", False)
    sync_period: float = _spec("syncPeriod", "duration", 30.0, zero_is_unset=True)
    min_sync_period: float = _spec("minSyncPeriod", "duration", 1.0, zero_is_unset=True)


@dataclass(frozen=True)
class KubeProxyConntrackConfiguration:
    max_per_core: int = _spec("maxPerCore", "int32", 32 * 1024)
    min: int = _spec("min", "int32", 128 * 1024)
    tcp_established_timeout: float = _spec("tcpEstablishedTimeout", "duration", 24 * 3600.0)
    tcp_close_wait_timeout: float = _spec("tcpCloseWaitTimeout", "duration", 3600.0)
    tcp_be_liberal: bool = _spec("tcpBeLiberal", "bool", False)
    udp_timeout: float = _spec("udpTimeout", "duration", 0.0)
    udp_stream_timeout: float = _spec("udpStreamTimeout", "duration", 0.0)


@dataclass(frozen=True)
class KubeProxyWinkernelConfiguration:
    network_name: str = _spec("networkName", "str", "")
    source_vip: str = _spec("sourceVip", "str", "")
    enable_dsr: bool = _spec("enableDSR", "bool", False)
    root_hns_endpoint_name: str = _spec("rootHnsEndpointName", "str", "")
    forward_health_check_vip: bool = _spec("forwardHealthCheckVip", "bool", False)


@dataclass(frozen=True)
class DetectLocalConfiguration:
    bridge_interface: str = _spec("bridgeInterface", "str", "")
    interface_name_prefix: str = _spec("interfaceNamePrefix", "str", "")


@dataclass(frozen=True)
class KubeProxyConfiguration:
    """The effective configuration: defaults applied, mode resolved, everything validated."""

    feature_gates: Mapping[str, bool] = _frozen_map("featureGates", "bool_map", {})
    client_connection: ClientConnectionConfiguration = field(
        default_factory=ClientConnectionConfiguration,
        metadata=_meta("clientConnection", "section", section=ClientConnectionConfiguration),
    )
    # component-base's LoggingConfiguration, kept as a read-only mapping (nested mappings are
    # MappingProxyType, lists are tuples); only its documented keys are type-checked.
    logging: Mapping[str, Any] = _frozen_map("logging", "logging", LOGGING_DEFAULTS)
    hostname_override: str = _spec("hostnameOverride", "str", "")
    bind_address: str = _spec("bindAddress", "str", "0.0.0.0", zero_is_unset=True)
    healthz_bind_address: str = _spec("healthzBindAddress", "str", f"0.0.0.0:{HEALTHZ_PORT}")
    metrics_bind_address: str = _spec("metricsBindAddress", "str", f"127.0.0.1:{METRICS_PORT}")
    bind_address_hard_fail: bool = _spec("bindAddressHardFail", "bool", False)
    enable_profiling: bool = _spec("enableProfiling", "bool", False)
    show_hidden_metrics_for_version: str = _spec("showHiddenMetricsForVersion", "str", "")
    mode: str = _spec("mode", "str", "iptables", zero_is_unset=True)
    iptables: KubeProxyIPTablesConfiguration = field(
        default_factory=KubeProxyIPTablesConfiguration,
        metadata=_meta("iptables", "section", section=KubeProxyIPTablesConfiguration),
    )
    ipvs: KubeProxyIPVSConfiguration = field(
        default_factory=KubeProxyIPVSConfiguration,
        metadata=_meta("ipvs", "section", section=KubeProxyIPVSConfiguration),
    )
    nftables: KubeProxyNFTablesConfiguration = field(
        default_factory=KubeProxyNFTablesConfiguration,
        metadata=_meta("nftables", "section", section=KubeProxyNFTablesConfiguration),
    )
    winkernel: KubeProxyWinkernelConfiguration = field(
        default_factory=KubeProxyWinkernelConfiguration,
        metadata=_meta("winkernel", "section", section=KubeProxyWinkernelConfiguration),
    )
    detect_local_mode: str = _spec("detectLocalMode", "str", "ClusterCIDR", zero_is_unset=True)
    detect_local: DetectLocalConfiguration = field(
        default_factory=DetectLocalConfiguration,
        metadata=_meta("detectLocal", "section", section=DetectLocalConfiguration),
    )
    # clusterCIDR: one CIDR, or a comma-separated IPv4/IPv6 pair.
    cluster_cidrs: tuple[IPNetwork, ...] = _spec("clusterCIDR", "cidr_csv", ())
    # CIDRs, or the single keyword "primary" (the default in nftables mode).
    node_port_addresses: tuple[str, ...] = _spec("nodePortAddresses", "str_list", ())
    oom_score_adj: int = _spec("oomScoreAdj", "int32", -999)
    conntrack: KubeProxyConntrackConfiguration = field(
        default_factory=KubeProxyConntrackConfiguration,
        metadata=_meta("conntrack", "section", section=KubeProxyConntrackConfiguration),
    )
    config_sync_period: float = _spec("configSyncPeriod", "duration", 15 * 60.0, zero_is_unset=True)
    # Deprecated: configured the removed userspace proxy. Still syntax-checked, never used.
    port_range: str = _spec("portRange", "str", "")
    windows_run_as_service: bool = _spec("windowsRunAsService", "bool", False)

    # Where the configuration came from, for error messages.
    source: str = field(default="", compare=False)
    # The document as written, so command-line overrides can be re-defaulted and re-validated
    # exactly as if they had been in the file.
    _document: Mapping[str, Any] | None = field(default=None, compare=False, hash=False, repr=False)

    @property
    def node_port_cidrs(self) -> tuple[IPNetwork, ...]:
        """nodePortAddresses without the "primary" keyword, parsed."""
        parsed = (parse_cidr(a) for a in self.node_port_addresses if a != NODE_PORT_PRIMARY)
        return tuple(n for n in parsed if n is not None)

    def to_dict(self) -> dict[str, Any]:
        """The configuration as a v1alpha1 document (camelCase, Go duration strings)."""
        return {"apiVersion": API_VERSION, "kind": KIND, **encode(self)}
