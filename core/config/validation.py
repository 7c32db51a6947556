"""The validation of an effective configuration (pkg/proxy/apis/config/validation)."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping

from kubeplex.core.config.addresses import (
    is_port_range,
    net_split_host_port,
    parse_cidr,
    parse_ip,
)
from kubeplex.core.config.decoding import Errors, show
from kubeplex.core.config.durations import format_duration
from kubeplex.core.config.schema import (
    IPVS_SCHEDULERS,
    LOCAL_MODES,
    MODE_SECTIONS,
    NODE_PORT_PRIMARY,
    KubeProxyConfiguration,
)


def validate(cfg: KubeProxyConfiguration, known_modes: Collection[str], errs: Errors) -> None:
    """Add every rule ``cfg`` (defaults applied) breaks to ``errs``, always in the same order."""
    if cfg.mode not in known_modes:
        errs.add(
            "mode",
            f"unknown proxy mode {show(cfg.mode)}, must be one of: "
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

    if parse_ip(cfg.bind_address) is None:
        errs.add("bindAddress", f"must be a valid IP address, got {show(cfg.bind_address)}")
    _check_host_port(errs, "healthzBindAddress", cfg.healthz_bind_address)
    _check_host_port(errs, "metricsBindAddress", cfg.metrics_bind_address)

    if not is_port_range(cfg.port_range):
        errs.add(
            "portRange", f"must be a valid port range (e.g. 300-2000), got {show(cfg.port_range)}"
        )

    for i, address in enumerate(cfg.node_port_addresses):
        path = f"nodePortAddresses[{i}]"
        if address == NODE_PORT_PRIMARY:
            if len(cfg.node_port_addresses) != 1:
                errs.add(path, f'"primary" cannot be combined with CIDRs, got {show(address)}')
            break
        if parse_cidr(address) is None:
            errs.add(path, f'must be a valid CIDR or "primary", got {show(address)}')

    version = cfg.show_hidden_metrics_for_version
    if version and not re.fullmatch(r"[0-9]+\.[0-9]+", version):
        errs.add(
            "showHiddenMetricsForVersion",
            f'must be a <major>.<minor> version such as "1.33", got {show(version)}',
        )

    if cfg.detect_local_mode not in LOCAL_MODES:
        errs.add(
            "detectLocalMode",
            f"unsupported value {show(cfg.detect_local_mode)}, must be one of: "
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


def _check_nftables(cfg: KubeProxyConfiguration, errs: Errors) -> None:
    _check_range(errs, "nftables.masqueradeBit", cfg.nftables.masquerade_bit, 0, 31)


def _check_ipvs(cfg: KubeProxyConfiguration, errs: Errors) -> None:
    ipvs = cfg.ipvs
    _check_min(errs, "ipvs.tcpTimeout", ipvs.tcp_timeout)
    _check_min(errs, "ipvs.tcpFinTimeout", ipvs.tcp_fin_timeout)
    _check_min(errs, "ipvs.udpTimeout", ipvs.udp_timeout)
    if ipvs.scheduler and ipvs.scheduler not in IPVS_SCHEDULERS:
        errs.add(
            "ipvs.scheduler",
            f"unknown IPVS scheduler {show(ipvs.scheduler)}, must be one of: "
            + ", ".join(sorted(IPVS_SCHEDULERS)),
        )


#: The checks of a section beyond its sync periods, run when its mode is active.
_SECTION_CHECKS: Mapping[str, Callable[[KubeProxyConfiguration, Errors], None]] = {
    "nftables": _check_nftables,
    "ipvs": _check_ipvs,
}


def _show_number(value: float) -> str:
    return str(value) if isinstance(value, int) else format_duration(value)


def _check_min(errs: Errors, path: str, value: float) -> None:
    """Non-negative check; ints print as numbers, floats are durations."""
    if value < 0:
        errs.add(path, f"must be >= 0, got {_show_number(value)}")


def _check_range(errs: Errors, path: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        errs.add(path, f"must be within [{low}, {high}], got {value}")


def _check_sync_periods(errs: Errors, section: str, sync: float, min_sync: float) -> None:
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


def _check_host_port(errs: Errors, path: str, address: str) -> None:
    try:
        host, port = net_split_host_port(address)
    except ValueError:
        errs.add(path, f"must be IP:port, got {show(address)}")
        return
    if parse_ip(host) is None:
        errs.add(path, f"must be IP:port with a valid IP address, got {show(address)}")
    if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        errs.add(path, f"must be IP:port with a port in 1-65535, got {show(address)}")
