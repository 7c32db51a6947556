"""The namespace lab's own facts for its tests: a small spec of one node, pod and host, and the
dual-stack lab's client and external IPv6 addresses (tests/unit/test_netlab_spec.py checks the
specs without root, tests/kernel/test_netlab.py brings labs up)."""

from __future__ import annotations

from kubeplex.testing.netlab import HostSpec, LabSpec, NodeSpec, PodSpec

CLIENT_IP6 = "fd00:10:244:1::3"
EXTERNAL_IP6 = "fd00:18::10"


def small_spec() -> LabSpec:
    return LabSpec(
        nodes=(NodeSpec("n1", "172.18.0.5", "10.244.1.0/24"),),
        pods=(PodSpec("p1", "n1", "10.244.1.2", udp_ports=(9000,)),),
        hosts=(HostSpec("h1", "172.18.0.10"),),
    )
