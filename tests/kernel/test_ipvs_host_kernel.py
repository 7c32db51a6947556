"""The ipvs mode's kernel seam on this host's kernel: the ipset part (IPVS and dummy links need
the VM: tests/vm). Real ipsets in a network namespace of the test's own, over netlink; and,
on a kernel without IPVS, the start's message naming what is missing."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubeplex.backends.ipvs import IpvsBackend
from kubeplex.backends.ipvs.kernel import IpvsKernel
from kubeplex.backends.ipvs.plan import IpsetSpec, Op
from kubeplex.core.config.kubeproxy import with_overrides
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import BackendContext
from kubeplex.core.dataplane.requirements import module_unavailable
from kubeplex.core.model.errors import BackendError
from kubeplex.core.model.types import IPFamily
from kubeplex.testing.dataplane import lab_config

pytestmark = pytest.mark.kernel

V4, V6 = IPFamily.IPv4, IPFamily.IPv6
CLUSTER = IpsetSpec("KUBE-CLUSTER-IP", "hash:ip,port", V4, "Kubernetes service cluster ip + port")
LOOP = IpsetSpec("KUBE-LOOP-BACK", "hash:ip,port,ip", V4)
NODE_PORTS = IpsetSpec("KUBE-NODE-PORT-TCP", "bitmap:port", V4)
RANGES = IpsetSpec("KUBE-LOAD-BALANCER-SOURCE-CIDR", "hash:ip,port,net", V4)
IPS = IpsetSpec("KUBE-IPVS-IPS", "hash:ip", V4)
CLUSTER6 = IpsetSpec("KUBE-6-CLUSTER-IP", "hash:ip,port", V6)
ENTRIES = {
    CLUSTER.name: {"10.96.0.10,tcp:80", "10.96.0.10,udp:53"},
    LOOP.name: {"10.244.1.2,tcp:8080,10.244.1.2"},
    NODE_PORTS.name: {"30080"},
    RANGES.name: {"1.2.3.4,tcp:80,203.0.113.0/25"},
    IPS.name: {"10.96.0.10"},
}
ENTRIES6 = {CLUSTER6.name: {"fd00::10,tcp:80"}}


def _ip(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False)


@pytest.fixture
def netns() -> Iterator[str]:
    name = f"kpx-ipset-{uuid.uuid4().hex[:8]}"
    made = _ip("ip", "netns", "add", name)
    if made.returncode != 0:
        pytest.skip(f"cannot make a network namespace: {made.stderr.strip()}")
    try:
        yield name
    finally:
        _ip("ip", "netns", "del", name)


def _load(kernel: IpvsKernel) -> int:
    ops = [Op("create-set", V4, ipset=s) for s in (CLUSTER, LOOP, NODE_PORTS, RANGES, IPS)]
    by_name = {s.name: s for s in (CLUSTER, LOOP, NODE_PORTS, RANGES, IPS)}
    ops += [
        Op("add-entry", V4, ipset=by_name[n], entry=e)
        for n, es in ENTRIES.items()
        for e in sorted(es)
    ]
    return kernel.send(V4, ops)


def test_sets_and_entries_read_back_as_written(netns: str) -> None:
    kernel = IpvsKernel(netns)
    assert _load(kernel) == 11
    kernel.send(V6, [Op("create-set", V6, ipset=CLUSTER6)])
    kernel.send(V6, [Op("add-entry", V6, ipset=CLUSTER6, entry="fd00::10,tcp:80")])
    specs, entries = kernel.list_sets(V4)
    assert {n: (s.kind, s.family) for n, s in specs.items()} == {
        s.name: (s.kind, V4) for s in (CLUSTER, LOOP, NODE_PORTS, RANGES, IPS)
    }
    assert {n: set(e) for n, e in entries.items()} == ENTRIES
    specs6, entries6 = kernel.list_sets(V6)
    assert set(specs6) == {CLUSTER6.name}
    assert {n: set(e) for n, e in entries6.items()} == ENTRIES6
    # As ipset itself lists them.
    listed = _ip("ip", "netns", "exec", netns, "ipset", "save", CLUSTER.name).stdout
    assert "add KUBE-CLUSTER-IP 10.96.0.10,tcp:80" in listed


def test_removals_and_refusals(netns: str) -> None:
    kernel = IpvsKernel(netns)
    _load(kernel)
    kernel.send(V4, [Op("del-entry", V4, ipset=CLUSTER, entry="10.96.0.10,udp:53")])
    assert kernel.list_sets(V4)[1][CLUSTER.name] == {"10.96.0.10,tcp:80"}
    with pytest.raises(BackendError, match=r"ipset add KUBE-CLUSTER-IP 10.96.0.10,tcp:80"):
        kernel.send(V4, [Op("add-entry", V4, ipset=CLUSTER, entry="10.96.0.10,tcp:80")])
    with pytest.raises(BackendError, match="ipset create KUBE-LOOP-BACK"):
        kernel.send(V4, [Op("create-set", V4, ipset=LOOP)])
    # A set an iptables rule names cannot be destroyed.
    kernel.restore(V4, f"*filter\n-A INPUT -m set --match-set {IPS.name} dst -j ACCEPT\nCOMMIT\n")
    with pytest.raises(BackendError, match="ipset destroy KUBE-IPVS-IPS"):
        kernel.send(V4, [Op("destroy-set", V4, ipset=IPS)])
    kernel.send(V4, [Op("destroy-set", V4, ipset=LOOP)])
    assert LOOP.name not in kernel.list_sets(V4)[0]


def test_foreign_sets_are_not_listed_as_the_modes(netns: str) -> None:
    _ip("ip", "netns", "exec", netns, "ipset", "create", "KUBE-DST-ABC", "hash:ip")
    _ip("ip", "netns", "exec", netns, "ipset", "create", "mine", "hash:ip")
    kernel = IpvsKernel(netns)
    _load(kernel)
    assert "KUBE-DST-ABC" not in kernel.list_sets(V4)[0]
    assert "mine" not in kernel.list_sets(V4)[0]


def test_many_entries_go_in_few_round_trips(netns: str) -> None:
    kernel = IpvsKernel(netns)
    kernel.send(V4, [Op("create-set", V4, ipset=CLUSTER)])
    ops = [
        Op("add-entry", V4, ipset=CLUSTER, entry=f"10.96.{i // 250}.{i % 250 + 1},tcp:80")
        for i in range(3000)
    ]
    assert kernel.send(V4, ops) == 3000
    assert len(kernel.list_sets(V4)[1][CLUSTER.name]) == 3000


def test_interface_addresses_over_netlink(netns: str) -> None:
    _ip("ip", "-n", netns, "link", "set", "lo", "up")
    kernel = IpvsKernel(netns)
    assert "127.0.0.1" in kernel.interface_addresses()
    assert kernel.delete_link() is False  # no kube-ipvs0 here


def test_a_kernel_without_ipvs_stops_the_start_naming_what_is_missing(netns: str) -> None:
    why = module_unavailable("ip_vs")
    if Path("/proc/net/ip_vs").exists() or why is None:
        pytest.skip("this kernel has or can load IPVS: tests/vm/test_ipvs_module_loading.py")
    cfg = with_overrides(lab_config("ipvs"), mode="ipvs", known_modes=plugins.known_modes())
    backend = IpvsBackend(BackendContext(cfg, "kind-worker", (V4,), netns, IpvsKernel(netns)))
    with pytest.raises(BackendError) as caught:
        backend.prepare()
    message = str(caught.value)
    assert message.startswith(
        "ipvs mode cannot start: the probe virtual service with scheduler 'rr' was refused: "
        f"this kernel has no IPVS (no generic netlink family 'IPVS'): {why}"
    )
    # And the rest the mode lacks here, each once.
    for lack in IpvsKernel(netns).missing("rr"):
        assert message.count(lack) == 1, (lack, message)
    # Nothing was written before: the namespace still does not forward.
    forwarding = _ip("ip", "netns", "exec", netns, "sysctl", "-n", "net.ipv4.ip_forward")
    assert forwarding.stdout.strip() == "0"
