"""conntrack.* sysctls: upstream's values and skips, clear refusals, and a real namespace."""

from __future__ import annotations

import errno
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

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
    run_in_netns,
    write_sysctls,
)
from kubeplex.testing.netlab import unique_prefix

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


# --------------------------------------------------------------------------------- the kernel


def sysctl_in(ns: str | None, key: str) -> int:
    argv = ["sysctl", "-n", key.replace("/", ".")]
    out = subprocess.run(
        ["ip", "netns", "exec", ns, *argv] if ns else argv,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return int(out)


@pytest.fixture
def netns() -> Iterator[str]:
    name = f"{unique_prefix()}-sysctl"  # reap_stale() finds it if this process dies
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        # Load conntrack in the namespace, so its net.netfilter keys exist for sure.
        subprocess.run(
            ["ip", "netns", "exec", name, "iptables", "-t", "raw", "-A", "OUTPUT",
             "-m", "conntrack", "--ctstate", "NEW", "-j", "ACCEPT"],
            check=True, capture_output=True,
        )  # fmt: skip
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


@pytest.mark.kernel
def test_settings_land_in_the_namespace_and_max_is_refused_clearly(netns: str) -> None:
    keys = (UDP_TIMEOUT, UDP_STREAM_TIMEOUT, TCP_ESTABLISHED, TCP_CLOSE_WAIT, TCP_BE_LIBERAL)
    host_before = {k: sysctl_in(None, k) for k in (*keys, NF_CONNTRACK_MAX)}
    ns_max = sysctl_in(netns, NF_CONNTRACK_MAX)
    ct = replace(
        DEFAULTS,
        max_per_core=1,
        min=ns_max + 1,  # differs from the current value, so a write is attempted
        tcp_established_timeout=7201.0,
        tcp_close_wait_timeout=61.0,
        tcp_be_liberal=True,
        udp_timeout=33.0,
        udp_stream_timeout=125.0,
    )
    report = apply_conntrack_sysctls(ct, netns=netns)
    assert {k: sysctl_in(netns, k) for k in keys} == {
        UDP_TIMEOUT: 33,
        UDP_STREAM_TIMEOUT: 125,
        TCP_ESTABLISHED: 7201,
        TCP_CLOSE_WAIT: 61,
        TCP_BE_LIBERAL: 1,
    }
    assert [e.name for e in report.errors] == ["net.netfilter.nf_conntrack_max"]
    err = report.errors[0]
    assert err.errno == errno.EACCES and err.netns == netns
    assert f"cannot set net.netfilter.nf_conntrack_max={ns_max + 1} in network namespace" in str(
        err
    )
    assert "set only in the initial namespace" in str(err)
    assert report.skipped == []  # the max was refused: the hash size is not even looked at
    # The host saw none of it.
    assert {k: sysctl_in(None, k) for k in (*keys, NF_CONNTRACK_MAX)} == host_before

    again = apply_conntrack_sysctls(replace(ct, max_per_core=0), netns=netns)
    assert again.changed == [] and again.errors == [] and len(again.unchanged) == 5


@pytest.mark.kernel
def test_a_missing_namespace_writes_nothing() -> None:
    with pytest.raises(FileNotFoundError):
        run_in_netns("kpx-no-such-ns", lambda: pytest.fail("ran outside the namespace"))
