"""The ``kube-proxy`` command line: pflag syntax, the flags' fields, upstream's precedence over
the config file, the errors that name a flag, and the config file's watch."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import yaml

from kubeplex.core.cli import kube_proxy
from kubeplex.core.cli.config_watch import ConfigWatch
from kubeplex.core.cli.kube_proxy_config import build
from kubeplex.core.cli.kube_proxy_flags import FLAGS, UsageError, parse
from kubeplex.core.cli.options import EXIT_BACKEND, EXIT_CONFIG, EXIT_OK, EXIT_USAGE
from kubeplex.core.config.kubeproxy import DEFAULT_KNOWN_MODES, KubeProxyConfiguration
from kubeplex.core.model.errors import InvalidObject


def config_of(*argv: str) -> KubeProxyConfiguration:
    return build(parse(argv), DEFAULT_KNOWN_MODES).config


def test_pflag_syntax() -> None:
    p = parse(["--proxy-mode=ipvs", "--cluster-cidr", "10.0.0.0/8", "-v=3", "--masquerade-all"])
    assert p.values == {
        "proxy-mode": "ipvs",
        "cluster-cidr": "10.0.0.0/8",
        "v": 3,
        "masquerade-all": True,
    }
    assert parse(["-v", "2"]).get("v") == 2
    assert parse(["-v4"]).get("v") == 4
    assert parse(["--v=5"]).get("v") == 5
    assert parse(["--masquerade-all=false"]).get("masquerade-all") is False
    assert parse(["--hostname_override=n1"]).get("hostname-override") == "n1"  # _ is -
    assert parse(["--nodeport-addresses=10.0.0.0/8,192.168.0.0/16"]).get("nodeport-addresses") == [
        "10.0.0.0/8",
        "192.168.0.0/16",
    ]
    repeated = parse(["--ipvs-exclude-cidrs=10.0.0.0/8", "--ipvs-exclude-cidrs=10.1.0.0/16"])
    assert repeated.get("ipvs-exclude-cidrs") == ["10.0.0.0/8", "10.1.0.0/16"]
    gates = parse(["--feature-gates=A=true,B=false", "--feature-gates", "C=1"])
    assert gates.get("feature-gates") == {"A": True, "B": False, "C": True}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--no-such-flag"], "unknown flag: --no-such-flag"),
        (["--proxy-port-range=1-2"], "unknown flag: --proxy-port-range"),  # removed upstream
        (["-x"], "unknown shorthand flag"),
        (["--config"], "flag needs an argument: --config"),
        (["--kube-api-qps=fast"], 'invalid argument "fast" for "--kube-api-qps"'),
        (["--kube-api-burst=1.5"], 'invalid argument "1.5" for "--kube-api-burst"'),
        (["--iptables-sync-period=30"], 'invalid argument "30" for "--iptables-sync-period"'),
        (["--masquerade-all=yes"], 'invalid argument "yes" for "--masquerade-all"'),
        (["--bind-address=node1"], 'invalid argument "node1" for "--bind-address"'),
        (["--healthz-bind-address=1.2.3.4:x"], '"--healthz-bind-address"'),
        (["--feature-gates=A"], "missing bool value for A"),
        (["--vmodule=foo"], '"--vmodule"'),
        (["--masquerade-all", "false"], "does not take any arguments"),
    ],
)
def test_bad_command_lines_name_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=None) as err:
        parse(argv)
    assert message in str(err.value)


@pytest.mark.parametrize(
    "text",
    [" 5", "5 ", "\u0661\u0662", "1__0", "_1", "1_", "08", "0x", "+-1", "", "5.0", "\uff15"],
)
def test_integers_are_go_integer_literals_only(text: str) -> None:
    # strconv.ParseInt(s, 0, 32) refuses spaces and non-ASCII digits, which int() accepts.
    with pytest.raises(UsageError, match=r"strconv.ParseInt: parsing .*: invalid syntax"):
        parse([f"--oom-score-adj={text}"])


@pytest.mark.parametrize(
    ("text", "value"),
    [("-999", -999), ("+5", 5), ("010", 8), ("0o17", 15), ("0x_1F", 31), ("0b101", 5),
     ("1_000", 1000), ("0", 0)],
)  # fmt: skip
def test_integers_take_every_go_literal(text: str, value: int) -> None:
    assert parse([f"--oom-score-adj={text}"]).get("oom-score-adj") == value


@pytest.mark.parametrize(
    "text", [" 5", "5 ", "\u0661", "1_.5", "0x1", "e5", "1e", "+nan", "-NaN", "nan()", "0x1.8"]
)
def test_floats_are_go_float_literals_only(text: str) -> None:
    with pytest.raises(UsageError, match=r"strconv.ParseFloat: parsing .*: invalid syntax"):
        parse([f"--kube-api-qps={text}"])


@pytest.mark.parametrize(
    ("text", "value"),
    [("5", 5.0), (".5", 0.5), ("5.", 5.0), ("1e3", 1000.0), ("1_000.5", 1000.5),
     ("0x1p3", 8.0), ("0X1.8P1", 3.0), ("+Inf", float("inf")), ("-infinity", float("-inf"))],
)  # fmt: skip
def test_floats_take_every_go_literal(text: str, value: float) -> None:
    assert parse([f"--kube-api-qps={text}"]).get("kube-api-qps") == value


def test_a_float_beyond_float32_is_out_of_range() -> None:
    with pytest.raises(UsageError, match="value out of range"):
        parse(["--kube-api-qps=1e39"])


@pytest.mark.parametrize("text", ["=true", " =false", "A=true,=true"])
def test_a_feature_gate_without_a_name_is_refused(text: str) -> None:
    with pytest.raises(UsageError, match="unrecognized feature gate"):
        parse([f"--feature-gates={text}"])


@pytest.mark.parametrize("where", ["folder", "full disk"])
def test_write_config_to_where_it_cannot_be_written_is_an_error(
    where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = str(tmp_path) if where == "folder" else "/dev/full"
    if where == "full disk" and not Path(target).exists():
        pytest.skip("no /dev/full here")
    assert kube_proxy.main([f"--write-config-to={target}"]) == EXIT_BACKEND
    err = capsys.readouterr().err
    assert f"--write-config-to {target}: cannot write:" in err
    assert "Traceback" not in err


def test_every_flag_of_the_issue_is_there() -> None:
    names = {f.name for f in FLAGS}
    wanted = [
        "config",
        "hostname-override",
        "v",
        "vmodule",
        "proxy-mode",
        "cluster-cidr",
        "kubeconfig",
        "master",
        "cleanup",
        "init-only",
        "write-config-to",
        "bind-address",
        "healthz-bind-address",
        "metrics-bind-address",
        "nodeport-addresses",
        "feature-gates",
        "masquerade-all",
        "iptables-masquerade-bit",
        "iptables-localhost-nodeports",
        "iptables-sync-period",
        "iptables-min-sync-period",
        "ipvs-sync-period",
        "ipvs-min-sync-period",
        "ipvs-scheduler",
        "ipvs-exclude-cidrs",
        "ipvs-strict-arp",
        "ipvs-tcp-timeout",
        "ipvs-tcpfin-timeout",
        "ipvs-udp-timeout",
        "conntrack-max-per-core",
        "conntrack-min",
        "conntrack-tcp-timeout-established",
        "conntrack-tcp-timeout-close-wait",
        "conntrack-tcp-be-liberal",
        "conntrack-udp-timeout",
        "conntrack-udp-timeout-stream",
        "detect-local-mode",
        "pod-bridge-interface",
        "pod-interface-name-prefix",
        "kube-api-qps",
        "kube-api-burst",
        "kube-api-content-type",
        "config-sync-period",
        "oom-score-adj",
        "logging-format",
        "profiling",
        "version",
        "bind-address-hard-fail",
        "show-hidden-metrics-for-version",
        "healthz-port",
        "metrics-port",
        "log-flush-frequency",
    ]
    assert set(wanted) <= names


def test_flags_set_their_fields_without_a_config_file() -> None:
    cfg = config_of(
        "--proxy-mode=nftables",
        "--cluster-cidr=10.244.0.0/16,fd00::/48",
        "--kubeconfig=/etc/kp/kubeconfig",
        "--kube-api-qps=20",
        "--kube-api-burst=40",
        "--iptables-sync-period=10s",
        "--iptables-min-sync-period=2s",
        "--masquerade-all",
        "--conntrack-max-per-core=0",
        "--conntrack-tcp-timeout-established=2h",
        "--conntrack-tcp-be-liberal",
        "--detect-local-mode=InterfaceNamePrefix",
        "--pod-interface-name-prefix=veth",
        "--nodeport-addresses=192.168.0.0/16",
        "--oom-score-adj=-500",
        "--config-sync-period=1m",
        "--feature-gates=A=true",
        "--hostname-override= Node-1 ",
        "--logging-format=json",
        "-v=4",
    )
    assert cfg.mode == "nftables"
    assert [str(c) for c in cfg.cluster_cidrs] == ["10.244.0.0/16", "fd00::/48"]
    assert cfg.client_connection.kubeconfig == "/etc/kp/kubeconfig"
    assert (cfg.client_connection.qps, cfg.client_connection.burst) == (20.0, 40)
    # --iptables-* sync flags are the sync periods of every mode but ipvs.
    assert (cfg.nftables.sync_period, cfg.nftables.min_sync_period) == (10.0, 2.0)
    assert cfg.nftables.masquerade_all and cfg.iptables.masquerade_all
    assert cfg.conntrack.max_per_core == 0
    assert cfg.conntrack.tcp_established_timeout == 7200.0
    assert cfg.conntrack.tcp_be_liberal
    assert cfg.detect_local_mode == "InterfaceNamePrefix"
    assert cfg.detect_local.interface_name_prefix == "veth"
    assert cfg.node_port_addresses == ("192.168.0.0/16",)
    assert cfg.oom_score_adj == -500
    assert cfg.config_sync_period == 60.0
    assert dict(cfg.feature_gates) == {"A": True}
    assert cfg.hostname_override == "node-1"  # trimmed and lowered, as upstream
    assert cfg.logging["format"] == "json" and cfg.logging["verbosity"] == 4


def test_ipvs_flags_apply_in_ipvs_mode_only() -> None:
    built = build(
        parse(["--ipvs-sync-period=5s", "--iptables-sync-period=7s"]), DEFAULT_KNOWN_MODES
    )
    assert built.config.iptables.sync_period == 7.0
    assert built.config.ipvs.sync_period == 30.0
    assert any("--ipvs-sync-period has no effect in iptables mode" in w for w in built.warnings)
    cfg = config_of("--proxy-mode=ipvs", "--ipvs-sync-period=5s", "--ipvs-scheduler=wrr")
    assert (cfg.ipvs.sync_period, cfg.ipvs.scheduler) == (5.0, "wrr")


def test_flags_are_applied_after_defaulting_as_upstream() -> None:
    # A file's zero means "unset"; a flag's zero is a zero.
    cfg = config_of("--iptables-min-sync-period=0", "--healthz-bind-address=")
    assert cfg.iptables.min_sync_period == 0.0
    assert cfg.healthz_bind_address == ""
    assert config_of("--metrics-port=0").metrics_bind_address == ""
    # The deprecated port is added to an address given without one.
    built = build(
        parse(["--healthz-bind-address=127.0.0.1", "--healthz-port=1234"]), DEFAULT_KNOWN_MODES
    )
    assert built.config.healthz_bind_address == "127.0.0.1:1234"
    assert any("--healthz-port has been deprecated" in w for w in built.warnings)


def test_invalid_values_name_their_flag() -> None:
    with pytest.raises(InvalidObject, match=r"--iptables-sync-period: must be greater than 0"):
        config_of("--iptables-sync-period=0")
    with pytest.raises(InvalidObject, match=r"\(--iptables-masquerade-bit\)"):
        config_of("--iptables-masquerade-bit=40")
    with pytest.raises(InvalidObject, match=r"\(--proxy-mode\)"):
        config_of("--proxy-mode=userspace")
    with pytest.raises(UsageError, match="empty hostname-override is invalid"):
        config_of("--hostname-override=  ")


def write(path: Path, doc: dict[str, object]) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
                "kind": "KubeProxyConfiguration",
                **doc,
            }
        )
    )
    return path


def test_with_a_config_file_only_logging_and_hostname_flags_apply(tmp_path: Path) -> None:
    path = write(
        tmp_path / "config.conf",
        {
            "mode": "nftables",
            "clusterCIDR": "10.244.0.0/16",
            "hostnameOverride": "from-file",
            "logging": {"verbosity": 1, "vmodule": [{"filePattern": "a", "verbosity": 2}]},
        },
    )
    built = build(
        parse(
            [
                f"--config={path}",
                "--hostname-override=From-Flag",
                "--proxy-mode=iptables",
                "--cluster-cidr=10.0.0.0/8",
                "--v=3",
                "--vmodule=b=4",
                "--logging-format=json",
            ]
        ),
        DEFAULT_KNOWN_MODES,
    )
    cfg = built.config
    assert cfg.hostname_override == "from-flag"
    assert cfg.mode == "nftables"  # --proxy-mode is ignored with --config, as upstream
    assert [str(c) for c in cfg.cluster_cidrs] == ["10.244.0.0/16"]
    assert cfg.logging["verbosity"] == 3 and cfg.logging["format"] == "json"
    assert [dict(v) for v in cfg.logging["vmodule"]] == [
        {"filePattern": "b", "verbosity": 4},
        {"filePattern": "a", "verbosity": 2},
    ]
    ignored = [w for w in built.warnings if "is ignored because --config is given" in w]
    assert len(ignored) == 2
    assert any(w.startswith("--proxy-mode ") and "set mode in" in w for w in ignored)


def test_kubeadm_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path / "config.conf", {"mode": "iptables"})
    monkeypatch.setenv("NODE_NAME", "worker-1")
    argv = ["--config=" + str(path), "--hostname-override=" + os.environ["NODE_NAME"]]
    built = build(parse(argv), DEFAULT_KNOWN_MODES)
    assert built.config.hostname_override == "worker-1"
    assert built.warnings == []


def test_main_version_help_usage_and_write_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert kube_proxy.main(["--version"]) == EXIT_OK
    out = capsys.readouterr().out
    assert out.startswith("kubeplex v") and "(kube-proxy v1.33)" in out
    assert kube_proxy.main(["--help"]) == EXIT_OK
    assert "--hostname-override" in capsys.readouterr().out
    assert kube_proxy.main(["--bogus"]) == EXIT_USAGE
    assert "unknown flag: --bogus" in capsys.readouterr().err
    assert kube_proxy.main(["--proxy-mode=nope", "--write-config-to=x"]) == EXIT_CONFIG
    target = tmp_path / "written.yaml"
    assert kube_proxy.main([f"--write-config-to={target}", "--proxy-mode=nftables"]) == EXIT_OK
    written = yaml.safe_load(target.read_text())
    assert written["apiVersion"] == "kubeproxy.config.k8s.io/v1alpha1"
    assert written["mode"] == "nftables" and written["nftables"]["syncPeriod"] == "30s"
    # What it wrote reads back as the same configuration.
    again = config_of(f"--config={target}")
    assert again == config_of("--proxy-mode=nftables")


def test_config_watch_sees_writes_replacements_and_removal(tmp_path: Path) -> None:
    path = write(tmp_path / "config.conf", {})
    watch = ConfigWatch(path)
    assert watch.change() is None
    path.write_text(path.read_text() + "mode: nftables\n")
    assert watch.change() == "written"

    replaced = ConfigWatch(path)
    (tmp_path / "new").write_text(path.read_text())
    os.replace(tmp_path / "new", path)  # what a ConfigMap update does, through a symlink
    assert replaced.change() == "replaced"

    removed = ConfigWatch(path)
    path.unlink()
    assert removed.change() == "removed"


def test_config_watch_calls_back_once(tmp_path: Path) -> None:
    path = write(tmp_path / "config.conf", {})
    watch = ConfigWatch(path, interval=0.01)
    stop, seen = threading.Event(), []
    changed = threading.Event()
    watch.start(stop, lambda why: (seen.append(why), changed.set()))
    path.write_text("changed\n")
    assert changed.wait(5)
    stop.set()
    assert seen == ["written"]
