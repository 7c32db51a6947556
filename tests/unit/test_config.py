"""kubeplex.core.config.kubeproxy: the KubeProxyConfiguration file, as upstream reads it."""

from __future__ import annotations

import ipaddress
import json
import sys
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from kubeplex.core.config.durations import DurationError
from kubeplex.core.config.kubeproxy import (
    API_VERSION,
    DEFAULT_KNOWN_MODES,
    KIND,
    active_section,
    default_config,
    format_duration,
    load_config,
    parse_config,
    parse_duration,
    split_host_port,
    with_overrides,
)
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import BackendContext
from kubeplex.core.model.errors import InvalidObject
from kubeplex.testing import fakes

HEADER = f"apiVersion: {API_VERSION}\nkind: {KIND}\n"


def errors_of(text: str, known_modes: Iterable[str] = DEFAULT_KNOWN_MODES) -> list[str]:
    with pytest.raises(InvalidObject) as info:
        parse_config(text, "kube-proxy.yaml", known_modes)
    assert info.value.where == "kube-proxy.yaml"
    return [str(e) for e in info.value.errors]


# --- durations -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds", "printed"),
    [
        ("1s", 1.0, "1s"),
        ("1m30s", 90.0, "1m30s"),
        ("500ms", 0.5, "500ms"),
        ("1h", 3600.0, "1h0m0s"),
        ("-1s", -1.0, "-1s"),
        ("0", 0.0, "0s"),
        ("+2.5s", 2.5, "2.5s"),
        (".5h", 1800.0, "30m0s"),
        ("1h15m30.5s", 4530.5, "1h15m30.5s"),
        ("250us", 0.00025, "250\u00b5s"),
        ("3\u00b5s", 0.000003, "3\u00b5s"),
        ("10ns", 1e-8, "10ns"),
        ("1.5ns0.5ns", 1e-9, "1ns"),  # each number's sub-nanosecond part truncated, as in Go
        ("1.0000000019s", 1.000000001, "1.000000001s"),
    ],
)
def test_durations_parse_and_print_like_go(text: str, seconds: float, printed: str) -> None:
    assert parse_duration(text) == pytest.approx(seconds)
    assert format_duration(parse_duration(text)) == printed


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty"),
        ("1", "missing unit"),
        ("1d", 'unknown unit "d"'),
        ("s", "expected a number"),
        ("1 s", 'unknown unit " s"'),
        ("3000000h", "out of range"),
    ],
)
def test_bad_durations(text: str, reason: str) -> None:
    with pytest.raises(DurationError) as info:
        parse_duration(text)
    assert info.value.reason == reason


# --- a complete file -----------------------------------------------------------------------

# Every v1alpha1 field set to a non-default value, written the way to_dict() prints it.
FULL = """\
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
featureGates:
  SomeAlphaGate: true
  SomeBetaGate: false
clientConnection:
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  acceptContentTypes: application/json
  contentType: application/json
  qps: 50.5
  burst: 100
logging:
  format: json
  flushFrequency: 10s
  verbosity: 4
  vmodule:
  - filePattern: proxier*
    verbosity: 6
  options:
    json:
      splitStream: true
      infoBufferSize: 64Ki
hostnameOverride: node-1
bindAddress: 10.1.2.3
healthzBindAddress: 10.1.2.3:20256
metricsBindAddress: 0.0.0.0:20249
bindAddressHardFail: true
enableProfiling: true
showHiddenMetricsForVersion: '1.33'
mode: nftables
iptables:
  masqueradeBit: 13
  masqueradeAll: true
  localhostNodePorts: false
  syncPeriod: 1m0s
  minSyncPeriod: 2s
ipvs:
  syncPeriod: 45s
  minSyncPeriod: 500ms
  scheduler: wrr
  excludeCIDRs:
  - 10.200.0.0/16
  - fd00:1::/64
  strictARP: true
  tcpTimeout: 15m0s
  tcpFinTimeout: 30s
  udpTimeout: 5s
nftables:
  masqueradeBit: 12
  masqueradeAll: true
  syncPeriod: 1m30s
  minSyncPeriod: 3s
winkernel:
  networkName: l2bridge
  sourceVip: 10.244.1.2
  enableDSR: true
  rootHnsEndpointName: cbr0
  forwardHealthCheckVip: true
detectLocalMode: InterfaceNamePrefix
detectLocal:
  bridgeInterface: cbr0
  interfaceNamePrefix: veth
clusterCIDR: 10.244.0.0/16,fd00:10:244::/56
nodePortAddresses:
- 192.168.0.0/16
- fd00:192::/64
oomScoreAdj: -500
conntrack:
  maxPerCore: 0
  min: 65536
  tcpEstablishedTimeout: 12h0m0s
  tcpCloseWaitTimeout: 0s
  tcpBeLiberal: true
  udpTimeout: 30s
  udpStreamTimeout: 5m0s
configSyncPeriod: 10m0s
portRange: 30000-32767
windowsRunAsService: true
"""


def test_full_config_is_read_and_printed_back_unchanged() -> None:
    cfg = parse_config(FULL, "full.yaml")

    assert cfg.source == "full.yaml"
    assert dict(cfg.feature_gates) == {"SomeAlphaGate": True, "SomeBetaGate": False}
    assert cfg.client_connection.qps == 50.5
    assert cfg.client_connection.burst == 100
    assert cfg.logging["format"] == "json"
    assert cfg.logging["vmodule"][0]["filePattern"] == "proxier*"
    assert cfg.mode == "nftables"
    assert cfg.iptables.min_sync_period == 2.0
    assert cfg.iptables.localhost_node_ports is False
    assert cfg.ipvs.min_sync_period == 0.5
    assert cfg.ipvs.exclude_cidrs == (
        ipaddress.ip_network("10.200.0.0/16"),
        ipaddress.ip_network("fd00:1::/64"),
    )
    assert cfg.cluster_cidrs == (
        ipaddress.ip_network("10.244.0.0/16"),
        ipaddress.ip_network("fd00:10:244::/56"),
    )
    assert cfg.node_port_cidrs[1] == ipaddress.ip_network("fd00:192::/64")
    # Explicit zeros of pointer fields are kept, not defaulted.
    assert cfg.conntrack.max_per_core == 0
    assert cfg.conntrack.tcp_close_wait_timeout == 0.0
    assert cfg.conntrack.udp_stream_timeout == 300.0
    assert cfg.config_sync_period == 600.0
    # The active mode reads its own section.
    assert active_section(cfg.mode) == "nftables"
    assert (cfg.nftables.sync_period, cfg.nftables.min_sync_period) == (90.0, 3.0)
    assert (cfg.nftables.masquerade_bit, cfg.nftables.masquerade_all) == (12, True)

    assert cfg.to_dict() == yaml.safe_load(FULL)
    again = parse_config(yaml.safe_dump(cfg.to_dict()), "again.yaml")
    assert again == cfg
    assert hash(again) == hash(cfg)


# --- defaults ------------------------------------------------------------------------------


def test_minimal_file_gets_upstream_defaults() -> None:
    cfg = parse_config(HEADER, "minimal.yaml")
    assert cfg == default_config()

    assert cfg.bind_address == "0.0.0.0"
    assert cfg.healthz_bind_address == "0.0.0.0:10256"
    assert cfg.metrics_bind_address == "127.0.0.1:10249"
    assert cfg.mode == "iptables"
    assert cfg.detect_local_mode == "ClusterCIDR"
    assert cfg.cluster_cidrs == ()
    assert cfg.node_port_addresses == ()
    assert cfg.oom_score_adj == -999
    assert cfg.config_sync_period == 15 * 60
    assert dict(cfg.feature_gates) == {}
    assert dict(cfg.logging) == {"format": "text", "flushFrequency": "5s", "verbosity": 0}

    cc = cfg.client_connection
    assert (cc.content_type, cc.qps, cc.burst) == ("application/vnd.kubernetes.protobuf", 5.0, 10)

    ipt = cfg.iptables
    assert (ipt.sync_period, ipt.min_sync_period, ipt.masquerade_bit) == (30.0, 1.0, 14)
    assert (ipt.localhost_node_ports, ipt.masquerade_all) == (True, False)
    nft = cfg.nftables
    assert (nft.sync_period, nft.min_sync_period, nft.masquerade_bit) == (30.0, 1.0, 14)
    assert (cfg.ipvs.sync_period, cfg.ipvs.min_sync_period, cfg.ipvs.scheduler) == (30.0, 0.0, "")

    ct = cfg.conntrack
    assert (ct.max_per_core, ct.min) == (32768, 131072)
    assert (ct.tcp_established_timeout, ct.tcp_close_wait_timeout) == (86400.0, 3600.0)
    assert (ct.udp_timeout, ct.udp_stream_timeout, ct.tcp_be_liberal) == (0.0, 0.0, False)

    assert active_section(cfg.mode) == "iptables"


# What `kubeadm` writes into the kube-proxy ConfigMap: every field present, mostly null/zero.
KUBEADM = """\
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: ""
  burst: 0
  contentType: ""
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 0
clusterCIDR: 10.244.0.0/16
configSyncPeriod: 0s
conntrack:
  maxPerCore: null
  min: null
  tcpBeLiberal: false
  tcpCloseWaitTimeout: null
  tcpEstablishedTimeout: null
  udpStreamTimeout: 0s
  udpTimeout: 0s
detectLocal:
  bridgeInterface: ""
  interfaceNamePrefix: ""
detectLocalMode: ""
enableProfiling: false
healthzBindAddress: ""
hostnameOverride: ""
iptables:
  localhostNodePorts: null
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: ""
  strictARP: false
  syncPeriod: 0s
  tcpFinTimeout: 0s
  tcpTimeout: 0s
  udpTimeout: 0s
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
    text:
      infoBufferSize: "0"
  verbosity: 0
metricsBindAddress: ""
mode: ""
nftables:
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
nodePortAddresses: null
oomScoreAdj: null
portRange: ""
showHiddenMetricsForVersion: ""
winkernel:
  enableDSR: false
  forwardHealthCheckVip: false
  networkName: ""
  rootHnsEndpointName: ""
  sourceVip: ""
"""


def test_kubeadm_style_zeros_and_nulls_mean_defaults() -> None:
    cfg = parse_config(KUBEADM, "config.conf")
    defaults = default_config()
    expected = replace(
        defaults,
        cluster_cidrs=(ipaddress.ip_network("10.244.0.0/16"),),
        client_connection=replace(
            defaults.client_connection, kubeconfig="/var/lib/kube-proxy/kubeconfig.conf"
        ),
        logging=cfg.logging,
    )
    assert cfg == expected
    assert cfg.logging["flushFrequency"] == "5s"
    assert cfg.logging["format"] == "text"


def test_defaults_that_depend_on_other_fields() -> None:
    ipv6 = parse_config(HEADER + "bindAddress: '::'\n", "f")
    assert (ipv6.healthz_bind_address, ipv6.metrics_bind_address) == ("[::]:10256", "[::1]:10249")

    bare = parse_config(HEADER + "healthzBindAddress: 10.0.0.1\nmetricsBindAddress: '::'\n", "f")
    assert (bare.healthz_bind_address, bare.metrics_bind_address) == (
        "10.0.0.1:10256",
        "[::]:10249",
    )

    nft = parse_config(HEADER + "mode: nftables\n", "f")
    assert nft.node_port_addresses == ("primary",)
    assert nft.node_port_cidrs == ()


def test_empty_mode_means_kernelspace_on_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "win32")
    assert parse_config(HEADER + "mode: ''\n", "f").mode == "kernelspace"
    assert default_config().mode == "kernelspace"


def test_sync_settings_follow_the_mode() -> None:
    """Each mode reads (and is validated by) its own section, iptables' if it has none; the
    installed backends take their sync periods from it."""
    sections = (
        "iptables: {syncPeriod: 10s, minSyncPeriod: 2s, masqueradeBit: 10, masqueradeAll: true}\n"
        "ipvs: {syncPeriod: 20s, minSyncPeriod: 3s}\n"
        "nftables: {syncPeriod: 40s, minSyncPeriod: 4s, masqueradeBit: 11}\n"
    )
    for mode, section, periods in [
        ("iptables", "iptables", (10.0, 2.0)),
        ("ipvs", "ipvs", (20.0, 3.0)),
        ("nftables", "nftables", (40.0, 4.0)),
        ("kernelspace", "iptables", (10.0, 2.0)),
    ]:
        cfg = parse_config(HEADER + f"mode: {mode}\n" + sections, "f")
        assert active_section(cfg.mode) == section
        read = getattr(cfg, section)
        assert (read.sync_period, read.min_sync_period) == periods
        if mode in plugins.available():  # (no ipvs backend here)
            ctx = BackendContext(cfg, "node-a", kernel=fakes.for_mode(mode))
            assert plugins.load_backend(mode, ctx).sync_periods() == periods, mode
        assert errors_of(
            HEADER + f"mode: {mode}\n{section}: {{syncPeriod: 1s, minSyncPeriod: 2s}}\n"
        ) == [f"{section}.syncPeriod: must be >= {section}.minSyncPeriod (2s), got 1s"]


def test_sections_of_inactive_modes_are_not_range_checked() -> None:
    # Upstream validates the ipvs/nftables sections only in their own mode.
    cfg = parse_config(
        HEADER + "ipvs: {syncPeriod: -1s, tcpTimeout: -1s, scheduler: bogus}\n"
        "nftables: {masqueradeBit: 40}\n",
        "f",
    )
    assert cfg.ipvs.sync_period == -1.0


def test_plugin_modes_come_from_the_caller() -> None:
    cfg = parse_config(HEADER + "mode: ebpf\n", "f", known_modes=("iptables", "ebpf"))
    assert cfg.mode == "ebpf"
    assert errors_of(HEADER + "mode: ipvs\n", known_modes=("iptables", "ebpf")) == [
        'mode: unknown proxy mode "ipvs", must be one of: ebpf, iptables'
    ]


def test_string_fields_take_yaml_scalars_like_sigs_k8s_io_yaml() -> None:
    cfg = parse_config(HEADER + "showHiddenMetricsForVersion: 1.33\nhostnameOverride: 42\n", "f")
    assert (cfg.show_hidden_metrics_for_version, cfg.hostname_override) == ("1.33", "42")


def test_logging_is_loose_but_known_keys_are_typed() -> None:
    cfg = parse_config(HEADER + "logging: {format: text, someFutureOption: {a: 1}}\n", "f")
    assert cfg.logging["someFutureOption"]["a"] == 1
    assert errors_of(HEADER + "logging: {vmodule: [{filePattern: x, verbosity: high}]}\n") == [
        'logging.vmodule[0].verbosity: must be a non-negative integer, got "high"'
    ]


# --- errors --------------------------------------------------------------------------------

HINT = 'must be a duration string such as "30s" or "1m30s"'
SCHEDULERS = "dh, fo, lblc, lblcr, lc, mh, nq, ovf, rr, sed, sh, twos, wlc, wrr"
MODES = "iptables, ipvs, kernelspace, nftables"
A_CIDR = "must be a valid CIDR (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)"
DUAL = "must be a dual-stack pair, one IPv4 and one IPv6 CIDR"

# Whole documents.
BAD_DOCUMENTS = [
    ("- 1\n", "must be a KubeProxyConfiguration mapping, got [1]"),
    ("", "empty document, expected a KubeProxyConfiguration"),
    (HEADER + "---\n" + HEADER, "expected a single YAML document, found 2"),
    (
        HEADER + "iptables: [1, 2\n",
        "malformed YAML at line 4, column 1: did not find expected ',' or ']'",
    ),
    (
        HEADER + "iptables:\n  syncPeriod: 1s\n minSyncPeriod: 2s\n",
        "malformed YAML at line 5, column 2: did not find expected key",
    ),
    (
        "apiVersion: kubeproxy.config.k8s.io/v1beta1\nkind: KubeProxyConfiguration\n",
        f'apiVersion: must be "{API_VERSION}", got "kubeproxy.config.k8s.io/v1beta1"',
    ),
    (
        f"apiVersion: {API_VERSION}\nkind: KubeletConfiguration\nfoo: 1\n",
        'kind: must be "KubeProxyConfiguration", got "KubeletConfiguration"',
    ),
    (
        "kind: KubeProxyConfiguration\n",
        f'apiVersion: required field is missing, must be "{API_VERSION}"',
    ),
]

# Snippets that follow a valid apiVersion/kind header.
BAD_FIELDS = [
    # structure
    ("foo: 1", "foo: unknown field"),
    ("iptables: {foo: 1}", "iptables.foo: unknown field"),
    ("conntrack: {maxPercore: 1}", "conntrack.maxPercore: unknown field"),
    ("mode: iptables\nmode: ipvs", "mode: duplicate field"),
    ("iptables: []", "iptables: must be a mapping, got []"),
    # types
    ('iptables: {masqueradeAll: "yes"}', 'iptables.masqueradeAll: must be a boolean, got "yes"'),
    ('iptables: {masqueradeBit: "14"}', 'iptables.masqueradeBit: must be an integer, got "14"'),
    ("oomScoreAdj: 99999999999", "oomScoreAdj: must be a 32-bit integer, got 99999999999"),
    ("clientConnection: {qps: fast}", 'clientConnection.qps: must be a number, got "fast"'),
    ("hostnameOverride: [a]", 'hostnameOverride: must be a string, got ["a"]'),
    ('featureGates: {Foo: "true"}', 'featureGates.Foo: must be a boolean, got "true"'),
    (
        "nodePortAddresses: 10.0.0.0/8",
        'nodePortAddresses: must be a list of strings, got "10.0.0.0/8"',
    ),
    # durations
    ("iptables: {syncPeriod: 30}", f"iptables.syncPeriod: {HINT}, got 30"),
    ("iptables: {syncPeriod: 1d}", f'iptables.syncPeriod: {HINT}, got "1d" (unknown unit "d")'),
    ('configSyncPeriod: "10"', f'configSyncPeriod: {HINT}, got "10" (missing unit)'),
    ("iptables: {minSyncPeriod: -1s}", "iptables.minSyncPeriod: must be >= 0, got -1s"),
    ("iptables: {syncPeriod: -1s}", "iptables.syncPeriod: must be > 0, got -1s"),
    (
        "iptables: {syncPeriod: 5s, minSyncPeriod: 10s}",
        "iptables.syncPeriod: must be >= iptables.minSyncPeriod (10s), got 5s",
    ),
    ("configSyncPeriod: -1m", "configSyncPeriod: must be > 0, got -1m0s"),
    (
        "conntrack: {udpStreamTimeout: -300s}",
        "conntrack.udpStreamTimeout: must be >= 0, got -5m0s",
    ),
    (
        "conntrack: {tcpEstablishedTimeout: -1h}",
        "conntrack.tcpEstablishedTimeout: must be >= 0, got -1h0m0s",
    ),
    # ranges
    ("iptables: {masqueradeBit: 32}", "iptables.masqueradeBit: must be within [0, 31], got 32"),
    (
        "mode: nftables\nnftables: {masqueradeBit: -1}",
        "nftables.masqueradeBit: must be within [0, 31], got -1",
    ),
    (
        "mode: nftables\nnftables: {minSyncPeriod: -1m30s}",
        "nftables.minSyncPeriod: must be >= 0, got -1m30s",
    ),
    ("mode: ipvs\nipvs: {syncPeriod: -5s}", "ipvs.syncPeriod: must be > 0, got -5s"),
    ("mode: ipvs\nipvs: {tcpTimeout: -1s}", "ipvs.tcpTimeout: must be >= 0, got -1s"),
    (
        "mode: ipvs\nipvs: {scheduler: fastest}",
        f'ipvs.scheduler: unknown IPVS scheduler "fastest", must be one of: {SCHEDULERS}',
    ),
    ("conntrack: {maxPerCore: -1}", "conntrack.maxPerCore: must be >= 0, got -1"),
    ("conntrack: {min: -1}", "conntrack.min: must be >= 0, got -1"),
    ("clientConnection: {burst: -1}", "clientConnection.burst: must be >= 0, got -1"),
    ("oomScoreAdj: 1001", "oomScoreAdj: must be within [-1000, 1000], got 1001"),
    # addresses
    ("clusterCIDR: 10.0.0.0/33", f'clusterCIDR: {A_CIDR}, got "10.0.0.0/33"'),
    ("clusterCIDR: 10.0.0.0", f'clusterCIDR: {A_CIDR}, got "10.0.0.0"'),
    ("clusterCIDR: 10.0.0.0/8,10.1.0.0/16", f'clusterCIDR: {DUAL}, got "10.0.0.0/8,10.1.0.0/16"'),
    (
        "clusterCIDR: 10.0.0.0/8,fd00::/48,fd01::/48",
        "clusterCIDR: must be one CIDR or an IPv4,IPv6 pair "
        '(e.g. 10.100.0.0/16,fde4:8dba:82e1::/48), got "10.0.0.0/8,fd00::/48,fd01::/48"',
    ),
    (
        "ipvs: {excludeCIDRs: [10.0.0.0/8, 10.0.0.0/33]}",
        'ipvs.excludeCIDRs[1]: must be a valid CIDR, got "10.0.0.0/33"',
    ),
    (
        "nodePortAddresses: [10.0.0.0/8, bogus]",
        'nodePortAddresses[1]: must be a valid CIDR or "primary", got "bogus"',
    ),
    (
        "nodePortAddresses: [10.0.0.0/8, primary]",
        'nodePortAddresses[1]: "primary" cannot be combined with CIDRs, got "primary"',
    ),
    ("bindAddress: 10.0.0.256", 'bindAddress: must be a valid IP address, got "10.0.0.256"'),
    (
        'healthzBindAddress: "0.0.0.0:99999"',
        'healthzBindAddress: must be IP:port with a port in 1-65535, got "0.0.0.0:99999"',
    ),
    (
        "metricsBindAddress: localhost:10249",
        'metricsBindAddress: must be IP:port with a valid IP address, got "localhost:10249"',
    ),
    ('metricsBindAddress: "::1:10249"', 'metricsBindAddress: must be IP:port, got "::1:10249"'),
    # enumerations and the rest
    ("mode: userspace", f'mode: unknown proxy mode "userspace", must be one of: {MODES}'),
    (
        "detectLocalMode: PodCIDR",
        'detectLocalMode: unsupported value "PodCIDR", must be one of: '
        "ClusterCIDR, NodeCIDR, BridgeInterface, InterfaceNamePrefix",
    ),
    (
        "detectLocalMode: BridgeInterface",
        "detectLocal.bridgeInterface: must not be empty when detectLocalMode is BridgeInterface",
    ),
    (
        "detectLocalMode: InterfaceNamePrefix\ndetectLocal: {bridgeInterface: cbr0}",
        "detectLocal.interfaceNamePrefix: "
        "must not be empty when detectLocalMode is InterfaceNamePrefix",
    ),
    (
        "portRange: 2000-300",
        'portRange: must be a valid port range (e.g. 300-2000), got "2000-300"',
    ),
    (
        "showHiddenMetricsForVersion: v1.33",
        "showHiddenMetricsForVersion: "
        'must be a <major>.<minor> version such as "1.33", got "v1.33"',
    ),
    ("logging: {verbosity: -1}", "logging.verbosity: must be a non-negative integer, got -1"),
    (
        "logging: {format: xml}",
        'logging.format: unsupported log format "xml", must be one of: json, text',
    ),
]


@pytest.mark.parametrize(("text", "expected"), BAD_DOCUMENTS)
def test_bad_documents(text: str, expected: str) -> None:
    assert errors_of(text) == [expected]


@pytest.mark.parametrize(("snippet", "expected"), BAD_FIELDS)
def test_bad_field_names_path_and_value(snippet: str, expected: str) -> None:
    assert errors_of(HEADER + snippet + "\n") == [expected]


def test_error_table_is_broad() -> None:
    assert len({e for _, e in BAD_DOCUMENTS + BAD_FIELDS}) >= 25


def test_every_error_of_a_file_is_reported() -> None:
    text = HEADER + (
        "foo: 1\n"
        "iptables: {minSyncPeriod: -1s, masqueradeBit: 32, bar: true}\n"
        "mode: nope\n"
        "clusterCIDR: 10.0.0.0/8,10.1.0.0/16\n"
        "bindAddress: nowhere\n"
        "conntrack: {min: -5}\n"
        "detectLocalMode: BridgeInterface\n"
    )
    with pytest.raises(InvalidObject) as info:
        parse_config(text, "many.yaml")
    messages = [str(e) for e in info.value.errors]
    assert messages == [
        "foo: unknown field",
        "iptables.bar: unknown field",
        f'clusterCIDR: {DUAL}, got "10.0.0.0/8,10.1.0.0/16"',
        'mode: unknown proxy mode "nope", must be one of: iptables, ipvs, kernelspace, nftables',
        "iptables.masqueradeBit: must be within [0, 31], got 32",
        "iptables.minSyncPeriod: must be >= 0, got -1s",
        "conntrack.min: must be >= 0, got -5",
        'bindAddress: must be a valid IP address, got "nowhere"',
        "detectLocal.bridgeInterface: must not be empty when detectLocalMode is BridgeInterface",
    ]
    assert [e.path for e in info.value.errors][:2] == ["foo", "iptables.bar"]
    assert str(info.value).startswith("many.yaml: foo: unknown field; iptables.bar: unknown field;")


# --- command-line overrides ----------------------------------------------------------------


def test_with_overrides_applies_flags_and_redefaults() -> None:
    cfg = parse_config(HEADER + "mode: nftables\nclusterCIDR: 10.0.0.0/8\n", "file.yaml")
    assert cfg.node_port_addresses == ("primary",)

    flagged = with_overrides(cfg, hostname_override="node-7", mode="iptables", cluster_cidr="")
    assert flagged.hostname_override == "node-7"
    assert flagged.mode == "iptables"
    assert flagged.cluster_cidrs == ()
    # "primary" was nftables' default, not the user's choice: it goes with the mode.
    assert flagged.node_port_addresses == ()
    assert flagged.source == "file.yaml"
    assert cfg.mode == "nftables"  # the original is untouched

    unchanged = with_overrides(cfg)
    assert unchanged == cfg


def test_with_overrides_validates() -> None:
    cfg = parse_config(HEADER + "ipvs: {syncPeriod: -1s}\n", "file.yaml")
    with pytest.raises(InvalidObject) as info:
        with_overrides(cfg, mode="ipvs", cluster_cidr="10.0.0.0/8,10.1.0.0/16")
    assert info.value.where == "file.yaml (with command-line overrides)"
    assert [str(e) for e in info.value.errors] == [
        f'clusterCIDR: {DUAL}, got "10.0.0.0/8,10.1.0.0/16"',
        "ipvs.syncPeriod: must be > 0, got -1s",
    ]

    with pytest.raises(InvalidObject) as info:
        with_overrides(default_config(), mode="bpf")
    assert [str(e) for e in info.value.errors] == [
        'mode: unknown proxy mode "bpf", must be one of: iptables, ipvs, kernelspace, nftables'
    ]
    assert with_overrides(default_config(), mode="bpf", known_modes=["bpf"]).mode == "bpf"


# --- files and helpers ---------------------------------------------------------------------


def test_load_config_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "config.conf"
    path.write_text(FULL, encoding="utf-8")
    assert load_config(path) == parse_config(FULL, "x")
    assert load_config(path).source == str(path)

    with pytest.raises(InvalidObject) as info:
        load_config(tmp_path / "missing.conf")
    assert [str(e) for e in info.value.errors] == ["cannot read file: No such file or directory"]


def test_json_is_yaml_too() -> None:
    document = {"apiVersion": API_VERSION, "kind": KIND, "mode": "ipvs"}
    cfg = parse_config(json.dumps(document), "f.json")
    assert cfg.mode == "ipvs"


@pytest.mark.parametrize(
    ("address", "expected"),
    [("0.0.0.0:10256", ("0.0.0.0", 10256)), ("[::1]:10249", ("::1", 10249))],
)
def test_split_host_port(address: str, expected: tuple[str, int]) -> None:
    assert split_host_port(address) == expected


@pytest.mark.parametrize("address", ["0.0.0.0", "::1:80", "[::1]", "host:80", "1.2.3.4:0"])
def test_split_host_port_rejects(address: str) -> None:
    with pytest.raises(ValueError):
        split_host_port(address)
