"""The iptables backend's hooks against the kernel (in a scratch namespace): cleanup says what
it removed, leftovers what is there, inspect reads a Service back, and the printed render is
exactly what iptables-restore received."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Mapping
from typing import Any

import pytest
from kits.cli_kit import in_netns

from kubeplex.backends.iptables import ROUTE_LOCALNET, IptablesBackend, names
from kubeplex.backends.netfilter.iptables import Iptables
from kubeplex.core.dataplane.backend import BackendContext
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.types import IPFamily, Protocol, ServicePortName
from kubeplex.testing.dataplane import endpoint, endpoint_slice, lab_config, service

NODE = "node-a"
FAMILIES = (IPFamily.IPv4, IPFamily.IPv6)
WEB = ServicePortName("default", "web", "", Protocol.TCP)


class Recording(Iptables):
    """The real iptables, keeping every restore input it was given."""

    def __init__(self, netns: str) -> None:
        super().__init__(netns)
        self.received: list[str] = []

    def restore(self, family: IPFamily, text: str) -> None:
        self.received.append(text)
        super().restore(family, text)


def setup(
    netns: str, objects: Iterable[Mapping[str, Any]], families: tuple[IPFamily, ...] = FAMILIES
) -> tuple[IptablesBackend, ClusterState, Recording]:
    kernel = Recording(netns)
    be = IptablesBackend(BackendContext(lab_config("iptables"), NODE, families, kernel=kernel))
    be.prepare()
    cluster = ClusterState(NODE, families)
    feed(cluster, objects)
    return be, cluster, kernel


def feed(cluster: ClusterState, objects: Iterable[Mapping[str, Any]]) -> None:
    for obj in objects:
        if obj["kind"] == "Service":
            cluster.set_service(dict(obj))
        else:
            cluster.set_endpoint_slice(dict(obj))


def web(endpoints: int = 3, **spec: Any) -> list[dict[str, Any]]:
    eps = [endpoint(f"10.244.0.{i + 1}", NODE) for i in range(endpoints)]
    return [
        service("web", "10.96.0.10", 80, secondary_cluster_ip="fd00:96::10", **spec),
        endpoint_slice("web", eps),
        endpoint_slice("web", [endpoint("fd00:244::1", NODE)], name="web-v6", address_type="IPv6"),
        service("np", "10.96.0.20", 80, type="NodePort", node_port=30080),
        endpoint_slice("np", [endpoint("10.244.0.9", NODE)]),
    ]


def body(printed: str) -> str:
    """The printed render without its comment lines (headers, sysctls)."""
    return "".join(ln + "\n" for ln in printed.splitlines() if not ln.startswith("#"))


@pytest.mark.kernel
def test_the_printed_render_is_what_restore_received(netns: str) -> None:
    be, cluster, kernel = setup(netns, web())
    state = cluster.checkout(full=True)
    full = be.render(state, be.observe(state))
    printed = str(full)
    be.apply(full)
    assert f"# sysctl {ROUTE_LOCALNET}=1\n" in printed
    assert in_netns(netns, "sysctl", "-n", ROUTE_LOCALNET).strip() == "1"
    assert body(printed) == "".join(kernel.received)
    assert kernel.received == list(full.kernel_inputs())

    kernel.received.clear()
    feed(cluster, web(endpoints=2))
    state = cluster.checkout()
    partial = be.render(state, be.observe(state))
    assert not partial.full
    printed = str(partial)
    be.apply(partial)
    assert kernel.received and body(printed) == "".join(kernel.received)

    # A restart (a new backend) finds the chains of the old Service and deletes them.
    be, cluster, kernel = setup(netns, web()[3:])
    state = cluster.checkout(full=True)
    restart = be.render(state, be.observe(state))
    assert f"-X {names.service_chain(WEB)}" in str(restart)
    be.apply(restart)
    assert body(str(restart)) == "".join(kernel.received)
    assert names.service_chain(WEB) not in in_netns(netns, "iptables-save")


#: What kubelet writes on an IPv4 node: its hint and canary chains, and KUBE-FIREWALL.
KUBELET = (
    "*mangle\n:KUBE-IPTABLES-HINT - [0:0]\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n"
    "*filter\n:KUBE-FIREWALL - [0:0]\n:KUBE-KUBELET-CANARY - [0:0]\n-A INPUT -j KUBE-FIREWALL\n"
    "-A OUTPUT -j KUBE-FIREWALL\n"
    '-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections"'
    " -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP\n"
    "COMMIT\n"
)


def restore(netns: str, text: str) -> None:
    subprocess.run(
        ["ip", "netns", "exec", netns, "iptables-restore", "--noflush"],
        input=text, text=True, check=True, capture_output=True,
    )  # fmt: skip


@pytest.mark.kernel
def test_without_kubelet_cleanup_takes_kube_firewall_and_route_localnet(netns: str) -> None:
    be, cluster, _ = setup(netns, web())
    be.sync(cluster.checkout(full=True))
    found = be.leftovers()
    assert "iptables filter chain KUBE-FIREWALL" in found
    assert f"sysctl {ROUTE_LOCALNET}=1" in found
    assert sorted(be.cleanup().removed) == sorted(found)
    assert in_netns(netns, "sysctl", "-n", ROUTE_LOCALNET).strip() == "0"
    for tool in ("iptables-save", "ip6tables-save"):
        assert "KUBE-" not in in_netns(netns, tool)


@pytest.mark.kernel
def test_cleanup_reports_what_leftovers_listed(netns: str) -> None:
    restore(netns, KUBELET)
    be, cluster, _ = setup(netns, web())
    be.sync(cluster.checkout(full=True))
    found = be.leftovers()
    assert f"iptables nat chain {names.service_chain(WEB)}" in found
    assert f"ip6tables nat chain {names.service_chain(WEB)}" in found
    assert "iptables nat jump PREROUTING -> KUBE-SERVICES" in found
    assert "ip6tables filter chain KUBE-PROXY-CANARY" in found
    assert not [line for line in found if "KUBE-FIREWALL" in line]  # kubelet's

    report = IptablesBackend(
        BackendContext(lab_config("iptables"), NODE, FAMILIES, netns=netns)
    ).cleanup()
    assert sorted(report.removed) == sorted(found)
    assert be.leftovers() == []
    for tool in ("iptables-save", "ip6tables-save"):
        left = [ln for ln in in_netns(netns, tool).splitlines() if "KUBE-" in ln]
        assert all("KUBE-FIREWALL" in ln or "KUBE-KUBELET-CANARY" in ln or "HINT" in ln
                   for ln in left), left  # fmt: skip
    assert in_netns(netns, "sysctl", "-n", ROUTE_LOCALNET).strip() == "1"  # guarded still
    assert be.cleanup().removed == ()


@pytest.mark.kernel
def test_inspect_reads_a_service_back(netns: str) -> None:
    be, cluster, _ = setup(netns, web(session_affinity="ClientIP", affinity_timeout=600))
    be.sync(cluster.checkout(full=True))
    found = {p.family: p for p in be.inspect(WEB) or []}
    assert set(found) == set(FAMILIES)
    v4 = found[IPFamily.IPv4]
    assert [e.target for e in v4.endpoints] == [f"10.244.0.{i}:8080" for i in (1, 2, 3)]
    assert [e.share for e in v4.endpoints] == pytest.approx([1 / 3] * 3, abs=1e-6)
    assert all(e.packets == 0 and e.bytes == 0 for e in v4.endpoints)
    assert v4.masquerade and v4.affinity_seconds == 600 and v4.packets == 0
    assert v4.objects[0] == names.service_chain(WEB) and len(v4.objects) == 4
    assert any("10.96.0.10/32" in e and names.service_chain(WEB) in e for e in v4.entries)
    v6 = found[IPFamily.IPv6]
    assert [(e.target, e.share) for e in v6.endpoints] == [("[fd00:244::1]:8080", 1.0)]
    gone = ServicePortName("default", "gone", "", Protocol.TCP)
    assert be.inspect(gone) == []
