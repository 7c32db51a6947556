"""The nfacct counters over netlink, against the kernel and the ``nfacct`` tool: what one
creates the other sees, an existing counter keeps its counts, and packets counted by a rule
are read back."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator

import pytest
from kits.cli_kit import in_netns

from kubeplex.backends.netfilter.nfacct import Nfacct, NfacctError

pytestmark = pytest.mark.kernel

NAME = "localhost_nps_accepted_pkts"


@pytest.fixture
def counters(netns: str) -> Iterator[Nfacct]:
    nfacct = Nfacct(netns)
    try:
        nfacct.packets(NAME)
    except NfacctError as err:
        pytest.skip(f"no nfacct in this kernel: {err}")
    yield nfacct
    nfacct.close()


def count_through(netns: str, name: str, packets: int) -> None:
    in_netns(netns, "ip", "link", "set", "lo", "up")
    in_netns(
        netns, "iptables", "-A", "OUTPUT", "-o", "lo", "-p", "udp", "--dport", "9",
        "-m", "nfacct", "--nfacct-name", name,
    )  # fmt: skip
    script = (
        "import socket\n"
        f"for _ in range({packets}): socket.socket(2, 2).sendto(b'x', ('127.0.0.1', 9))"
    )
    in_netns(netns, sys.executable, "-c", script)


def test_a_counter_is_made_once_and_keeps_its_counts(netns: str, counters: Nfacct) -> None:
    assert counters.packets(NAME) is None
    counters.ensure(NAME)
    assert counters.packets(NAME) == 0
    count_through(netns, NAME, 3)
    assert counters.packets(NAME) == 3
    counters.ensure(NAME)  # exists: EBUSY, no error, nothing reset
    assert counters.packets(NAME) == 3
    if shutil.which("nfacct"):
        assert f"pkts = {3:020d}" in in_netns(netns, "nfacct", "get", NAME)


def test_a_counter_the_tool_made_is_found(netns: str, counters: Nfacct) -> None:
    if not shutil.which("nfacct"):
        pytest.skip("no nfacct tool to make one with")
    in_netns(netns, "nfacct", "add", "made_by_the_tool")
    assert counters.packets("made_by_the_tool") == 0
    counters.ensure("made_by_the_tool")
    assert counters.packets("made_by_the_tool") == 0


def test_each_namespace_has_its_own(netns: str, netns2: str, counters: Nfacct) -> None:
    counters.ensure(NAME)
    other = Nfacct(netns2)
    try:
        assert other.packets(NAME) is None
        other.ensure(NAME)
        count_through(netns2, NAME, 2)
        assert (other.packets(NAME), counters.packets(NAME)) == (2, 0)
    finally:
        other.close()


def test_a_name_the_kernel_cannot_hold_is_refused_before_asking(counters: Nfacct) -> None:
    for bad in ("", "x" * 32, "a\0b"):
        with pytest.raises(ValueError, match="nfacct counter name"):
            counters.ensure(bad)
    assert counters.packets("x" * 31) is None  # the longest name fits
