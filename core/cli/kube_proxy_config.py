"""The configuration a kube-proxy command line means, with upstream's precedence.

As cmd/kube-proxy/app/options.go (Complete) does:

* without ``--config`` the flags are the configuration: each one sets its field over the
  defaults, after defaulting (so ``--healthz-bind-address=""`` disables the server and
  ``--iptables-min-sync-period=0`` is zero, which a file cannot say);
* with ``--config`` the file is the configuration: only the logging flags (``-v``,
  ``--vmodule``, ``--logging-format``, ...) and ``--hostname-override`` apply over it, and
  every other configuration flag is ignored, as upstream ignores it, with a warning naming it;
* ``--iptables-*`` sync periods apply in every mode but ipvs, ``--ipvs-*`` ones in ipvs only;
* ``--healthz-port``/``--metrics-port`` (deprecated) apply only without ``--config`` and
  ``--write-config-to``: 0 disables the server, otherwise the port is added to a bind address
  given without one.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from kubeplex.core.cli.kube_proxy_flags import BY_NAME, FLAGS, Flag, ParsedFlags, UsageError
from kubeplex.core.config.addresses import append_port_if_needed, parse_ip
from kubeplex.core.config.decoding import thaw
from kubeplex.core.config.durations import parse_duration
from kubeplex.core.config.kubeproxy import (
    API_VERSION,
    KIND,
    KubeProxyConfiguration,
    load_config,
    parse_config,
    with_overrides,
)
from kubeplex.core.model.errors import FieldError, InvalidObject

FLAGS_SOURCE = "command-line flags"
_IPVS_ONLY = frozenset({"ipvs-sync-period", "ipvs-min-sync-period"})
_NOT_IPVS = frozenset({"iptables-sync-period", "iptables-min-sync-period"})
_POSITIVE = frozenset({"iptables-sync-period", "ipvs-sync-period", "config-sync-period"})


@dataclass
class Built:
    """The effective configuration, what to warn about, and ``--master``."""

    config: KubeProxyConfiguration
    warnings: list[str] = field(default_factory=list)
    master: str = ""


def _set(doc: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    for key in parents:
        doc = doc.setdefault(key, {})
    doc[leaf] = value


def _applies(flag: Flag, mode: str) -> bool:
    if flag.name in _IPVS_ONLY:
        return mode == "ipvs"
    if flag.name in _NOT_IPVS:
        return mode != "ipvs"
    return True


def _relabel(err: InvalidObject, given: Iterable[Flag], where: str) -> InvalidObject:
    """Field errors named by the flags that set the fields (``iptables.syncPeriod
    (--iptables-sync-period)``)."""
    by_path = {path: f.name for f in given for path in f.fields}
    relabelled = []
    for e in err.errors:
        name = by_path.get(e.path) or next(
            (n for p, n in by_path.items() if e.path.startswith(p + ".")), None
        )
        relabelled.append(FieldError(f"{e.path} (--{name})" if name else e.path, e.message))
    return InvalidObject(where, relabelled)


def _zero(text: Any) -> bool:
    return isinstance(text, str) and parse_duration(text) == 0


def _from_flags(
    parsed: ParsedFlags, known_modes: Iterable[str], hostname: str | None, built: Built
) -> None:
    mode = str(parsed.get("proxy-mode", ""))
    doc: dict[str, Any] = {"apiVersion": API_VERSION, "kind": KIND}
    if hostname is not None:
        doc["hostnameOverride"] = hostname
    errors: list[FieldError] = []
    given = [BY_NAME[name] for name in parsed.values]
    for flag in given:
        if flag.role not in ("config", "logging"):
            continue
        value = parsed.values[flag.name]
        if not _applies(flag, mode):
            built.warnings.append(
                f"--{flag.name} has no effect in {mode or 'iptables'} mode (as in kube-proxy)"
            )
            continue
        if flag.name in _POSITIVE and _zero(value):
            errors.append(FieldError(f"--{flag.name}", "must be greater than 0"))
            continue
        if flag.kind == "ipport" and value == "":
            continue  # disables the server: set after defaulting, below
        for path in flag.fields:
            _set(doc, path, value)
    if errors:
        raise InvalidObject(FLAGS_SOURCE, errors)
    ports = {
        "healthz": parsed.get("healthz-port") if not parsed.given("write-config-to") else None,
        "metrics": parsed.get("metrics-port") if not parsed.given("write-config-to") else None,
    }
    for kind, port in ports.items():
        address = doc.get(f"{kind}BindAddress")
        if port and address and parse_ip(address) is not None:
            doc[f"{kind}BindAddress"] = append_port_if_needed(address, port)
    try:
        cfg = parse_config(json.dumps(doc), FLAGS_SOURCE, known_modes)
    except InvalidObject as err:
        raise _relabel(err, given, FLAGS_SOURCE) from None
    # What upstream's flags set after defaulting, where a file's zero would mean "unset".
    if parsed.get("healthz-bind-address") == "" or ports["healthz"] == 0:
        cfg = replace(cfg, healthz_bind_address="")
    if parsed.get("metrics-bind-address") == "" or ports["metrics"] == 0:
        cfg = replace(cfg, metrics_bind_address="")
    if mode != "ipvs" and _zero(parsed.get("iptables-min-sync-period")):
        cfg = replace(
            cfg,
            iptables=replace(cfg.iptables, min_sync_period=0.0),
            nftables=replace(cfg.nftables, min_sync_period=0.0),
        )
    built.config = cfg


def _logging_over_file(
    cfg: KubeProxyConfiguration, parsed: ParsedFlags, known_modes: Iterable[str]
) -> KubeProxyConfiguration:
    """The file's ``logging`` with the logging flags given set over it (vmodule: the flags'
    entries first, then the file's, as upstream's copyLogsFromFlags)."""
    flags = [f for f in FLAGS if f.role == "logging" and parsed.given(f.name)]
    if not flags:
        return cfg
    logging: dict[str, Any] = thaw(cfg.logging)
    for flag in flags:
        value = parsed.values[flag.name]
        if flag.name == "vmodule":
            value = [*value, *logging.get("vmodule", [])]
        _set({"logging": logging}, flag.fields[0], value)
    doc = {"apiVersion": API_VERSION, "kind": KIND, "logging": logging}
    where = f"{cfg.source} (with command-line flags)"
    try:
        checked = parse_config(json.dumps(doc), where, known_modes)
    except InvalidObject as err:
        raise _relabel(err, flags, where) from None
    return replace(cfg, logging=checked.logging)


def _hostname(parsed: ParsedFlags) -> str | None:
    text = parsed.get("hostname-override", "")
    if not text:
        return None
    name = str(text).strip()
    if not name:
        raise UsageError("empty hostname-override is invalid")
    return name.lower()


def build(parsed: ParsedFlags, known_modes: Iterable[str]) -> Built:
    """The configuration of a parsed command line; InvalidObject or UsageError if bad."""
    modes = known_modes if isinstance(known_modes, Collection) else tuple(known_modes)
    built = Built(KubeProxyConfiguration(), warnings=list(parsed.warnings))
    built.master = str(parsed.get("master", ""))
    hostname = _hostname(parsed)
    for name in parsed.values:
        if BY_NAME[name].role == "noop":
            built.warnings.append(f"--{name} has no effect (kube-proxy does not use it either)")
    path = parsed.get("config")
    if path:
        cfg = load_config(path, known_modes=modes)
        if hostname is not None:
            cfg = with_overrides(cfg, hostname_override=hostname, known_modes=modes)
        built.config = _logging_over_file(cfg, parsed, modes)
        for name in parsed.values:
            flag = BY_NAME[name]
            if flag.role in ("config", "port"):
                fields = ", ".join(flag.fields) or "its field"
                built.warnings.append(
                    f"--{name} is ignored because --config is given (as kube-proxy ignores "
                    f"it); set {fields} in {path} instead"
                )
        return built
    _from_flags(parsed, modes, hostname, built)
    return built
