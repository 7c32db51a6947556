"""A restart (a new process: fresh backend, prepare, full sync) writes exactly what a fresh
start writes, nfacct matches included."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from kits.cli_kit import in_netns

from kubeplex.backends.iptables import NFACCT_COUNTERS, IptablesBackend
from kubeplex.backends.netfilter.iptables import Iptables
from kubeplex.core.dataplane.backend import BackendContext
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.types import IPFamily
from kubeplex.testing.dataplane import endpoint, endpoint_slice, lab_config, service

NODE = "node-a"
FAMILIES = (IPFamily.IPv4, IPFamily.IPv6)
#: Packet and byte counters, in chain declarations and in `-c` rules.
_COUNTERS = re.compile(r" \[\d+:\d+\]")


def cluster_objects(web_port: int = 80) -> list[dict[str, Any]]:
    """A dual-stack ClusterIP Service and a NodePort Service (localhost NodePorts, nfacct)."""
    return [
        service("web", "10.96.0.10", web_port, secondary_cluster_ip="fd00:96::10"),
        endpoint_slice("web", [endpoint("10.244.0.5", NODE), endpoint("10.244.1.5", "other")]),
        endpoint_slice(
            "web",
            [endpoint("fd00:244::5", NODE)],
            name="web-v6",
            address_type="IPv6",
        ),
        service("np", "10.96.0.20", 80, type="NodePort", node_port=30080),
        endpoint_slice("np", [endpoint("10.244.0.6", NODE)]),
    ]


def start(netns: str, objects: Sequence[Mapping[str, Any]]) -> None:
    """What `kubeplex run` does at start: a new backend, prepare(), one full sync."""
    cfg = lab_config("iptables")
    backend = IptablesBackend(BackendContext(cfg, NODE, families=FAMILIES, netns=netns))
    cluster = ClusterState(NODE, families=FAMILIES)
    for obj in objects:
        if obj["kind"] == "Service":
            cluster.set_service(dict(obj))
        else:
            cluster.set_endpoint_slice(dict(obj))
    backend.prepare()
    backend.sync(cluster.checkout(full=True))


def rules(netns: str) -> str:
    """iptables-save and ip6tables-save without comments and counters."""
    out = []
    for tool in ("iptables-save", "ip6tables-save"):
        text = in_netns(netns, tool)
        out += [_COUNTERS.sub("", ln) for ln in text.splitlines() if not ln.startswith("#")]
    return "\n".join(out) + "\n"


@pytest.mark.kernel
def test_a_restart_rewrites_byte_identical_rules(netns: str) -> None:
    start(netns, cluster_objects())
    fresh = rules(netns)
    assert "-m nfacct --nfacct-name  ct_state_invalid_dropped_pkts -j DROP" in fresh
    assert "--nfacct-name  localhost_nps_accepted_pkts" in fresh

    start(netns, cluster_objects())  # the restart: the counters and the rules exist
    assert rules(netns) == fresh


@pytest.mark.kernel
def test_a_restart_after_changes_equals_a_fresh_start(netns: str, netns2: str) -> None:
    start(netns, cluster_objects())
    start(netns, cluster_objects(web_port=8443)[:-2])  # restarted with one Service gone
    start(netns2, cluster_objects(web_port=8443)[:-2])  # a node that never ran kubeplex
    assert rules(netns) == rules(netns2)


@pytest.mark.kernel
def test_ensure_nfacct_finds_existing_counters(netns: str) -> None:
    kernel = Iptables(netns)
    assert kernel.ensure_nfacct(NFACCT_COUNTERS) == frozenset(NFACCT_COUNTERS)
    # The second time `nfacct add` answers EBUSY: the counters exist all the same.
    assert kernel.ensure_nfacct(NFACCT_COUNTERS) == frozenset(NFACCT_COUNTERS)
    assert "ct_state_invalid_dropped_pkts" in in_netns(netns, "nfacct", "list")
