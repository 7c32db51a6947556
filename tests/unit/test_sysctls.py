"""conntrack.* sysctls: upstream's values and skips, and clear refusals (a real namespace:
tests/kernel/test_sysctls_kernel.py)."""

from __future__ import annotations

import errno
from dataclasses import replace
from pathlib import Path

import pytest
from kits import cli_kit

from kubeplex.core.config.kubeproxy import KubeProxyConntrackConfiguration
from kubeplex.core.daemon.sysctls import (
    NF_CONNTRACK_MAX,
    TCP_BE_LIBERAL,
    TCP_CLOSE_WAIT,
    TCP_ESTABLISHED,
    UDP_STREAM_TIMEOUT,
    UDP_TIMEOUT,
    SysctlError,
    SysctlSetting,
    apply_conntrack_sysctls,
    conntrack_settings,
    write_sysctls,
)

DEFAULTS = KubeProxyConntrackConfiguration()


def values(settings: list[SysctlSetting]) -> dict[str, int]:
    return {s.key: s.value for s in settings}


def test_defaults_write_what_upstream_writes() -> None:
    # 32768 x 2 CPUs < min 131072: the floor wins; zero UDP timeouts are left alone.
    assert values(conntrack_settings(DEFAULTS, cpus=2)) == {
        NF_CONNTRACK_MAX: 131072,
        TCP_ESTABLISHED: 86400,
        TCP_CLOSE_WAIT: 3600,
    }


def test_scaling_zero_values_and_the_rest() -> None:
    ct = replace(
        DEFAULTS,
        max_per_core=100_000,
        tcp_be_liberal=True,
        udp_timeout=30.0,
        udp_stream_timeout=180.0,
        tcp_close_wait_timeout=0.0,
    )
    settings = conntrack_settings(ct, cpus=4)
    assert [s.key for s in settings] == [
        NF_CONNTRACK_MAX,
        TCP_ESTABLISHED,
        TCP_BE_LIBERAL,
        UDP_TIMEOUT,
        UDP_STREAM_TIMEOUT,
    ]
    assert values(settings)[NF_CONNTRACK_MAX] == 400_000
    assert settings[0].source == "conntrack.maxPerCore 100000 x 4 CPUs, conntrack.min 131072"
    assert settings[0].name == "net.netfilter.nf_conntrack_max"
    # maxPerCore 0 leaves nf_conntrack_max alone, whatever min says.
    assert NF_CONNTRACK_MAX not in values(conntrack_settings(replace(ct, max_per_core=0), cpus=4))


@pytest.fixture
def proc_sys(tmp_path: Path) -> Path:
    root = tmp_path / "proc-sys"
    (root / "net/netfilter").mkdir(parents=True)
    for key, value in (
        (NF_CONNTRACK_MAX, 262144),
        (TCP_ESTABLISHED, 86400),
        (TCP_CLOSE_WAIT, 60),
    ):
        (root / key).write_text(f"{value}\n")
    return root


def test_writes_only_what_differs_and_grows_the_hash_table(proc_sys: Path, tmp_path: Path) -> None:
    hashsize = tmp_path / "hashsize"
    hashsize.write_text("16384\n")
    report = apply_conntrack_sysctls(DEFAULTS, cpus=2, proc_sys=proc_sys, hashsize=hashsize)
    assert report.errors == []
    assert report.changed == [
        ("net.netfilter.nf_conntrack_max", 262144, 131072),
        (str(hashsize), 16384, 32768),
        ("net.netfilter.nf_conntrack_tcp_timeout_close_wait", 60, 3600),
    ]
    assert report.unchanged == ["net.netfilter.nf_conntrack_tcp_timeout_established"]
    assert (proc_sys / NF_CONNTRACK_MAX).read_text() == "131072"
    assert hashsize.read_text() == "32768"
    again = apply_conntrack_sysctls(DEFAULTS, cpus=2, proc_sys=proc_sys, hashsize=hashsize)
    assert again.changed == [] and len(again.unchanged) == 4  # the hash size is big enough


def test_a_refused_write_names_key_value_source_and_errno(proc_sys: Path) -> None:
    (proc_sys / TCP_ESTABLISHED).unlink()
    (proc_sys / TCP_ESTABLISHED).mkdir()  # EISDIR on write, like a key the kernel refuses
    settings = [
        SysctlSetting(TCP_ESTABLISHED, 7200, "conntrack.tcpEstablishedTimeout"),
        SysctlSetting(UDP_TIMEOUT, 10, "conntrack.udpTimeout"),  # no such key: ENOENT
        SysctlSetting(TCP_CLOSE_WAIT, 30, "conntrack.tcpCloseWaitTimeout"),
    ]
    report = write_sysctls(settings, proc_sys=proc_sys, hashsize=None)
    assert report.changed == [("net.netfilter.nf_conntrack_tcp_timeout_close_wait", 60, 30)]
    assert [e.errno for e in report.errors] == [errno.EISDIR, errno.ENOENT]
    assert str(report.errors[1]) == (
        "cannot set net.netfilter.nf_conntrack_udp_timeout=10 (from conntrack.udpTimeout): "
        "No such file or directory (ENOENT, errno 2); "
        "no such key (is the nf_conntrack module loaded?)"
    )
    with pytest.raises(SysctlError, match="nf_conntrack_tcp_timeout_established=7200"):
        report.raise_for_errors()


def test_load_module_refuses_a_module_the_node_lacks_naming_it() -> None:
    lab_config = str(Path(__file__).resolve().parents[2] / "testing/lab/config.yaml")
    proc = cli_kit.kubeplex("sysctls", "--config", lab_config, "--load-module", "no_such_module_kp")
    assert proc.returncode == 4, proc.stderr
    assert "cannot load kernel module no_such_module_kp" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = cli_kit.kubeplex("sysctls", "--config", lab_config, "--load-module", "ip_vs;reboot")
    assert proc.returncode == 2 and "not a kernel module name" in proc.stderr
