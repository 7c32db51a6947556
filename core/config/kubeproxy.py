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
import os
import sys
from collections.abc import Collection, Iterable, Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

import yaml

from kubeplex.core.config.addresses import (
    IPNetwork,
    append_port_if_needed,
    net_split_host_port,
    parse_ip,
)
from kubeplex.core.config.decoding import LOG_FORMATS as LOG_FORMATS
from kubeplex.core.config.decoding import Errors, decode, freeze, show, thaw
from kubeplex.core.config.durations import DurationError as DurationError
from kubeplex.core.config.durations import format_duration, parse_duration
from kubeplex.core.config.schema import (
    API_VERSION,
    DEFAULT_KNOWN_MODES,
    KIND,
    MODE_SECTIONS,
    ClientConnectionConfiguration,
    DetectLocalConfiguration,
    KubeProxyConfiguration,
    KubeProxyConntrackConfiguration,
    KubeProxyIPTablesConfiguration,
    KubeProxyIPVSConfiguration,
    KubeProxyNFTablesConfiguration,
    KubeProxyWinkernelConfiguration,
)
from kubeplex.core.config.schema import HEALTHZ_PORT as HEALTHZ_PORT
from kubeplex.core.config.schema import IPVS_SCHEDULERS as IPVS_SCHEDULERS
from kubeplex.core.config.schema import LOCAL_MODES as LOCAL_MODES
from kubeplex.core.config.schema import METRICS_PORT as METRICS_PORT
from kubeplex.core.config.schema import NODE_PORT_PRIMARY as NODE_PORT_PRIMARY
from kubeplex.core.config.validation import active_section, validate
from kubeplex.core.config.yamldocs import Loader, yaml_problem
from kubeplex.core.model.errors import FieldError, InvalidObject

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

#: nodePortAddresses when the file leaves it empty, for modes whose default is not "every
#: address" (upstream's nftables mode listens on the node's primary addresses only).
_MODE_NODE_PORT_DEFAULTS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"nftables": (NODE_PORT_PRIMARY,)}
)


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
        documents = [d for d in yaml.load_all(text, Loader=Loader) if d is not None]
    except yaml.YAMLError as e:
        raise InvalidObject(where, [FieldError("", yaml_problem(e))]) from None
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
    document = thaw(cfg._document) if cfg._document is not None else cfg.to_dict()
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
    host, port = net_split_host_port(address)
    if parse_ip(host) is None:
        raise ValueError(f"invalid IP {host!r} in {address!r}")
    if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        raise ValueError(f"invalid port {port!r} in {address!r}")
    return host, int(port)


# --- building ------------------------------------------------------------------------------


def _build(document: object, where: str, known_modes: Iterable[str]) -> KubeProxyConfiguration:
    errs = Errors()
    if not isinstance(document, dict):
        errs.add("", f"must be a {KIND} mapping, got {show(document)}")
        raise InvalidObject(where, errs.items)
    for key, expected in (("apiVersion", API_VERSION), ("kind", KIND)):
        got = document.get(key)
        if got is None:
            errs.add(key, f'required field is missing, must be "{expected}"')
        elif got != expected:
            errs.add(key, f'must be "{expected}", got {show(got)}')
    if errs.items:
        # Another kind of object: its field errors would only bury the real problem.
        raise InvalidObject(where, errs.items)

    cfg = decode(KubeProxyConfiguration, document, "", errs, extra_keys=("apiVersion", "kind"))
    cfg = _runtime_defaults(cfg, document)
    validate(cfg, known_modes if isinstance(known_modes, Collection) else tuple(known_modes), errs)
    if errs.items:
        raise InvalidObject(where, errs.items)
    return replace(cfg, source=where, _document=freeze(document))


def _platform_default_mode() -> str:
    # Read at call time so tests can fake the platform.
    return "kernelspace" if sys.platform == "win32" else "iptables"


def _runtime_defaults(
    cfg: KubeProxyConfiguration, doc: Mapping[str, Any]
) -> KubeProxyConfiguration:
    """Defaults that depend on other fields (defaults.go getDefaultAddresses and
    AppendPortIfNeeded; cmd/kube-proxy platformApplyDefaults)."""
    mode = cfg.mode if doc.get("mode") not in (None, "") else _platform_default_mode()
    ipv4 = isinstance(parse_ip(cfg.bind_address), ipaddress.IPv4Address)
    healthz_host, metrics_host = ("0.0.0.0", "127.0.0.1") if ipv4 else ("[::]", "[::1]")

    def address(key: str, current: str, host: str, port: int) -> str:
        if doc.get(key) in (None, ""):
            return f"{host}:{port}"
        return append_port_if_needed(current, port)

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
