"""kube-proxy's config file: ``KubeProxyConfiguration`` of ``kubeproxy.config.k8s.io/v1alpha1``.

Reads the ``config.conf`` that kubeadm and most installers ship, with the field set, the
defaults (pkg/proxy/apis/config/v1alpha1/defaults.go plus the platform defaults applied in
cmd/kube-proxy) and the validation rules (pkg/proxy/apis/config/validation) of upstream
kube-proxy 1.33/1.34. Differences from upstream, all on purpose:

* unknown and duplicate fields are errors (upstream logs them and falls back to lenient
  decoding for v1alpha1);
* every error of a file is reported at once, with the v1alpha1 (camelCase) field path;
* the valid proxy modes come from the caller, because backends are plugins;
* CIDR syntax is checked in every section, whether or not the section's mode is active.

Durations are float seconds; CIDRs are ``ipaddress`` networks. ``to_dict()`` prints the
effective configuration back in the file's camelCase shape.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar

import yaml

from kubeplex.core.config.durations import DurationError, format_duration, parse_duration
from kubeplex.core.model.errors import FieldError, InvalidObject

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "API_VERSION",
    "DEFAULT_KNOWN_MODES",
    "KIND",
    "MODE_SECTIONS",
    "ClientConnectionConfiguration",
    "DetectLocalConfiguration",
    "IPNetwork",
    "KubeProxyConfiguration",
    "KubeProxyConntrackConfiguration",
    "KubeProxyIPTablesConfiguration",
    "KubeProxyIPVSConfiguration",
    "KubeProxyNFTablesConfiguration",
    "KubeProxyWinkernelConfiguration",
    "active_section",
    "default_config",
    "format_duration",
    "load_config",
    "parse_config",
    "parse_duration",
    "split_host_port",
    "with_overrides",
]

API_VERSION = "kubeproxy.config.k8s.io/v1alpha1"
KIND = "KubeProxyConfiguration"
DEFAULT_KNOWN_MODES: tuple[str, ...] = ("iptables", "nftables", "ipvs", "kernelspace")

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

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
LOG_FORMATS = ("json", "text")
#: The modes with a section of their own (validated only when the mode is active, as upstream
#: does); every other mode reads, and is validated by, the iptables section. Which settings a
#: backend takes from its section is the backend's business (``Backend.sync_periods``).
MODE_SECTIONS: Mapping[str, str] = MappingProxyType({"ipvs": "ipvs", "nftables": "nftables"})
#: nodePortAddresses when the file leaves it empty, for modes whose default is not "every
#: address" (upstream's nftables mode listens on the node's primary addresses only).
_MODE_NODE_PORT_DEFAULTS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"nftables": (NODE_PORT_PRIMARY,)}
)
_DURATION_HINT = 'must be a duration string such as "30s" or "1m30s"'


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
        default_factory=lambda: _freeze(default), metadata=_meta(json_name, kind), hash=False
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


# component-base's SetRecommendedLoggingConfiguration.
_LOGGING_DEFAULTS: dict[str, Any] = {"format": "text", "flushFrequency": "5s", "verbosity": 0}


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
    logging: Mapping[str, Any] = _frozen_map("logging", "logging", _LOGGING_DEFAULTS)
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
        parsed = (_parse_cidr(a) for a in self.node_port_addresses if a != NODE_PORT_PRIMARY)
        return tuple(n for n in parsed if n is not None)

    def to_dict(self) -> dict[str, Any]:
        """The configuration as a v1alpha1 document (camelCase, Go duration strings)."""
        return {"apiVersion": API_VERSION, "kind": KIND, **_encode(self)}


# --- public entry points -------------------------------------------------------------------


def load_config(
    path: str | os.PathLike[str], known_modes: Iterable[str] = DEFAULT_KNOWN_MODES
) -> KubeProxyConfiguration:
    """Read, default and validate a config file; raise InvalidObject naming every bad field."""
    where = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise InvalidObject(where, [FieldError("", f"cannot read file: {e.strerror}")]) from e
    except UnicodeDecodeError as e:
        raise InvalidObject(where, [FieldError("", f"not UTF-8 text: {e.reason}")]) from e
    return parse_config(text, where, known_modes)


def parse_config(
    text: str, where: str, known_modes: Iterable[str] = DEFAULT_KNOWN_MODES
) -> KubeProxyConfiguration:
    """Like load_config, for text already in memory; ``where`` names it in errors."""
    try:
        documents = [d for d in yaml.load_all(text, Loader=_Loader) if d is not None]
    except yaml.YAMLError as e:
        raise InvalidObject(where, [FieldError("", _yaml_problem(e))]) from None
    if not documents:
        raise InvalidObject(where, [FieldError("", f"empty document, expected a {KIND}")])
    if len(documents) > 1:
        message = f"expected a single YAML document, found {len(documents)}"
        raise InvalidObject(where, [FieldError("", message)])
    return _build(documents[0], where, known_modes)


def default_config() -> KubeProxyConfiguration:
    """All upstream defaults, as if the file held only apiVersion and kind."""
    return _build({"apiVersion": API_VERSION, "kind": KIND}, "", DEFAULT_KNOWN_MODES)


def with_overrides(
    cfg: KubeProxyConfiguration,
    *,
    hostname_override: str | None = None,
    mode: str | None = None,
    cluster_cidr: str | None = None,
    known_modes: Iterable[str] = DEFAULT_KNOWN_MODES,
) -> KubeProxyConfiguration:
    """Apply command-line flags (None = flag not given) on top of the file, then default and
    validate again, so e.g. ``--proxy-mode=nftables`` picks up nftables' own defaults."""
    document = _thaw(cfg._document) if cfg._document is not None else cfg.to_dict()
    for key, value in (
        ("hostnameOverride", hostname_override),
        ("mode", mode),
        ("clusterCIDR", cluster_cidr),
    ):
        if value is not None:
            document[key] = value
    where = f"{cfg.source} (with command-line overrides)" if cfg.source else "command-line flags"
    return replace(_build(document, where, known_modes), source=cfg.source)


def split_host_port(address: str) -> tuple[str, int]:
    """Split "IP:port" / "[IPv6]:port" into (IP without brackets, port); ValueError if bad."""
    host, port = _split_host_port(address)
    if _parse_ip(host) is None:
        raise ValueError(f"invalid IP {host!r} in {address!r}")
    if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        raise ValueError(f"invalid port {port!r} in {address!r}")
    return host, int(port)


# --- building ------------------------------------------------------------------------------


class _Errors:
    def __init__(self) -> None:
        self.items: list[FieldError] = []

    def add(self, path: str, message: str) -> None:
        self.items.append(FieldError(path, message))


def _build(document: object, where: str, known_modes: Iterable[str]) -> KubeProxyConfiguration:
    errs = _Errors()
    if not isinstance(document, dict):
        errs.add("", f"must be a {KIND} mapping, got {_show(document)}")
        raise InvalidObject(where, errs.items)
    for key, expected in (("apiVersion", API_VERSION), ("kind", KIND)):
        got = document.get(key)
        if got is None:
            errs.add(key, f'required field is missing, must be "{expected}"')
        elif got != expected:
            errs.add(key, f'must be "{expected}", got {_show(got)}')
    if errs.items:
        # Another kind of object: its field errors would only bury the real problem.
        raise InvalidObject(where, errs.items)

    cfg = _decode(KubeProxyConfiguration, document, "", errs, extra_keys=("apiVersion", "kind"))
    cfg = _runtime_defaults(cfg, document)
    _validate(cfg, frozenset(known_modes), errs)
    if errs.items:
        raise InvalidObject(where, errs.items)
    return replace(cfg, source=where, _document=_freeze(document))


def _platform_default_mode() -> str:
    # Read at call time so tests can fake the platform.
    return "kernelspace" if sys.platform == "win32" else "iptables"


def _runtime_defaults(
    cfg: KubeProxyConfiguration, doc: Mapping[str, Any]
) -> KubeProxyConfiguration:
    """Defaults that depend on other fields (defaults.go getDefaultAddresses and
    AppendPortIfNeeded; cmd/kube-proxy platformApplyDefaults)."""
    mode = cfg.mode if doc.get("mode") not in (None, "") else _platform_default_mode()
    ipv4 = isinstance(_parse_ip(cfg.bind_address), ipaddress.IPv4Address)
    healthz_host, metrics_host = ("0.0.0.0", "127.0.0.1") if ipv4 else ("[::]", "[::1]")

    def address(key: str, current: str, host: str, port: int) -> str:
        if doc.get(key) in (None, ""):
            return f"{host}:{port}"
        return _append_port_if_needed(current, port)

    node_port_addresses = cfg.node_port_addresses or _MODE_NODE_PORT_DEFAULTS.get(mode, ())
    return replace(
        cfg,
        mode=mode,
        healthz_bind_address=address(
            "healthzBindAddress", cfg.healthz_bind_address, healthz_host, HEALTHZ_PORT
        ),
        metrics_bind_address=address(
            "metricsBindAddress", cfg.metrics_bind_address, metrics_host, METRICS_PORT
        ),
        node_port_addresses=node_port_addresses,
    )


# --- validation (pkg/proxy/apis/config/validation) -----------------------------------------


def _validate(cfg: KubeProxyConfiguration, known_modes: frozenset[str], errs: _Errors) -> None:
    if cfg.mode not in known_modes:
        errs.add(
            "mode",
            f"unknown proxy mode {_show(cfg.mode)}, must be one of: "
            + ", ".join(sorted(known_modes)),
        )

    # Like upstream: the iptables masquerade bit always, the rest only for the active mode.
    _check_range(errs, "iptables.masqueradeBit", cfg.iptables.masquerade_bit, 0, 31)
    section = active_section(cfg.mode)
    periods = getattr(cfg, section)
    _check_sync_periods(errs, section, periods.sync_period, periods.min_sync_period)
    check = _SECTION_CHECKS.get(section)
    if check is not None:
        check(cfg, errs)

    ct = cfg.conntrack
    _check_min(errs, "conntrack.maxPerCore", ct.max_per_core)
    _check_min(errs, "conntrack.min", ct.min)
    _check_min(errs, "conntrack.tcpEstablishedTimeout", ct.tcp_established_timeout)
    _check_min(errs, "conntrack.tcpCloseWaitTimeout", ct.tcp_close_wait_timeout)
    _check_min(errs, "conntrack.udpTimeout", ct.udp_timeout)
    _check_min(errs, "conntrack.udpStreamTimeout", ct.udp_stream_timeout)

    _check_range(errs, "oomScoreAdj", cfg.oom_score_adj, -1000, 1000)
    _check_min(errs, "clientConnection.burst", cfg.client_connection.burst)
    if cfg.config_sync_period <= 0:
        errs.add("configSyncPeriod", f"must be > 0, got {format_duration(cfg.config_sync_period)}")

    if _parse_ip(cfg.bind_address) is None:
        errs.add("bindAddress", f"must be a valid IP address, got {_show(cfg.bind_address)}")
    _check_host_port(errs, "healthzBindAddress", cfg.healthz_bind_address)
    _check_host_port(errs, "metricsBindAddress", cfg.metrics_bind_address)

    if not _is_port_range(cfg.port_range):
        errs.add(
            "portRange", f"must be a valid port range (e.g. 300-2000), got {_show(cfg.port_range)}"
        )

    for i, address in enumerate(cfg.node_port_addresses):
        path = f"nodePortAddresses[{i}]"
        if address == NODE_PORT_PRIMARY:
            if len(cfg.node_port_addresses) != 1:
                errs.add(path, f'"primary" cannot be combined with CIDRs, got {_show(address)}')
            break
        if _parse_cidr(address) is None:
            errs.add(path, f'must be a valid CIDR or "primary", got {_show(address)}')

    version = cfg.show_hidden_metrics_for_version
    if version and not re.fullmatch(r"[0-9]+\.[0-9]+", version):
        errs.add(
            "showHiddenMetricsForVersion",
            f'must be a <major>.<minor> version such as "1.33", got {_show(version)}',
        )

    if cfg.detect_local_mode not in LOCAL_MODES:
        errs.add(
            "detectLocalMode",
            f"unsupported value {_show(cfg.detect_local_mode)}, must be one of: "
            + ", ".join(LOCAL_MODES),
        )
    elif cfg.detect_local_mode == "BridgeInterface" and not cfg.detect_local.bridge_interface:
        errs.add(
            "detectLocal.bridgeInterface",
            "must not be empty when detectLocalMode is BridgeInterface",
        )
    elif (
        cfg.detect_local_mode == "InterfaceNamePrefix"
        and not cfg.detect_local.interface_name_prefix
    ):
        errs.add(
            "detectLocal.interfaceNamePrefix",
            "must not be empty when detectLocalMode is InterfaceNamePrefix",
        )


def active_section(mode: str) -> str:
    """The configuration section ``mode`` reads (see MODE_SECTIONS)."""
    return MODE_SECTIONS.get(mode, "iptables")


def _check_nftables(cfg: KubeProxyConfiguration, errs: _Errors) -> None:
    _check_range(errs, "nftables.masqueradeBit", cfg.nftables.masquerade_bit, 0, 31)


def _check_ipvs(cfg: KubeProxyConfiguration, errs: _Errors) -> None:
    ipvs = cfg.ipvs
    _check_min(errs, "ipvs.tcpTimeout", ipvs.tcp_timeout)
    _check_min(errs, "ipvs.tcpFinTimeout", ipvs.tcp_fin_timeout)
    _check_min(errs, "ipvs.udpTimeout", ipvs.udp_timeout)
    if ipvs.scheduler and ipvs.scheduler not in IPVS_SCHEDULERS:
        errs.add(
            "ipvs.scheduler",
            f"unknown IPVS scheduler {_show(ipvs.scheduler)}, must be one of: "
            + ", ".join(sorted(IPVS_SCHEDULERS)),
        )


#: The checks of a section beyond its sync periods, run when its mode is active.
_SECTION_CHECKS: Mapping[str, Callable[[KubeProxyConfiguration, _Errors], None]] = {
    "nftables": _check_nftables,
    "ipvs": _check_ipvs,
}


def _show_number(value: float) -> str:
    return str(value) if isinstance(value, int) else format_duration(value)


def _check_min(errs: _Errors, path: str, value: float) -> None:
    """Non-negative check; ints print as numbers, floats are durations."""
    if value < 0:
        errs.add(path, f"must be >= 0, got {_show_number(value)}")


def _check_range(errs: _Errors, path: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        errs.add(path, f"must be within [{low}, {high}], got {value}")


def _check_sync_periods(errs: _Errors, section: str, sync: float, min_sync: float) -> None:
    sync_ok = sync > 0
    min_ok = min_sync >= 0
    if not sync_ok:
        errs.add(f"{section}.syncPeriod", f"must be > 0, got {format_duration(sync)}")
    if not min_ok:
        errs.add(f"{section}.minSyncPeriod", f"must be >= 0, got {format_duration(min_sync)}")
    if sync_ok and min_ok and min_sync > sync:
        errs.add(
            f"{section}.syncPeriod",
            f"must be >= {section}.minSyncPeriod ({format_duration(min_sync)}), "
            f"got {format_duration(sync)}",
        )


def _check_host_port(errs: _Errors, path: str, address: str) -> None:
    try:
        host, port = _split_host_port(address)
    except ValueError:
        errs.add(path, f"must be IP:port, got {_show(address)}")
        return
    if _parse_ip(host) is None:
        errs.add(path, f"must be IP:port with a valid IP address, got {_show(address)}")
    if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        errs.add(path, f"must be IP:port with a port in 1-65535, got {_show(address)}")


def _split_host_port(address: str) -> tuple[str, str]:
    """Go's net.SplitHostPort: "host:port" or "[host]:port"; the host may not hold a colon
    unless bracketed."""
    if address.startswith("["):
        end = address.find("]")
        if end < 0 or address[end + 1 : end + 2] != ":":
            raise ValueError(address)
        host, port = address[1:end], address[end + 2 :]
    else:
        host, sep, port = address.rpartition(":")
        if not sep or ":" in host:
            raise ValueError(address)
    if any(c in host for c in "[]") or any(c in port for c in "[]"):
        raise ValueError(address)
    return host, port


def _append_port_if_needed(address: str, port: int) -> str:
    """proxyutil.AppendPortIfNeeded: a bare IP gets the default port, anything else is left
    for validation to judge."""
    try:
        _split_host_port(address)
        return address
    except ValueError:
        pass
    ip = _parse_ip(address)
    if ip is None:
        return address
    return f"{address}:{port}" if ip.version == 4 else f"[{address}]:{port}"


def _parse_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if "%" in text:  # Go rejects IPv6 zones here; Python would accept them
        return None
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _parse_cidr(text: str) -> IPNetwork | None:
    """Go's net.ParseCIDR: "addr/prefix" with a numeric prefix; host bits may be set."""
    address, sep, prefix = text.partition("/")
    if not sep or not (prefix.isascii() and prefix.isdigit()) or _parse_ip(address) is None:
        return None
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        return None


def _is_port_range(text: str) -> bool:
    """k8s.io/apimachinery's PortRange: "", "port", "low-high" or "base+size", all <= 65535."""
    value = text.strip()
    if not value:
        return True
    match = re.fullmatch(r"([0-9]+)(?:([-+])([0-9]+))?", value)
    if match is None:
        return False
    low = int(match[1])
    high = low
    if match[2] is not None:
        high = int(match[3]) if match[2] == "-" else low + int(match[3])
    return low <= high <= 65535


# --- decoding ------------------------------------------------------------------------------

_Decoder = Callable[[object, str, _Errors, Mapping[str, Any]], Any]
_D = TypeVar("_D", bound="DataclassInstance")


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _mapping(value: object, path: str, errs: _Errors) -> dict[Any, Any] | None:
    if not isinstance(value, dict):
        errs.add(path, f"must be a mapping, got {_show(value)}")
        return None
    for key in getattr(value, "duplicates", ()):
        errs.add(_join(path, key), "duplicate field")
    return value


def _decode(
    cls: type[_D],
    value: object,
    path: str,
    errs: _Errors,
    extra_keys: Iterable[str] = (),
) -> _D:
    specs = [f for f in fields(cls) if "json" in f.metadata]
    doc = _mapping(value, path, errs)
    if doc is None:
        return cls()
    known = {f.metadata["json"] for f in specs} | set(extra_keys)
    for key in doc:
        if not isinstance(key, str) or key not in known:
            errs.add(_join(path, str(key)), "unknown field")
    kwargs: dict[str, Any] = {}
    for f in specs:
        name = f.metadata["json"]
        raw = doc.get(name)
        if raw is None:  # absent or null: Go leaves the field unset
            continue
        decoded = _DECODERS[f.metadata["kind"]](raw, _join(path, name), errs, f.metadata)
        if decoded is None or (f.metadata["zero_is_unset"] and not decoded):
            continue
        kwargs[f.name] = decoded
    return cls(**kwargs)


def _decode_bool(value: object, path: str, errs: _Errors, meta: Mapping[str, Any]) -> Any:
    if isinstance(value, bool):
        return value
    errs.add(path, f"must be a boolean, got {_show(value)}")
    return None


def _decode_str(value: object, path: str, errs: _Errors, meta: Mapping[str, Any]) -> Any:
    if isinstance(value, str):
        return value
    # sigs.k8s.io/yaml turns scalars into strings when the Go field is a string, so
    # `showHiddenMetricsForVersion: 1.33` works upstream; keep that.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _go_float(value)
    errs.add(path, f"must be a string, got {_show(value)}")
    return None


def _decode_int32(value: object, path: str, errs: _Errors, meta: Mapping[str, Any]) -> Any:
    if isinstance(value, bool) or not isinstance(value, int):
        errs.add(path, f"must be an integer, got {_show(value)}")
        return None
    if not -(2**31) <= value < 2**31:
        errs.add(path, f"must be a 32-bit integer, got {value}")
        return None
    return value


def _decode_float(value: object, path: str, errs: _Errors, meta: Mapping[str, Any]) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        errs.add(path, f"must be a number, got {_show(value)}")
        return None
    return float(value)


def _decode_duration(value: object, path: str, errs: _Errors, meta: Mapping[str, Any]) -> Any:
    # metav1.Duration only unmarshals from a JSON string; a bare number is an error upstream.
    if not isinstance(value, str):
        errs.add(path, f"{_DURATION_HINT}, got {_show(value)}")
        return None
    try:
        return parse_duration(value)
    except DurationError as e:
        errs.add(path, f"{_DURATION_HINT}, got {_show(value)} ({e.reason})")
        return None


def _decode_str_list(value: object, path: str, errs: _Errors, meta: Mapping[str, Any]) -> Any:
    if not isinstance(value, list):
        errs.add(path, f"must be a list of strings, got {_show(value)}")
        return None
    items = [
        "" if item is None else _decode_str(item, f"{path}[{i}]", errs, meta)
        for i, item in enumerate(value)
    ]
    return None if None in items else tuple(items)


def _decode_cidr_list(value: object, path: str, errs: _Errors, meta: Mapping[str, Any]) -> Any:
    items = _decode_str_list(value, path, errs, meta)
    if items is None:
        return None
    networks = []
    for i, item in enumerate(items):
        network = _parse_cidr(item)
        if network is None:
            errs.add(f"{path}[{i}]", f"must be a valid CIDR, got {_show(item)}")
        networks.append(network)
    return None if None in networks else tuple(networks)


def _decode_cidr_csv(value: object, path: str, errs: _Errors, meta: Mapping[str, Any]) -> Any:
    text = _decode_str(value, path, errs, meta)
    if not text:
        return None
    parts = text.split(",")
    if len(parts) > 2:
        errs.add(
            path,
            f"must be one CIDR or an IPv4,IPv6 pair (e.g. 10.100.0.0/16,fde4:8dba:82e1::/48), "
            f"got {_show(text)}",
        )
        return None
    networks = [_parse_cidr(p) for p in parts]
    for part, network in zip(parts, networks, strict=True):
        if network is None:
            errs.add(
                path,
                "must be a valid CIDR (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48), "
                f"got {_show(part)}",
            )
    valid = [n for n in networks if n is not None]
    if len(valid) != len(networks):
        return None
    if len(valid) == 2 and valid[0].version == valid[1].version:
        errs.add(path, f"must be a dual-stack pair, one IPv4 and one IPv6 CIDR, got {_show(text)}")
        return None
    return tuple(valid)


def _decode_bool_map(value: object, path: str, errs: _Errors, meta: Mapping[str, Any]) -> Any:
    doc = _mapping(value, path, errs)
    if doc is None:
        return None
    out: dict[str, bool] = {}
    for key, item in doc.items():
        name = key if isinstance(key, str) else _show(key)
        if isinstance(item, bool):
            out[name] = item
        else:
            errs.add(_join(path, name), f"must be a boolean, got {_show(item)}")
    return MappingProxyType(out)


def _decode_section(value: object, path: str, errs: _Errors, meta: Mapping[str, Any]) -> Any:
    return _decode(meta["cls"], value, path, errs)


def _decode_logging(value: object, path: str, errs: _Errors, meta: Mapping[str, Any]) -> Any:
    # Loose on purpose: LoggingConfiguration belongs to component-base and grows on its own,
    # so only its documented keys are type-checked and anything else is passed through.
    doc = _mapping(value, path, errs)
    if doc is None:
        return None
    before = len(errs.items)
    fmt = doc.get("format")
    if fmt is not None and fmt != "":
        if not isinstance(fmt, str):
            errs.add(f"{path}.format", f"must be a string, got {_show(fmt)}")
        elif fmt not in LOG_FORMATS:
            errs.add(
                f"{path}.format",
                f"unsupported log format {_show(fmt)}, must be one of: {', '.join(LOG_FORMATS)}",
            )
    flush = doc.get("flushFrequency")
    flush_zero = flush is None
    if isinstance(flush, str):
        flush_zero = _decode_duration(flush, f"{path}.flushFrequency", errs, meta) == 0
    elif flush is not None:
        # TimeOrMetaDuration: a duration string or integer nanoseconds.
        if isinstance(flush, bool) or not isinstance(flush, int):
            errs.add(
                f"{path}.flushFrequency",
                f"{_DURATION_HINT} or integer nanoseconds, got {_show(flush)}",
            )
        flush_zero = flush == 0
    _check_verbosity(doc.get("verbosity"), f"{path}.verbosity", errs)
    vmodule = doc.get("vmodule")
    if vmodule is not None:
        if not isinstance(vmodule, list):
            errs.add(f"{path}.vmodule", f"must be a list, got {_show(vmodule)}")
        else:
            for i, item in enumerate(vmodule):
                item_path = f"{path}.vmodule[{i}]"
                entry = _mapping(item, item_path, errs)
                if entry is None:
                    continue
                pattern = entry.get("filePattern")
                if not isinstance(pattern, str) or not pattern:
                    errs.add(f"{item_path}.filePattern", f"must be a string, got {_show(pattern)}")
                _check_verbosity(entry.get("verbosity"), f"{item_path}.verbosity", errs)
    options = doc.get("options")
    opts = _mapping(options, f"{path}.options", errs) if options is not None else None
    for name in LOG_FORMATS:
        sub = opts.get(name) if opts is not None else None
        sub_path = f"{path}.options.{name}"
        routing = _mapping(sub, sub_path, errs) if sub is not None else None
        if routing is None:
            continue
        split = routing.get("splitStream")
        if split is not None and not isinstance(split, bool):
            errs.add(f"{sub_path}.splitStream", f"must be a boolean, got {_show(split)}")
        size = routing.get("infoBufferSize")
        if size is not None and (isinstance(size, bool) or not isinstance(size, str | int)):
            errs.add(
                f"{sub_path}.infoBufferSize",
                f"must be a quantity such as 512 or 64Ki, got {_show(size)}",
            )
    if len(errs.items) != before:
        return None
    merged = {str(k): v for k, v in doc.items()}
    if not merged.get("format"):
        merged["format"] = _LOGGING_DEFAULTS["format"]
    if flush_zero:
        merged["flushFrequency"] = _LOGGING_DEFAULTS["flushFrequency"]
    if merged.get("verbosity") is None:
        merged["verbosity"] = _LOGGING_DEFAULTS["verbosity"]
    return _freeze(merged)


def _check_verbosity(value: object, path: str, errs: _Errors) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**32:
        errs.add(path, f"must be a non-negative integer, got {_show(value)}")


_DECODERS: dict[str, _Decoder] = {
    "bool": _decode_bool,
    "str": _decode_str,
    "int32": _decode_int32,
    "float": _decode_float,
    "duration": _decode_duration,
    "str_list": _decode_str_list,
    "cidr_list": _decode_cidr_list,
    "cidr_csv": _decode_cidr_csv,
    "bool_map": _decode_bool_map,
    "section": _decode_section,
    "logging": _decode_logging,
}


# --- encoding ------------------------------------------------------------------------------


def _encode(obj: DataclassInstance) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(obj):
        if "json" not in f.metadata:
            continue
        value = getattr(obj, f.name)
        kind = f.metadata["kind"]
        if kind == "duration":
            value = format_duration(value)
        elif kind == "section":
            value = _encode(value)
        elif kind == "cidr_csv":
            value = ",".join(str(n) for n in value)
        elif kind in ("cidr_list", "str_list"):
            value = [str(v) for v in value]
        elif kind in ("bool_map", "logging"):
            value = _thaw(value)
        out[f.metadata["json"]] = value
    return out


def _freeze(value: Any) -> Any:
    """Deep read-only copy of plain YAML data: mappings become MappingProxyType, lists tuples."""
    if isinstance(value, Mapping):
        return MappingProxyType({str(k): _freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


# --- YAML ----------------------------------------------------------------------------------


class _YamlMapping(dict[Any, Any]):
    """A mapping that remembers which keys it saw twice (PyYAML keeps the last silently)."""

    duplicates: tuple[str, ...] = ()


class _Loader(yaml.SafeLoader):
    """SafeLoader that records duplicate keys and leaves dates as strings, closer to what
    sigs.k8s.io/yaml hands kube-proxy."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> _YamlMapping:
    seen: set[Any] = set()
    duplicates: list[str] = []
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # "<<" merges may be overridden by explicit keys; that is not a duplicate
        key = loader.construct_object(key_node, deep=True)
        try:
            if key in seen:
                duplicates.append(str(key))
            seen.add(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, "found an unhashable mapping key", key_node.start_mark
            ) from None
    result = _YamlMapping(loader.construct_mapping(node, deep=True))
    result.duplicates = tuple(duplicates)
    return result


_Loader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)


def _yaml_problem(error: yaml.YAMLError) -> str:
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error)
    if mark is None:
        return f"malformed YAML: {problem}"
    return f"malformed YAML at line {mark.line + 1}, column {mark.column + 1}: {problem}"


# --- value printing ------------------------------------------------------------------------


def _go_float(value: float) -> str:
    text = repr(value)
    return text[:-2] if text.endswith(".0") else text


def _show(value: object) -> str:
    """A value as it would look in the file's JSON form, for "got ..." in messages."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float):
        return _go_float(value)
    if isinstance(value, int):
        return str(value)
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
