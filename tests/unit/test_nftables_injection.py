"""Nothing of a Service, an endpoint or the settings can write nftables commands of its own:
the fields are checked, and a Service that cannot be written keeps its old objects.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from kits.nftables_kit import NODE, Harness, node_obj
from kits.render_kit import V4, endpoint_slice, ep, port, service

from kubeplex.backends.nftables.render import FamilyRenderer
from kubeplex.backends.nftables.rules import (
    FamilySettings,
    check_comment,
    service_objects,
    setup_lines,
)
from kubeplex.core.config.localdetect import LocalDetector
from kubeplex.core.model.errors import BackendError
from kubeplex.core.model.graph import ChangeSet, ServiceGraph
from kubeplex.core.model.types import Endpoint, NodeInfo, ServicePort, ServicePortName


def _settings(**kw: Any) -> FamilySettings:
    return replace(FamilySettings(V4, local=LocalDetector("cidr", "10.0.0.0/8")), **kw)


def _graph(svc: ServicePort, eps: tuple[Endpoint, ...]) -> ServiceGraph:
    return ServiceGraph.build(V4, NodeInfo(NODE), {svc.name: svc}, {svc.name: eps})


SPN = ServicePortName("ns1", "svc1", "p80")


EVIL = " }\nflush ruleset\nadd rule ip kube-proxy services { "


@pytest.mark.parametrize(
    "svc",
    [
        ServicePort(SPN, V4, "172.30.0.41" + EVIL, 80),
        ServicePort(SPN, V4, "172.30.0.41", 80, external_ips=("192.168.99.1" + EVIL,)),
        ServicePort(SPN, V4, "172.30.0.41", 80, load_balancer_vips=("1.2.3.4" + EVIL,)),
        ServicePort(
            SPN,
            V4,
            "172.30.0.41",
            80,
            load_balancer_vips=("1.2.3.4",),
            load_balancer_source_ranges=("10.0.0.0/8" + EVIL,),
        ),
        ServicePort(ServicePortName("ns1", 'svc1" drop'), V4, "172.30.0.41", 80),
        ServicePort(ServicePortName("ns1\nflush ruleset", "svc1"), V4, "172.30.0.41", 80),
        ServicePort(ServicePortName("ns1", "svc1", "p80 }"), V4, "172.30.0.41", 80),
    ],
)
def test_service_fields_cannot_inject(svc: ServicePort) -> None:
    with pytest.raises(BackendError, match="refusing"):
        service_objects(
            svc, _graph(svc, (Endpoint("10.1.1.1", 80),)).categorized(svc.name), _settings()
        )


def test_endpoint_ip_cannot_inject() -> None:
    svc = ServicePort(SPN, V4, "172.30.0.41", 80)
    graph = _graph(svc, (Endpoint("10.1.1.1\nflush ruleset", 80),))
    with pytest.raises(BackendError, match="refusing"):
        service_objects(svc, graph.categorized(SPN), _settings())


@pytest.mark.parametrize(
    "settings",
    [
        _settings(local=LocalDetector("interface", 'cbr0" accept')),
        _settings(local=LocalDetector("interface", "veth\n+")),
        _settings(local=LocalDetector("cidr", "10.0.0.0/8 accept")),
    ],
)
def test_local_detector_cannot_inject(settings: FamilySettings) -> None:
    svc = ServicePort(SPN, V4, "172.30.0.41", 80)
    with pytest.raises(BackendError, match="refusing"):
        service_objects(svc, _graph(svc, (Endpoint("10.1.1.1", 80),)).categorized(SPN), settings)


@pytest.mark.parametrize(
    "settings",
    [
        _settings(node_port_ips=("192.168.0.2" + EVIL,)),
        _settings(service_cidrs=("172.30.0.0/16" + EVIL,)),
    ],
)
def test_family_settings_cannot_inject(settings: FamilySettings) -> None:
    with pytest.raises((BackendError, ValueError)):
        setup_lines(settings, recreate_base_chains=False)


@pytest.mark.parametrize("text", ['a" accept', "a\nflush ruleset", "a;b", "a\\", "a'", "a{"])
def test_comment_check(text: str) -> None:
    with pytest.raises(BackendError, match="unsafe"):
        check_comment(text)


def test_renderer_skips_a_service_it_cannot_write_and_keeps_its_old_objects() -> None:
    good = ServicePort(ServicePortName("ns1", "good"), V4, "172.30.0.41", 80)
    bad_name = ServicePortName("ns1", "bad")
    bad = ServicePort(bad_name, V4, "172.30.0.42", 80)
    eps = {good.name: (Endpoint("10.1.1.1", 80),), bad_name: (Endpoint("10.1.1.2", 80),)}
    r = FamilyRenderer(_settings())
    plan = r.render(
        ServiceGraph.build(V4, NodeInfo(NODE), {good.name: good, bad_name: bad}, eps),
        ChangeSet(full=True),
    )
    r.commit(plan)
    assert not plan.errors
    evil = replace(bad, cluster_ip="172.30.0.42" + EVIL)
    graph = ServiceGraph.build(V4, NodeInfo(NODE), {good.name: good, bad_name: evil}, eps)
    plan = r.render(graph, ChangeSet(services=frozenset({bad_name})))
    assert list(map(str, plan.errors)) == ["ns1/bad"] and plan.transaction() == ""
    plan = r.render(graph, ChangeSet(full=True))
    text = plan.transaction()
    assert "flush ruleset" not in text
    assert "172.30.0.42 . tcp . 80" in text  # the last good objects stay
    assert "172.30.0.41 . tcp . 80" in text


def test_cluster_state_rejects_what_could_inject() -> None:
    h = Harness(
        [
            node_obj(),
            service("ns1", "good", "172.30.0.41", [port()]),
            endpoint_slice("ns1", "good", [ep("10.180.0.1")]),
            service("ns1", "evil", "172.30.0.42 } ; flush ruleset", [port()]),
            endpoint_slice("ns2", "x", [ep("10.180.0.1\nflush ruleset")]),
        ]
    )
    assert len(h.cluster.invalid) == 2
    text = str(h.sync())
    assert "flush ruleset" not in text and "172.30.0.41 . tcp . 80" in text
