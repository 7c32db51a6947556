"""conntrack.* sysctls written in a real network namespace, and the host left alone."""

from __future__ import annotations

import errno
import subprocess
from collections.abc import Iterator
from dataclasses import replace

import pytest

from kubeplex.core.config.kubeproxy import KubeProxyConntrackConfiguration
from kubeplex.core.daemon.sysctls import (
    NF_CONNTRACK_MAX,
    TCP_BE_LIBERAL,
    TCP_CLOSE_WAIT,
    TCP_ESTABLISHED,
    UDP_STREAM_TIMEOUT,
    UDP_TIMEOUT,
    apply_conntrack_sysctls,
)
from kubeplex.core.dataplane.netns import run_in_netns
from kubeplex.testing.netlab import unique_prefix

DEFAULTS = KubeProxyConntrackConfiguration()


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
