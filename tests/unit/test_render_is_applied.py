"""What a backend renders is what its apply sends, and nothing else (no root).

Each netfilter mode is built with an in-memory kernel (kubeplex.testing.fakes) through the
plugin loader, and synced as the daemon does (observe, render, apply): the fake must receive
exactly ``rendered.kernel_inputs()``, which ``str(rendered)`` prints (between its comment
lines). On a first full sync, a partial one (one endpoint changed), a periodic full one, and
a full one after a restart that finds the first process's rules, some of them leftovers.
"""

from __future__ import annotations

from typing import Any

import pytest
from kits.render_kit import V4, V6, config, endpoint_slice, ep, node_obj, port, service

from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import Backend, BackendContext, Rendered
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.types import Protocol, ServicePortName
from kubeplex.testing import fakes

NODE = "node-a"
FAMILIES = (V4, V6)
MODES = ("iptables", "nftables")


def objects() -> list[dict[str, Any]]:
    return [
        node_obj(("192.168.0.2", "fd00::2"), name=NODE),
        service("ns1", "web", "172.30.0.41", [port(80)]),
        endpoint_slice("ns1", "web", [ep("10.180.0.1", NODE), ep("10.180.0.2")]),
        service(
            "ns2",
            "lb",
            "172.30.0.42",
            [port(80, node_port=30080)],
            type="LoadBalancer",
            externalTrafficPolicy="Local",
            healthCheckNodePort=30000,
            sessionAffinity="ClientIP",
            ingress=["1.2.3.4"],
        ),
        endpoint_slice("ns2", "lb", [ep("10.180.1.1", NODE)]),
        service("ns3", "gone", "172.30.0.43", [port(80)]),
        endpoint_slice("ns3", "gone", [ep("10.180.2.1")]),
        service("ns4", "v6", "fd00:30::10", [port(80)], ipFamilies=["IPv6"]),
        endpoint_slice("ns4", "v6", [ep("fd00:180::1")], family="IPv6"),
    ]


def cluster_of(objs: list[dict[str, Any]]) -> ClusterState:
    cluster = ClusterState(NODE, FAMILIES)
    feed(cluster, objs)
    return cluster


def feed(cluster: ClusterState, objs: list[dict[str, Any]]) -> None:
    for obj in objs:
        {
            "Node": cluster.set_node,
            "Service": cluster.set_service,
            "EndpointSlice": cluster.set_endpoint_slice,
        }[obj["kind"]](obj)


def backend(mode: str, kernel: Any) -> Backend:
    ctx = BackendContext(config({"mode": mode}), NODE, FAMILIES, kernel=kernel)
    be = plugins.load_backend(mode, ctx)
    assert be.kernel is kernel
    be.prepare()
    return be


def sync(be: Backend, cluster: ClusterState, full: bool) -> Rendered:
    """One sync as the daemon runs it; asserts the kernel got what was rendered."""
    kernel = be.kernel
    before = len(kernel.inputs())
    state = cluster.checkout(full=full)
    rendered = be.render(state, be.observe(state))
    be.apply(rendered)
    sent = list(rendered.kernel_inputs())
    assert kernel.inputs()[before:] == sent
    assert not any(refused for *_, refused in kernel.log[before:])
    printed = "".join(
        line for line in str(rendered).splitlines(keepends=True) if not line.startswith("# ")
    )
    assert printed == "".join(sent)
    return rendered


def sent_text(rendered: Rendered) -> str:
    return "".join(rendered.kernel_inputs())


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_first_partial_and_periodic_syncs_send_what_was_rendered(mode: str) -> None:
    kernel = fakes.for_mode(mode)
    be = backend(mode, kernel)
    cluster = cluster_of(objects())
    first = sync(be, cluster, full=True)
    assert first.full and "10.180.0.1" in sent_text(first)
    assert "fd00:180::1" in sent_text(first)

    feed(cluster, [endpoint_slice("ns1", "web", [ep("10.180.0.1", NODE), ep("10.180.0.9")])])
    partial = sync(be, cluster, full=False)
    assert not partial.full
    text = sent_text(partial)
    assert "10.180.0.9" in text and "10.180.1.1" not in text

    periodic = sync(be, cluster, full=True)
    assert periodic.full
    web = ServicePortName("ns1", "web", "p80", Protocol.TCP)
    (programmed,) = be.inspect(web) or []
    assert {e.target for e in programmed.endpoints} == {"10.180.0.1:80", "10.180.0.9:80"}


def test_a_restart_finds_the_rules_and_removes_leftovers_in_what_it_renders(mode: str) -> None:
    kernel = fakes.for_mode(mode)
    cluster = cluster_of(objects())
    sync(backend(mode, kernel), cluster, full=True)
    gone = ServicePortName("ns3", "gone", "p80", Protocol.TCP)
    first = backend(mode, kernel)
    (before,) = first.inspect(gone) or []
    assert before.objects

    # The new process never saw ns3/gone: its chains are leftovers of the one before.
    restarted = cluster_of([o for o in objects() if o["metadata"].get("namespace") != "ns3"])
    again = backend(mode, kernel)
    rendered = sync(again, restarted, full=True)
    text = sent_text(rendered)
    assert all(name in text for name in before.objects), "leftover deletions not in the plan"
    assert again.inspect(gone) == []
    assert not any(name in line for line in again.leftovers() for name in before.objects)

    feed(restarted, [endpoint_slice("ns1", "web", [ep("10.180.0.7")])])
    partial = sync(again, restarted, full=False)
    assert not partial.full and "10.180.0.7" in sent_text(partial)
