"""kube-proxy v1.33's command-line flags: the table, a pflag-compatible parser, and what each
flag sets in a ``KubeProxyConfiguration`` document.

The syntax is spf13/pflag's as kube-proxy's cobra command sets it up: ``--flag=value`` or
``--flag value``; booleans ``--flag`` or ``--flag=false`` (never ``--flag false``); ``-v``
is the only shorthand (``-v=2``, ``-v 2``, ``-v2``); ``_`` and ``-`` are the same in a name;
``--`` ends the flags; lists are comma-separated (CSV), repeats append; a map flag takes
``A=true,B=false``, repeats merge.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubeplex.core.config.addresses import net_split_host_port, parse_ip
from kubeplex.core.config.durations import DurationError, parse_duration

#: The upstream release whose command line this follows.
KUBE_PROXY_VERSION = "v1.33"


class UsageError(Exception):
    """A command line kube-proxy would refuse, or kubeplex cannot honour; names the flag."""


@dataclass(frozen=True)
class Flag:
    """One flag. ``fields`` are the v1alpha1 paths it sets. ``role`` says when it applies:

    * ``config``: a configuration field; upstream ignores it when ``--config`` is given;
    * ``logging``: a ``logging`` field; applied over the file too (upstream's copyLogsFromFlags);
    * ``hostname``: ``--hostname-override``, applied over the file too;
    * ``action``, ``master``, ``port``: read by the command itself;
    * ``noop``: accepted and without effect, in kube-proxy too (a warning says so).
    """

    name: str
    kind: str
    help: str
    fields: tuple[str, ...] = ()
    role: str = "config"
    shorthand: str = ""
    deprecated: str = ""


_IGNORED = " Ignored if a config file is given by --config."
_DURATION = " (e.g. '5s', '1m', '2h22m')"

FLAGS: tuple[Flag, ...] = (
    # What to do.
    Flag("config", "string", "The path to the configuration file.", role="action"),
    Flag(
        "write-config-to",
        "string",
        "If set, write the default configuration values to this file and exit.",
        role="action",
    ),
    Flag("cleanup", "bool", "If true cleanup iptables and ipvs rules and exit.", role="action"),
    Flag(
        "init-only",
        "bool",
        "If true, perform any initialization steps that must be done with full root "
        "privileges, and then exit.",
        role="action",
    ),
    Flag(
        "version",
        "version",
        "--version, --version=raw prints version information and quits.",
        role="action",
    ),
    Flag("help", "bool", "help for kube-proxy", role="action", shorthand="h"),
    # The API server.
    Flag(
        "kubeconfig",
        "string",
        "Path to kubeconfig file with authorization information (the master location can be "
        "overridden by the master flag).",
        ("clientConnection.kubeconfig",),
    ),
    Flag(
        "master",
        "string",
        "The address of the Kubernetes API server (overrides any value in kubeconfig)",
        role="master",
    ),
    Flag(
        "kube-api-content-type",
        "string",
        "Content type of requests sent to apiserver.",
        ("clientConnection.contentType",),
    ),
    Flag(
        "kube-api-burst",
        "int32",
        "Burst to use while talking with kubernetes apiserver",
        ("clientConnection.burst",),
    ),
    Flag(
        "kube-api-qps",
        "float32",
        "QPS to use while talking with kubernetes apiserver",
        ("clientConnection.qps",),
    ),
    Flag(
        "config-sync-period",
        "duration",
        "How often configuration from the apiserver is refreshed. Must be greater than 0.",
        ("configSyncPeriod",),
    ),
    # The node and the servers.
    Flag(
        "hostname-override",
        "string",
        "If non-empty, will be used as the name of the Node that kube-proxy is running on.",
        role="hostname",
    ),
    Flag(
        "bind-address",
        "ip",
        "Overrides kube-proxy's idea of what its node's primary IP is." + _IGNORED,
        ("bindAddress",),
    ),
    Flag(
        "healthz-bind-address",
        "ipport",
        "The IP address and port for the health check server to serve on, defaulting to "
        '"0.0.0.0:10256". Set empty to disable.' + _IGNORED,
        ("healthzBindAddress",),
    ),
    Flag(
        "metrics-bind-address",
        "ipport",
        "The IP address and port for the metrics server to serve on, defaulting to "
        '"127.0.0.1:10249". Set empty to disable.' + _IGNORED,
        ("metricsBindAddress",),
    ),
    Flag(
        "bind-address-hard-fail",
        "bool",
        "If true kube-proxy will treat failure to bind to a port as fatal and exit",
        ("bindAddressHardFail",),
    ),
    Flag(
        "profiling",
        "bool",
        "If true enables profiling via web interface on /debug/pprof handler." + _IGNORED,
        ("enableProfiling",),
    ),
    Flag(
        "show-hidden-metrics-for-version",
        "string",
        "The previous version for which you want to show hidden metrics." + _IGNORED,
        ("showHiddenMetricsForVersion",),
    ),
    Flag(
        "proxy-mode",
        "string",
        "Which proxy mode to use: 'iptables' (default), 'ipvs', 'nftables' or another mode "
        "`kubeplex backends` lists." + _IGNORED,
        ("mode",),
    ),
    Flag(
        "feature-gates",
        "gates",
        "A set of key=value pairs that describe feature gates for alpha/experimental features."
        + _IGNORED,
        ("featureGates",),
    ),
    Flag(
        "oom-score-adj",
        "int32",
        "The oom-score-adj value for kube-proxy process. Values must be within the range "
        "[-1000, 1000]." + _IGNORED,
        ("oomScoreAdj",),
    ),
    # Rules.
    Flag(
        "iptables-masquerade-bit",
        "int32",
        "If using the iptables or ipvs proxy mode, the bit of the fwmark space to mark packets "
        "requiring SNAT with. Must be within the range [0, 31].",
        ("iptables.masqueradeBit",),
    ),
    Flag(
        "masquerade-all",
        "bool",
        "SNAT all traffic sent via Service cluster IPs.",
        ("iptables.masqueradeAll", "nftables.masqueradeAll"),
    ),
    Flag(
        "iptables-localhost-nodeports",
        "bool",
        "If false, disable the legacy behavior of allowing NodePort services to be accessed "
        "via localhost (iptables mode and IPv4 only).",
        ("iptables.localhostNodePorts",),
    ),
    Flag(
        "iptables-sync-period",
        "duration",
        "How often rules are fully resynchronized in every mode but ipvs" + _DURATION + ".",
        ("iptables.syncPeriod", "nftables.syncPeriod"),
    ),
    Flag(
        "iptables-min-sync-period",
        "duration",
        "The minimum period between rule resyncs in every mode but ipvs" + _DURATION + ".",
        ("iptables.minSyncPeriod", "nftables.minSyncPeriod"),
    ),
    Flag(
        "ipvs-sync-period",
        "duration",
        "How often IPVS rules are fully resynchronized" + _DURATION + ".",
        ("ipvs.syncPeriod",),
    ),
    Flag(
        "ipvs-min-sync-period",
        "duration",
        "The minimum period between IPVS rule resyncs" + _DURATION + ".",
        ("ipvs.minSyncPeriod",),
    ),
    Flag(
        "ipvs-scheduler",
        "string",
        "The ipvs scheduler type when proxy mode is ipvs",
        ("ipvs.scheduler",),
    ),
    Flag(
        "ipvs-exclude-cidrs",
        "strings",
        "A comma-separated list of CIDRs which the ipvs proxier should not touch when "
        "cleaning up IPVS rules.",
        ("ipvs.excludeCIDRs",),
    ),
    Flag(
        "ipvs-strict-arp",
        "bool",
        "Enable strict ARP by setting arp_ignore to 1 and arp_announce to 2",
        ("ipvs.strictARP",),
    ),
    Flag(
        "ipvs-tcp-timeout",
        "duration",
        "The timeout for idle IPVS TCP connections, 0 to leave as-is.",
        ("ipvs.tcpTimeout",),
    ),
    Flag(
        "ipvs-tcpfin-timeout",
        "duration",
        "The timeout for IPVS TCP connections after receiving a FIN packet, 0 to leave as-is.",
        ("ipvs.tcpFinTimeout",),
    ),
    Flag(
        "ipvs-udp-timeout",
        "duration",
        "The timeout for IPVS UDP packets, 0 to leave as-is.",
        ("ipvs.udpTimeout",),
    ),
    # Local traffic.
    Flag(
        "detect-local-mode",
        "string",
        "Mode to use to detect local traffic." + _IGNORED,
        ("detectLocalMode",),
    ),
    Flag(
        "pod-bridge-interface",
        "string",
        "A bridge interface name (--detect-local-mode=BridgeInterface).",
        ("detectLocal.bridgeInterface",),
    ),
    Flag(
        "pod-interface-name-prefix",
        "string",
        "An interface name prefix (--detect-local-mode=InterfaceNamePrefix).",
        ("detectLocal.interfaceNamePrefix",),
    ),
    Flag(
        "cluster-cidr",
        "string",
        "The CIDR range of the pods in the cluster (a comma-separated pair for dual-stack)."
        + _IGNORED,
        ("clusterCIDR",),
    ),
    Flag(
        "nodeport-addresses",
        "strings",
        "A list of CIDR ranges that contain valid node IPs, or the single string 'primary'."
        + _IGNORED,
        ("nodePortAddresses",),
    ),
    # Conntrack.
    Flag(
        "conntrack-max-per-core",
        "int32",
        "Maximum number of NAT connections to track per CPU core (0 to leave the limit as-is "
        "and ignore conntrack-min).",
        ("conntrack.maxPerCore",),
    ),
    Flag(
        "conntrack-min",
        "int32",
        "Minimum number of conntrack entries to allocate, regardless of conntrack-max-per-core.",
        ("conntrack.min",),
    ),
    Flag(
        "conntrack-tcp-timeout-established",
        "duration",
        "Idle timeout for established TCP connections (0 to leave as-is)",
        ("conntrack.tcpEstablishedTimeout",),
    ),
    Flag(
        "conntrack-tcp-timeout-close-wait",
        "duration",
        "NAT timeout for TCP connections in the CLOSE_WAIT state",
        ("conntrack.tcpCloseWaitTimeout",),
    ),
    Flag(
        "conntrack-tcp-be-liberal",
        "bool",
        "Enable liberal mode for tracking TCP packets by setting nf_conntrack_tcp_be_liberal to 1",
        ("conntrack.tcpBeLiberal",),
    ),
    Flag(
        "conntrack-udp-timeout",
        "duration",
        "Idle timeout for UNREPLIED UDP connections (0 to leave as-is)",
        ("conntrack.udpTimeout",),
    ),
    Flag(
        "conntrack-udp-timeout-stream",
        "duration",
        "Idle timeout for ASSURED UDP connections (0 to leave as-is)",
        ("conntrack.udpStreamTimeout",),
    ),
    # Deprecated ports (upstream's addressFromDeprecatedFlags).
    Flag(
        "healthz-port",
        "int32",
        "The port to bind the health check server. Use 0 to disable.",
        role="port",
        deprecated="Please use --healthz-bind-address instead.",
    ),
    Flag(
        "metrics-port",
        "int32",
        "The port to bind the metrics server. Use 0 to disable.",
        role="port",
        deprecated="Please use --metrics-bind-address instead.",
    ),
    # component-base logging (logsapi.AddFlags).
    Flag(
        "logging-format",
        "string",
        'Sets the log format. Permitted formats: "json", "text".',
        ("logging.format",),
        role="logging",
    ),
    Flag(
        "log-flush-frequency",
        "duration",
        "Maximum number of seconds between log flushes",
        ("logging.flushFrequency",),
        role="logging",
    ),
    Flag(
        "v",
        "level",
        "number for the log level verbosity",
        ("logging.verbosity",),
        role="logging",
        shorthand="v",
    ),
    Flag(
        "vmodule",
        "vmodule",
        "comma-separated list of pattern=N settings for file-filtered logging",
        ("logging.vmodule",),
        role="logging",
    ),
    Flag(
        "log-text-split-stream",
        "bool",
        "[Alpha] In text format, write error messages to stderr and info messages to stdout.",
        ("logging.options.text.splitStream",),
        role="logging",
    ),
    Flag(
        "log-text-info-buffer-size",
        "string",
        "[Alpha] In text format with split output streams, the info messages can be buffered.",
        ("logging.options.text.infoBufferSize",),
        role="logging",
    ),
    Flag(
        "log-json-split-stream",
        "bool",
        "[Alpha] In JSON format, write error messages to stderr and info messages to stdout.",
        ("logging.options.json.splitStream",),
        role="logging",
    ),
    Flag(
        "log-json-info-buffer-size",
        "string",
        "[Alpha] In JSON format with split output streams, the info messages can be buffered.",
        ("logging.options.json.infoBufferSize",),
        role="logging",
    ),
    # Go flags kube-proxy's binary carries from its dependencies, unused by kube-proxy itself.
    Flag("boot-id-file", "string", "Unused by kube-proxy (and kubeplex).", role="noop"),
    Flag("machine-id-file", "string", "Unused by kube-proxy (and kubeplex).", role="noop"),
)

BY_NAME: Mapping[str, Flag] = {f.name: f for f in FLAGS}
_BY_SHORTHAND: Mapping[str, Flag] = {f.shorthand: f for f in FLAGS if f.shorthand}
_TAKES_NO_VALUE = frozenset({"bool", "version"})


@dataclass
class ParsedFlags:
    """The flags given, by name (converted values), in the order first given."""

    values: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def given(self, name: str) -> bool:
        return name in self.values

    def get(self, name: str, default: Any = None) -> Any:
        return self.values.get(name, default)


def _go_bool(text: str) -> bool:
    # strconv.ParseBool
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise ValueError(f'strconv.ParseBool: parsing "{text}": invalid syntax')


# strconv.ParseInt(s, 0, 32)'s syntax: an optional sign, then a Go integer literal (a base
# prefix, or a leading 0 for octal; underscores only between digits or after a prefix). No
# spaces and no digits but ASCII, where Python's int() accepts both.
_GO_INT = re.compile(
    r"[+-]?(?:0[xX](?:_?[0-9a-fA-F])+|0[bB](?:_?[01])+|0[oO](?:_?[0-7])+|0(?:_?[0-7])*"
    r"|[1-9](?:_?[0-9])*)"
)
_GO_INT_BASES = {"x": 16, "b": 2, "o": 8}
# strconv.ParseFloat's syntax: a Go decimal or hexadecimal floating-point literal, or Inf,
# Infinity (signed or not) and NaN (unsigned), in any case.
_DEC = r"[0-9](?:_?[0-9])*"
_HEX = r"[0-9a-fA-F](?:_?[0-9a-fA-F])*"
_GO_FLOAT = re.compile(
    rf"[+-]?(?:(?:{_DEC}(?:\.(?:{_DEC})?)?|\.{_DEC})(?:[eE][+-]?{_DEC})?"
    rf"|0[xX](?:_?{_HEX}(?:\.(?:{_HEX})?)?|_?\.{_HEX})[pP][+-]?{_DEC}"
    r"|(?i:inf|infinity))|(?i:nan)"
)


def _go_int(text: str, low: int, high: int) -> int:
    if not text.isascii() or _GO_INT.fullmatch(text) is None:
        raise ValueError(f'strconv.ParseInt: parsing "{text}": invalid syntax')
    digits = text.lstrip("+-").replace("_", "")
    base = _GO_INT_BASES.get(digits[1:2].lower(), 8) if len(digits) > 1 and digits[0] == "0" else 10
    if base != 10 and digits[1:2].lower() in _GO_INT_BASES:
        digits = digits[2:]
    value = int(digits, base) * (-1 if text.startswith("-") else 1)
    if not low <= value <= high:
        raise ValueError(f'strconv.ParseInt: parsing "{text}": value out of range')
    return value


_FLOAT32_MAX = 3.4028234663852886e38


def _go_float32(text: str) -> float:
    if not text.isascii() or _GO_FLOAT.fullmatch(text) is None:
        raise ValueError(f'strconv.ParseFloat: parsing "{text}": invalid syntax')
    plain = text.replace("_", "").lower()
    infinite = plain.lstrip("+-").startswith("inf")
    value = float.fromhex(plain) if "x" in plain else float(plain)
    if not infinite and abs(value) > _FLOAT32_MAX:
        raise ValueError(f'strconv.ParseFloat: parsing "{text}": value out of range')
    return value


def _csv(text: str) -> list[str]:
    # pflag's StringSlice reads one CSV record; an empty value is an empty list.
    if text == "":
        return []
    return next(csv.reader([text]))


def _gates(text: str) -> dict[str, bool]:
    gates: dict[str, bool] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"missing bool value for {key.strip()}")
        if not key.strip():  # "=true": no gate has an empty name
            raise ValueError(f"unrecognized feature gate: {key.strip()}")
        gates[key.strip()] = _go_bool(value.strip())
    return gates


def _vmodule(text: str) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    for item in text.split(","):
        if not item:
            continue
        pattern, sep, level = item.partition("=")
        if not sep or not pattern:
            raise ValueError(f"{item!r} does not have the pattern=N format")
        entries.append({"filePattern": pattern, "verbosity": _go_int(level, 0, 2**31 - 1)})
    return entries


def _ip_port(text: str) -> str:
    # utilflag.IPPortVar: empty (disable), an IP, or IP:port.
    if not text.strip() or parse_ip(text) is not None:
        return text.strip()
    try:
        host, port = net_split_host_port(text)
    except ValueError as err:
        raise ValueError(f"{text!r} is not in a valid format (ip or ip:port): {err}") from None
    if parse_ip(host) is None:
        raise ValueError(f"{host!r} is not a valid IP address")
    if not (port.isascii() and port.isdigit()) or not 0 <= int(port) <= 65535:
        raise ValueError(f"{port!r} is not a valid number")
    return text


def convert(flag: Flag, text: str) -> Any:
    """The flag's value from its text; ValueError says why it is not one."""
    kind = flag.kind
    if kind == "bool":
        return _go_bool(text)
    if kind == "version":
        return "raw" if text == "raw" else _go_bool(text)
    if kind == "int32":
        return _go_int(text, -(2**31), 2**31 - 1)
    if kind == "level":
        return _go_int(text, 0, 2**31 - 1)
    if kind == "float32":
        return _go_float32(text)
    if kind == "duration":
        try:
            parse_duration(text)
        except DurationError as err:
            raise ValueError(f"time: invalid duration {text!r} ({err})") from None
        return text
    if kind == "ip":
        if text and parse_ip(text) is None:
            raise ValueError(f"{text!r} is not a valid IP address")
        return text
    if kind == "ipport":
        return _ip_port(text)
    if kind == "strings":
        return _csv(text)
    if kind == "gates":
        return _gates(text)
    if kind == "vmodule":
        return _vmodule(text)
    return text


def _store(parsed: ParsedFlags, flag: Flag, value: Any) -> None:
    old = parsed.values.get(flag.name)
    if old is not None and flag.kind in ("strings", "vmodule"):
        value = [*old, *value]
    elif old is not None and flag.kind == "gates":
        value = {**old, **value}
    parsed.values[flag.name] = value
    if flag.deprecated and not any(flag.name in w for w in parsed.warnings):
        parsed.warnings.append(f"Flag --{flag.name} has been deprecated, {flag.deprecated}")


def _lookup(name: str, shown: str) -> Flag:
    flag = BY_NAME.get(name.replace("_", "-"))
    if flag is None:
        raise UsageError(f"unknown flag: {shown}")
    return flag


def parse(argv: Sequence[str]) -> ParsedFlags:
    """Parse a kube-proxy command line (without the program name); UsageError if bad."""
    parsed = ParsedFlags()
    args = list(argv)
    positional: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            positional += args[i:]
            break
        if arg.startswith("--"):
            name, sep, text = arg[2:].partition("=")
            flag = _lookup(name, f"--{name}")
            shown = f"--{flag.name}"
        elif arg.startswith("-") and len(arg) > 1:
            short, rest = arg[1], arg[2:]
            flag = _BY_SHORTHAND.get(short)  # type: ignore[assignment]
            if flag is None:
                raise UsageError(f"unknown shorthand flag: {short!r} in {arg}")
            shown = f"-{short}"
            sep, text = ("=", rest[1:]) if rest.startswith("=") else ("=" if rest else "", rest)
        else:
            positional.append(arg)
            continue
        if not sep:
            if flag.kind in _TAKES_NO_VALUE:
                text = "true"
            elif i < len(args):
                text = args[i]
                i += 1
            else:
                raise UsageError(f"flag needs an argument: {shown}")
        try:
            value = convert(flag, text)
        except ValueError as err:
            raise UsageError(f'invalid argument "{text}" for "{shown}" flag: {err}') from None
        _store(parsed, flag, value)
    if any(positional):
        raise UsageError(f'"kube-proxy" does not take any arguments, got {positional}')
    return parsed


def usage() -> str:
    """The --help text."""
    lines = [
        "The Kubernetes network proxy (kubeplex, following kube-proxy "
        f"{KUBE_PROXY_VERSION}'s command line).",
        "",
        "Usage:",
        "  kube-proxy [flags]",
        "",
        "Flags:",
    ]
    for flag in FLAGS:
        if flag.deprecated:
            continue
        names = f"-{flag.shorthand}, --{flag.name}" if flag.shorthand else f"    --{flag.name}"
        kind = "" if flag.kind in _TAKES_NO_VALUE else f" {flag.kind}"
        lines.append(f"  {names}{kind}")
        lines.append(f"        {flag.help}")
    return "\n".join(lines) + "\n"
