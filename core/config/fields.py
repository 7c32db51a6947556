"""What kubeplex does with every ``KubeProxyConfiguration`` v1alpha1 field (kube-proxy 1.33).

Each field is *honoured* as upstream does, *partly* honoured (a warning for the values kubeplex
cannot act on), or *warned*: accepted, because it cannot apply to kubeplex, with one warning at
start when the file sets it to something other than its default. :data:`FIELDS` is the one
table: :func:`start_warnings` reads it for the start-up warnings and :func:`markdown_table` renders
docs/configuration.md's table from it, so the two cannot drift.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any

from kubeplex.core.config.addresses import parse_ip
from kubeplex.core.config.decoding import LOG_FORMATS, thaw
from kubeplex.core.config.kubeproxy import default_config
from kubeplex.core.config.schema import KubeProxyConfiguration

__all__ = [
    "FIELDS",
    "HONOURED",
    "PARTLY",
    "WARNED",
    "FieldUse",
    "markdown_table",
    "schema_paths",
    "start_warnings",
]

HONOURED = "honoured"
PARTLY = "partly"
WARNED = "warned"

_PROTOBUF = "application/vnd.kubernetes.protobuf"

Check = Callable[[KubeProxyConfiguration, Any], bool]


@dataclass(frozen=True)
class FieldUse:
    """``does``: what kubeplex does with the field (the docs' words). For PARTLY and WARNED,
    ``why`` is the warning's reason and ``unusable`` says whether this configuration asks for
    what kubeplex cannot do (default: the value is set and differs from the default), in
    the docs' words ``when``."""

    status: str
    does: str
    why: str = ""
    unusable: Check | None = None
    #: When the warning is given, for the docs (``unusable`` says it to the code).
    when: str = "when set"


def _h(does: str) -> FieldUse:
    return FieldUse(HONOURED, does)


def _specific_ip(_cfg: KubeProxyConfiguration, value: Any) -> bool:
    ip = parse_ip(str(value))
    return ip is not None and not ip.is_unspecified


def _not_json(_cfg: KubeProxyConfiguration, value: Any) -> bool:
    return value not in ("", "application/json", _PROTOBUF)


def _buffered(_cfg: KubeProxyConfiguration, value: Any) -> bool:
    return value not in (None, 0, "0", "")


_UNBUFFERED = "kubeplex writes every log line unbuffered, so there is no info buffer to size"
_IPVS = "read by the ipvs mode only, as upstream (validated when that mode is active)"
_WINKERNEL = "read by the kernelspace (Windows) mode only, as upstream"
_SYNC = "honoured: the sync loop of the modes that read this section"

#: Every field, by its v1alpha1 path, in the order of upstream's types.go.
FIELDS: Mapping[str, FieldUse] = MappingProxyType(
    {
        "featureGates": FieldUse(
            WARNED,
            "accepted, not used",
            "kubeplex implements kube-proxy 1.33 with its default feature gates; gates set "
            "here switch nothing",
            lambda _cfg, value: bool(value),
            "when a gate is set",
        ),
        "clientConnection.kubeconfig": _h(
            "the kubeconfig of the API source (`--kubeconfig` overrides it)"
        ),
        "clientConnection.acceptContentTypes": FieldUse(
            WARNED,
            "accepted, not used",
            "the Python Kubernetes client always asks for application/json",
        ),
        "clientConnection.contentType": FieldUse(
            PARTLY,
            "JSON is sent (the protobuf default falls back to JSON with an info line)",
            "the Python Kubernetes client speaks application/json only",
            _not_json,
            "for any other type",
        ),
        "clientConnection.qps": _h("a client-side token bucket in front of every API request"),
        "clientConnection.burst": _h("the token bucket's size"),
        "logging.format": _h("`text` (kubeplex's lines) or `json` (component-base's JSON lines)"),
        "logging.flushFrequency": _h(
            "every line is written and flushed as it is logged, within any period"
        ),
        "logging.verbosity": _h("klog's `-v`: the highest verbosity shown (`--v` overrides it)"),
        "logging.vmodule": _h("per-module verbosity, `filePattern` matched against the file name"),
        "logging.options.text.splitStream": _h("info lines on stdout, errors on stderr"),
        "logging.options.text.infoBufferSize": FieldUse(
            WARNED, "accepted, not used", _UNBUFFERED, _buffered, "when not 0"
        ),
        "logging.options.json.splitStream": _h("info lines on stdout, errors on stderr"),
        "logging.options.json.infoBufferSize": FieldUse(
            WARNED, "accepted, not used", _UNBUFFERED, _buffered, "when not 0"
        ),
        "hostnameOverride": _h("the node's name (`--hostname-override` overrides it)"),
        "bindAddress": FieldUse(
            PARTLY,
            "picks the IP family of the default health and metrics addresses",
            "kubeplex takes the node's primary IP from its Node object, not from bindAddress",
            _specific_ip,
            "for a specific IP",
        ),
        "healthzBindAddress": _h("`/healthz` and `/livez` (empty: not served)"),
        "metricsBindAddress": _h("`/metrics` (empty: not served)"),
        "bindAddressHardFail": _h(
            "a health or metrics server that cannot listen stops the start (else retried every 5 s)"
        ),
        "enableProfiling": FieldUse(
            WARNED,
            "accepted, not used",
            "it enables Go's pprof handlers, which a Python process does not have",
        ),
        "showHiddenMetricsForVersion": FieldUse(
            WARNED,
            "accepted, not used",
            "kubeplex has no hidden (deprecated) metrics to show again",
        ),
        "mode": _h("the backend (`--proxy-mode` overrides it)"),
        "iptables.masqueradeBit": _h("the masquerade mark of the iptables mode"),
        "iptables.masqueradeAll": _h("SNAT of all Service traffic in the iptables mode"),
        "iptables.localhostNodePorts": _h("NodePorts on 127.0.0.1 in the iptables mode"),
        "iptables.syncPeriod": _h(_SYNC),
        "iptables.minSyncPeriod": _h(_SYNC),
        "ipvs.syncPeriod": _h(_IPVS),
        "ipvs.minSyncPeriod": _h(_IPVS),
        "ipvs.scheduler": _h(_IPVS),
        "ipvs.excludeCIDRs": _h(_IPVS),
        "ipvs.strictARP": _h(_IPVS),
        "ipvs.tcpTimeout": _h(_IPVS),
        "ipvs.tcpFinTimeout": _h(_IPVS),
        "ipvs.udpTimeout": _h(_IPVS),
        "nftables.masqueradeBit": _h("the masquerade mark of the nftables mode"),
        "nftables.masqueradeAll": _h("SNAT of all Service traffic in the nftables mode"),
        "nftables.syncPeriod": _h(_SYNC),
        "nftables.minSyncPeriod": _h(_SYNC),
        "winkernel.networkName": _h(_WINKERNEL),
        "winkernel.sourceVip": _h(_WINKERNEL),
        "winkernel.enableDSR": _h(_WINKERNEL),
        "winkernel.rootHnsEndpointName": _h(_WINKERNEL),
        "winkernel.forwardHealthCheckVip": _h(_WINKERNEL),
        "detectLocalMode": _h("how traffic from local pods is recognised"),
        "detectLocal.bridgeInterface": _h("the bridge of `detectLocalMode: BridgeInterface`"),
        "detectLocal.interfaceNamePrefix": _h(
            "the prefix of `detectLocalMode: InterfaceNamePrefix`"
        ),
        "clusterCIDR": _h("local-traffic detection (`--cluster-cidr` overrides it)"),
        "nodePortAddresses": _h("the addresses NodePorts answer on"),
        "oomScoreAdj": _h(
            "written to `/proc/self/oom_score_adj` at start (a warning if the kernel refuses)"
        ),
        "conntrack.maxPerCore": _h("`nf_conntrack_max` at start"),
        "conntrack.min": _h("`nf_conntrack_max` at start"),
        "conntrack.tcpEstablishedTimeout": _h("the conntrack sysctl at start"),
        "conntrack.tcpCloseWaitTimeout": _h("the conntrack sysctl at start"),
        "conntrack.tcpBeLiberal": _h("the conntrack sysctl at start"),
        "conntrack.udpTimeout": _h("the conntrack sysctl at start"),
        "conntrack.udpStreamTimeout": _h("the conntrack sysctl at start"),
        "configSyncPeriod": _h("how often the API source relists"),
        "portRange": FieldUse(
            WARNED,
            "validated, not used (as upstream)",
            "it configured the userspace proxy, which upstream removed",
        ),
        "windowsRunAsService": FieldUse(
            WARNED,
            "accepted, not used",
            "kubeplex does not run as a Windows service",
        ),
    }
)

#: The keys of component-base's LoggingConfiguration that :data:`FIELDS` lists.
_LOGGING_KEYS = frozenset({"format", "flushFrequency", "verbosity", "vmodule", "options"})
_ROUTING_KEYS = frozenset({"splitStream", "infoBufferSize"})


def schema_paths() -> Iterator[str]:
    """The dotted v1alpha1 path of every field of the schema (sections opened, not logging)."""

    def walk(cls: type[Any], prefix: str) -> Iterator[str]:
        for f in fields(cls):
            meta = f.metadata
            if "json" not in meta:
                continue
            path = f"{prefix}{meta['json']}"
            if meta["kind"] == "section":
                yield from walk(meta["cls"], f"{path}.")
            elif meta["kind"] != "logging":
                yield path

    return walk(KubeProxyConfiguration, "")


def _lookup(document: Mapping[str, Any], path: str) -> Any:
    value: Any = document
    for part in path.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def _unknown_logging_keys(section: Mapping[str, Any]) -> Iterator[str]:
    for key in section:
        if key not in _LOGGING_KEYS:
            yield f"logging.{key}"
    options = section.get("options")
    if isinstance(options, Mapping):
        for name, routing in options.items():
            if name not in LOG_FORMATS:
                yield f"logging.options.{name}"
            elif isinstance(routing, Mapping):
                yield from (
                    f"logging.options.{name}.{k}" for k in routing if k not in _ROUTING_KEYS
                )


def start_warnings(cfg: KubeProxyConfiguration) -> list[tuple[str, str]]:
    """(field path, why) for every field this configuration sets that kubeplex cannot act on,
    in table order; logging keys component-base may have added since are named too."""
    document, defaults = cfg.to_dict(), default_config().to_dict()
    out: list[tuple[str, str]] = []
    for path, use in FIELDS.items():
        if use.status == HONOURED:
            continue
        value = _lookup(document, path)
        if use.unusable is not None:
            asked = use.unusable(cfg, value)
        else:
            asked = value is not None and value != _lookup(defaults, path)
        if asked:
            out.append((path, use.why))
    out.extend(
        (path, "not a LoggingConfiguration field kubeplex knows; ignored")
        for path in _unknown_logging_keys(thaw(cfg.logging))
    )
    return out


def markdown_table() -> str:
    """docs/configuration.md's table: field, status, what kubeplex does (warned fields say why)."""
    lines = ["| field | status | what kubeplex does |", "| --- | --- | --- |"]
    for path, use in FIELDS.items():
        does = use.does if use.status == HONOURED else f"{use.does}; warns {use.when}: {use.why}"
        lines.append(f"| `{path}` | {use.status} | {does} |")
    return "\n".join(lines) + "\n"
