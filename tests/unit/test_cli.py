"""The command line as a user runs it: a real process, its exit code and its messages."""

from __future__ import annotations

import errno
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from kits.cli_kit import LAB, RENDER_LAB, kubeplex

from kubeplex.core.cli import main as cli
from kubeplex.core.cli import render as render_cmd
from kubeplex.core.config.kubeproxy import KubeProxyConfiguration
from kubeplex.core.daemon import sysctls
from kubeplex.core.dataplane.backend import CONTRACT_VERSION, Backend


def test_version() -> None:
    proc = kubeplex("version")
    assert proc.returncode == 0
    assert proc.stdout.startswith("kubeplex ")


def test_every_command_is_a_module_of_the_dispatch_table() -> None:
    proc = kubeplex("--help")
    assert proc.returncode == 0, proc.stderr
    assert list(cli.COMMANDS) == [
        "run",
        "render",
        "cleanup",
        "migrate",
        "explain",
        "sysctls",
        "version",
        "backends",
        "lab",
    ]
    for name, command in cli.COMMANDS.items():
        assert command.__name__ == f"kubeplex.core.cli.{name}"  # type: ignore[attr-defined]
        assert name in proc.stdout


def test_render_the_lab_without_root() -> None:
    proc = kubeplex(*RENDER_LAB, "--no-observe")
    assert proc.returncode == 0, proc.stderr
    assert "-j KUBE-SVC-LOLE4ISW44XBNF3G" in proc.stdout
    assert "# ip6tables-restore --noflush input (IPv6, full sync)" in proc.stdout
    assert proc.stderr == ""


def test_render_without_a_readable_kernel_says_so_and_prints_the_rules_alone(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main([*RENDER_LAB, "--no-observe"]) == cli.EXIT_OK
    alone = capsys.readouterr().out
    make_backend = render_cmd.make_backend

    def unreadable(cfg: KubeProxyConfiguration, netns: str | None) -> Backend:
        backend = make_backend(cfg, netns)

        def refused(state: object) -> None:
            raise PermissionError("iptables-save: Permission denied (you must be root)\nmore")

        backend.observe = refused  # type: ignore[method-assign,assignment]
        return backend

    monkeypatch.setattr(render_cmd, "make_backend", unreadable)
    assert cli.main(list(RENDER_LAB)) == cli.EXIT_OK
    out, err = capsys.readouterr()
    assert out == alone
    assert err.splitlines() == [
        "kubeplex: cannot read the kernel (iptables-save: Permission denied (you must be root) "
        "more); printing the rules alone, without what this node has left over or lacks"
    ]


def test_backends_prints_the_contract_version_once() -> None:
    proc = kubeplex("backends")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("contract") == 1
    assert f"backend contract: version {CONTRACT_VERSION}\n" in proc.stdout
    as_json = json.loads(kubeplex("backends", "--json").stdout)
    assert as_json["contractVersion"] == CONTRACT_VERSION


def test_bad_config_names_the_field(tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\n"
        "kind: KubeProxyConfiguration\n"
        "iptables:\n  minSyncPeriod: -1s\n"
    )
    proc = kubeplex("render", "--config", str(cfg), "--manifests", str(LAB / "manifests"))
    assert proc.returncode == 3
    assert "iptables.minSyncPeriod: must be >= 0, got -1s" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_unknown_mode_is_refused() -> None:
    proc = kubeplex(
        "render",
        "--config",
        str(LAB / "config.yaml"),
        "--proxy-mode",
        "userspace",
        "--manifests",
        str(LAB / "manifests"),
    )
    assert proc.returncode == 3
    assert 'unknown proxy mode "userspace"' in proc.stderr


def test_malformed_manifest_is_reported_and_the_rest_renders(tmp_path: Path) -> None:
    (tmp_path / "web.yaml").write_text((LAB / "manifests" / "web.yaml").read_text())
    (tmp_path / "bad.yaml").write_text(
        "apiVersion: v1\nkind: Service\nmetadata: {name: bad, namespace: default}\n"
        "spec: {clusterIP: 10.96.0.99, ports: [{port: 99999}]}\n"
    )
    proc = kubeplex("render", "--config", str(LAB / "config.yaml"), "--manifests", str(tmp_path))
    assert proc.returncode == 3
    assert "Service default/bad: spec.ports[0].port: must be between 1 and 65535" in proc.stderr
    assert str(tmp_path / "bad.yaml") in proc.stderr
    assert "KUBE-SVC-LOLE4ISW44XBNF3G" in proc.stdout


def test_run_needs_a_source() -> None:
    proc = kubeplex("run", "--config", str(LAB / "config.yaml"), "--once")
    assert proc.returncode == 4
    assert "--manifests" in proc.stderr


# --- kubeplex sysctls ------------------------------------------------------------------------
# main() runs in this process, so write_sysctls can be pointed at a fake /proc/sys under
# tmp_path: a real process would write the real /proc/sys.

CONNTRACK_CONFIG = """\
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
conntrack:
  maxPerCore: 1000
  min: 5000
  tcpEstablishedTimeout: 2h
  tcpBeLiberal: true
  udpTimeout: 30s
"""
# What that configuration writes on 8 CPUs, in the order it is written (upstream's).
CONNTRACK_WANTED = [
    ("net.netfilter.nf_conntrack_max", 8000),
    ("net.netfilter.nf_conntrack_tcp_timeout_established", 7200),
    ("net.netfilter.nf_conntrack_tcp_timeout_close_wait", 3600),  # upstream's default
    ("net.netfilter.nf_conntrack_tcp_be_liberal", 1),
    ("net.netfilter.nf_conntrack_udp_timeout", 30),
]


@dataclass
class FakeKernel:
    proc_sys: Path
    hashsize: Path
    config: Path

    def read(self, name: str) -> int:
        return int((self.proc_sys / name.replace(".", "/")).read_text())

    def values(self) -> dict[str, str]:
        files = [p for p in self.proc_sys.rglob("*") if p.is_file()] + [self.hashsize]
        return {str(p): p.read_text() for p in files}


@pytest.fixture
def kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeKernel:
    """A fake /proc/sys (every key the tests set, at the kernel's usual defaults) and
    conntrack hashsize, which the CLI's write_sysctls is pointed at; 8 CPUs."""
    proc_sys = tmp_path / "proc-sys"
    defaults = {
        "net/netfilter/nf_conntrack_max": 262144,
        "net/netfilter/nf_conntrack_tcp_timeout_established": 432000,
        "net/netfilter/nf_conntrack_tcp_timeout_close_wait": 60,
        "net/netfilter/nf_conntrack_tcp_be_liberal": 0,
        "net/netfilter/nf_conntrack_udp_timeout": 30,  # already as configured
        "net/ipv4/ip_forward": 0,
        "net/ipv4/conf/all/route_localnet": 0,
        "net/ipv4/conf/eth0.100/rp_filter": 0,
    }
    for key, value in defaults.items():
        (proc_sys / key).parent.mkdir(parents=True, exist_ok=True)
        (proc_sys / key).write_text(f"{value}\n")
    hashsize = tmp_path / "hashsize"
    hashsize.write_text("1024\n")
    config = tmp_path / "config.conf"
    config.write_text(CONNTRACK_CONFIG)
    write = sysctls.write_sysctls

    def fake_write(
        settings: list[sysctls.SysctlSetting], *, netns: str | None = None
    ) -> sysctls.SysctlReport:
        return write(settings, netns=netns, proc_sys=proc_sys, hashsize=hashsize)

    monkeypatch.setattr(sysctls, "write_sysctls", fake_write)
    monkeypatch.setattr(sysctls, "detect_cpus", lambda: 8)
    return FakeKernel(proc_sys, hashsize, config)


def sysctls_cmd(kernel: FakeKernel, *args: str) -> int:
    return cli.main(["sysctls", "--config", str(kernel.config), *args])


def test_sysctls_help_lists_the_options() -> None:
    proc = kubeplex("sysctls", "--help")
    assert proc.returncode == 0, proc.stderr
    for option in ("--config", "--set NAME=VALUE", "--netns"):
        assert option in proc.stdout


def test_sysctls_writes_the_conntrack_settings_and_each_set(
    kernel: FakeKernel, capsys: pytest.CaptureFixture[str]
) -> None:
    code = sysctls_cmd(
        kernel, "--set", "net.ipv4.ip_forward=1", "--set=net.ipv4.conf.all.route_localnet=1"
    )
    out, err = capsys.readouterr()
    assert code == cli.EXIT_OK, err
    for name, value in CONNTRACK_WANTED:
        assert kernel.read(name) == value
    assert kernel.read("net.ipv4.ip_forward") == 1
    assert kernel.read("net.ipv4.conf.all.route_localnet") == 1
    # nf_conntrack_max 8000 needs 2000 hash buckets: the table grows.
    assert int(kernel.hashsize.read_text()) == 2000
    # One line per changed key, in the order written; udp_timeout was already 30.
    assert out.splitlines() == [
        "set net.netfilter.nf_conntrack_max = 8000 (was 262144)",
        f"set {kernel.hashsize} = 2000 (was 1024)",
        "set net.netfilter.nf_conntrack_tcp_timeout_established = 7200 (was 432000)",
        "set net.netfilter.nf_conntrack_tcp_timeout_close_wait = 3600 (was 60)",
        "set net.netfilter.nf_conntrack_tcp_be_liberal = 1 (was 0)",
        "set net.ipv4.ip_forward = 1 (was 0)",
        "set net.ipv4.conf.all.route_localnet = 1 (was 0)",
    ]


def test_sysctls_is_idempotent(kernel: FakeKernel, capsys: pytest.CaptureFixture[str]) -> None:
    args = ("--set", "net.ipv4.ip_forward=1")
    assert sysctls_cmd(kernel, *args) == cli.EXIT_OK
    assert capsys.readouterr().out != ""
    written = kernel.values()
    assert sysctls_cmd(kernel, *args) == cli.EXIT_OK
    assert capsys.readouterr().out == ""  # nothing changed, nothing reported
    assert kernel.values() == written


def test_sysctls_takes_dotted_names_as_sysctl_does(
    kernel: FakeKernel, capsys: pytest.CaptureFixture[str]
) -> None:
    # A slash stands for a dot inside one part of the name (an interface eth0.100).
    assert sysctls_cmd(kernel, "--set", "net.ipv4.conf.eth0/100.rp_filter=2") == cli.EXIT_OK
    assert (kernel.proc_sys / "net/ipv4/conf/eth0.100/rp_filter").read_text() == "2"
    assert "set net.ipv4.conf.eth0.100.rp_filter = 2 (was 0)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argument", "complaint"),
    [
        ("net.ipv4.ip_forward", "expected NAME=VALUE"),
        ("=1", "expected NAME=VALUE"),
        ("net.ipv4.ip_forward=yes", "the value must be an integer, got 'yes'"),
        ("net.ipv4.ip_forward=", "the value must be an integer, got ''"),
        ("net.ipv4.ip_forward=1.5", "the value must be an integer"),
        ("ip_forward=1", "'ip_forward' is not a sysctl name"),
        ("net..ip_forward=1", "'net..ip_forward' is not a sysctl name"),
        # As a path this would be net/ipv4/conf/../../x.
        ("net.ipv4.conf.//.//.x=1", "'net.ipv4.conf.//.//.x' is not a sysctl name"),
    ],
)
def test_sysctls_rejects_a_malformed_set(
    kernel: FakeKernel, capsys: pytest.CaptureFixture[str], argument: str, complaint: str
) -> None:
    before = kernel.values()
    with pytest.raises(SystemExit) as exited:
        sysctls_cmd(kernel, "--set", "net.ipv4.ip_forward=1", "--set", argument)
    assert exited.value.code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert f"kubeplex sysctls: error: argument --set: {argument!r}: {complaint}" in err
    assert kernel.values() == before  # refused before anything is written


@pytest.mark.parametrize(
    ("name", "refused", "why"),
    [
        # Not in the fake tree: a real ENOENT from open(2).
        ("net.ipv4.no_such_key", None, "(ENOENT, errno 2); no such key"),
        # The kernel's answers for a read-only key and a rejected value (root, who runs these
        # tests in CI, could write a read-only file of the fake tree).
        ("net.ipv4.ip_forward", errno.EACCES, "(EACCES, errno 13); the key is read-only here"),
        ("net.ipv4.ip_forward", errno.EINVAL, "(EINVAL, errno 22); the kernel rejected the value"),
    ],
)
def test_sysctls_kernel_refusal_fails_naming_the_key(
    kernel: FakeKernel,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    refused: int | None,
    why: str,
) -> None:
    if refused is not None:
        write_int = sysctls._write_int
        refused_path = kernel.proc_sys / name.replace(".", "/")

        def refuse(path: Path, value: int) -> None:
            if path == refused_path:
                raise OSError(refused, os.strerror(refused))
            write_int(path, value)

        monkeypatch.setattr(sysctls, "_write_int", refuse)
    code = sysctls_cmd(kernel, "--set", f"{name}=1", "--set", "net.ipv4.conf.all.route_localnet=1")
    out, err = capsys.readouterr()
    assert code == cli.EXIT_BACKEND
    assert f"kubeplex: cannot set {name}=1 (from --set): " in err
    assert why in err
    assert "Traceback" not in err
    # The other keys are still written (and reported), as the proxy would.
    assert kernel.read("net.ipv4.conf.all.route_localnet") == 1
    assert "set net.ipv4.conf.all.route_localnet = 1 (was 0)" in out.splitlines()


def test_sysctls_bad_config_writes_nothing(
    kernel: FakeKernel, capsys: pytest.CaptureFixture[str]
) -> None:
    before = kernel.values()
    kernel.config.write_text(CONNTRACK_CONFIG + "  udpTimeout: -1s\n")
    assert sysctls_cmd(kernel, "--set", "net.ipv4.ip_forward=1") == cli.EXIT_CONFIG
    assert "invalid configuration" in capsys.readouterr().err
    kernel.config.unlink()
    assert sysctls_cmd(kernel, "--set", "net.ipv4.ip_forward=1") == cli.EXIT_CONFIG
    assert kernel.values() == before


def test_sysctls_unknown_netns_writes_nothing(
    kernel: FakeKernel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = kernel.values()
    missing = tmp_path / "no-such-netns"
    assert sysctls_cmd(kernel, "--netns", str(missing)) == cli.EXIT_BACKEND
    assert f"kubeplex: cannot enter network namespace {missing}: " in capsys.readouterr().err
    assert kernel.values() == before


# --- kubeplex lab ----------------------------------------------------------------------------


def test_lab_describes_what_any_mode_programmed() -> None:
    from kubeplex.core.cli import lab
    from kubeplex.core.dataplane.backend import EndpointView, ProgrammedService
    from kubeplex.core.model.types import IPFamily

    assert lab.describe_programmed(None) == ["(this backend cannot read back what it programmed)"]
    assert lab.describe_programmed([]) == ["(nothing programmed)"]
    found = ProgrammedService(
        "default/web",
        IPFamily.IPv4,
        entries=("element ip kube-proxy service-ips { 10.96.88.59 . tcp . 80 : goto svc }",),
        endpoints=(EndpointView("10.244.1.2:8080", 0.5, weight=1), EndpointView("10.244.2.2:8080")),
        masquerade=True,
        affinity_seconds=10800,
        objects=("svc", "ep1"),
    )
    assert lab.describe_programmed([found]) == [
        "IPv4: where traffic enters",
        "  element ip kube-proxy service-ips { 10.96.88.59 . tcp . 80 : goto svc }",
        "IPv4: endpoints",
        "  10.244.1.2:8080        share 50.0%  weight 1",
        "  10.244.2.2:8080",
        "masquerade: marked",
        "session affinity: 10800 s",
        "kernel objects: svc, ep1",
    ]
    counted = ProgrammedService(
        "default/web", IPFamily.IPv4, endpoints=(EndpointView("10.244.1.2:8080", packets=9),)
    )
    before = lab._packets(
        [replace(counted, endpoints=(EndpointView("10.244.1.2:8080", packets=2),))]
    )
    assert lab._counted(before, lab._packets([counted])) == "      7 packets -> 10.244.1.2:8080"
    assert lab._counted({}, lab._packets([found])) == "(this mode keeps no per-endpoint counter)"
