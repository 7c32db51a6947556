"""Proxy health (/healthz, /livez) and Service health-check NodePorts, over real HTTP on loopback.

Clocks are fake, so "stale for longer than 2 x syncPeriod" is tested without waiting.
"""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

import pytest
from kits.cli_kit import free_port
from kits.fake_backend_kit import FakeBackend
from kits.http_kit import serving_loop

from kubeplex.core.config.kubeproxy import default_config
from kubeplex.core.daemon.httpserving import HTTPServing, ListenError
from kubeplex.core.daemon.operations import Operations, parse_bind_address, start_operations
from kubeplex.core.daemon.proxier import Proxier
from kubeplex.core.daemon.proxy_health import ProxyHealth, ProxyHealthServer, go_time
from kubeplex.core.daemon.service_health import (
    ServiceHealthServer,
    local_ready_endpoints,
    service_health_body,
)
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.errors import KubeplexError
from kubeplex.core.model.graph import ProxyState
from kubeplex.core.model.types import IPFamily
from kubeplex.testing.dataplane import endpoint, endpoint_slice, service

NODE = "node-a"
T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def get(address: tuple[str, int], path: str) -> tuple[int, Mapping[str, str], str]:
    conn = http.client.HTTPConnection(*address, timeout=5)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read().decode()
    finally:
        conn.close()


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


@pytest.fixture
def serving() -> Iterator[HTTPServing]:
    yield from serving_loop()


# ------------------------------------------------------------------------------ proxy health


def test_go_time_matches_gos_json_encoding() -> None:
    assert go_time(None) == "0001-01-01T00:00:00Z"
    assert go_time(T0) == "2023-11-14T22:13:20Z"
    assert go_time(T0 + 0.25) == "2023-11-14T22:13:20.25Z"


def test_health_goes_stale_only_when_a_queued_change_waits_too_long() -> None:
    clock = Clock()
    h = ProxyHealth(60.0, clock=clock)
    assert h.health().healthy  # starting up: nothing synced, nothing judged
    h.updated([IPFamily.IPv4])
    clock.now += 3600
    assert h.health().healthy, "old rules with nothing queued are not stale"
    h.queued_update([IPFamily.IPv4])
    clock.now += 30
    h.queued_update([IPFamily.IPv4])  # the oldest queued change counts
    clock.now += 29.9
    assert h.health().healthy
    clock.now += 0.1
    report = h.health()
    assert not report.healthy
    assert report.status["IPv4"].last_updated == T0
    h.updated([IPFamily.IPv4])
    assert h.health().healthy


def test_one_stale_family_makes_the_proxy_unhealthy() -> None:
    clock = Clock()
    h = ProxyHealth(10.0, clock=clock)
    h.updated([IPFamily.IPv4, IPFamily.IPv6])
    h.queued_update([IPFamily.IPv6])
    clock.now += 10
    report = h.health()
    assert not report.healthy
    assert {f: s.healthy for f, s in report.status.items()} == {"IPv4": True, "IPv6": False}


def test_healthz_and_livez_bodies_codes_and_probe_counts(serving: HTTPServing) -> None:
    clock = Clock()
    deleting = False
    probes: list[tuple[str, int]] = []
    h = ProxyHealth(60.0, node_eligible=lambda: not deleting, clock=clock)
    h.updated([IPFamily.IPv4])
    server = ProxyHealthServer(
        serving, h, "127.0.0.1", 0, on_probe=lambda p, c: probes.append((p, c))
    )
    clock.now += 5

    status, headers, body = get(server.address, "/healthz")
    assert status == 200
    assert headers["Content-Type"] == "application/json"
    assert headers["X-Content-Type-Options"] == "nosniff"
    # Healthy: lastUpdated is "now", as upstream keeps for compatibility.
    assert body == (
        '{"lastUpdated":"2023-11-14T22:13:25Z","currentTime":"2023-11-14T22:13:25Z",'
        '"nodeEligible":true,"healthy":true,'
        '"status":{"IPv4":{"lastUpdated":"2023-11-14T22:13:20Z","healthy":true}}}'
    )
    status, _, body = get(server.address, "/livez")
    assert status == 200
    assert "nodeEligible" not in json.loads(body)

    # The node is being deleted: out of load balancers (healthz), but alive (livez).
    deleting = True
    status, _, body = get(server.address, "/healthz")
    assert status == 503
    doc = json.loads(body)
    assert doc["nodeEligible"] is False and doc["healthy"] is True
    assert doc["lastUpdated"] == "2023-11-14T22:13:20Z"  # the real one when unhealthy
    assert get(server.address, "/livez")[0] == 200

    # Stale rules: both fail.
    deleting = False
    h.queued_update([IPFamily.IPv4])
    clock.now += 60
    assert get(server.address, "/healthz")[0] == 503
    status, _, body = get(server.address, "/livez")
    assert status == 503 and json.loads(body)["healthy"] is False

    assert get(server.address, "/nothing")[0] == 404
    assert probes == [
        ("healthz", 200),
        ("livez", 200),
        ("healthz", 503),
        ("livez", 200),
        ("healthz", 503),
        ("livez", 503),
    ]
    server.close()
    assert refused(server.address[1])


def test_a_taken_port_is_a_clear_error(serving: HTTPServing) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ListenError, match=f"127.0.0.1:{port}"):
            ProxyHealthServer(serving, ProxyHealth(1.0), "127.0.0.1", port)


def test_listening_in_a_missing_namespace_fails_without_creating_it(serving: HTTPServing) -> None:
    with pytest.raises(ListenError, match="no network namespace"):
        ProxyHealthServer(serving, ProxyHealth(1.0), "127.0.0.1", 0, netns="kpx-no-such-ns")


# ---------------------------------------------------------------------------- service health


def lb_service(name: str, hc_port: int, *, policy: str = "Local") -> dict[str, Any]:
    return service(
        name,
        "10.96.0.50" if name == "web" else "10.96.0.51",
        80,
        type="LoadBalancer",
        node_port=30080 if name == "web" else 30081,
        external_traffic_policy=policy,
        load_balancer_ips=["192.0.2.10"],
        health_check_node_port=hc_port if policy == "Local" else None,
    )


def state_of(cluster: ClusterState) -> ProxyState:
    return cluster.checkout(full=True)


def test_local_ready_endpoints_counts_distinct_ready_local_ips() -> None:
    cluster = ClusterState(NODE, (IPFamily.IPv4,))
    cluster.set_service(lb_service("web", 32000))
    eps = [
        endpoint("10.244.1.2", NODE),
        endpoint("10.244.1.3", NODE, ready=False, serving=True, terminating=True),
        endpoint("10.244.2.2", "node-b"),
    ]
    cluster.set_endpoint_slice(endpoint_slice("web", eps, port=8080))
    cluster.set_endpoint_slice(endpoint_slice("web", eps, port=8443, name="web-2", port_name="x"))
    assert local_ready_endpoints(state_of(cluster)) == {("default", "web"): 1}


def test_service_health_ports_follow_services_and_local_endpoints(serving: HTTPServing) -> None:
    port, other = free_port(), free_port()
    proxy_healthy = True
    hcs = ServiceHealthServer(
        serving, addresses=("127.0.0.1",), proxy_healthy=lambda: proxy_healthy, node_name=NODE
    )
    cluster = ClusterState(NODE, (IPFamily.IPv4,))
    cluster.set_service(lb_service("web", port))
    cluster.set_service(lb_service("api", 0, policy="Cluster"))  # no health check port
    local = endpoint_slice("web", [endpoint("10.244.1.2", NODE), endpoint("10.244.1.9", NODE)])
    cluster.set_endpoint_slice(local)
    assert hcs.sync_state(state_of(cluster)) == []
    assert hcs.ports() == {("default", "web"): port}

    status, headers, body = get(("127.0.0.1", port), "/")
    assert status == 200
    assert headers["Content-Type"] == "application/json"
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["X-Load-Balancing-Endpoint-Weight"] == "2"
    assert body == (
        '{\n\t"service": {\n\t\t"namespace": "default",\n\t\t"name": "web"\n\t},\n'
        '\t"localEndpoints": 2,\n\t"serviceProxyHealthy": true\n}'
    )
    assert body.encode() == service_health_body(("default", "web"), 2, True)

    # An unhealthy proxy fails every health check port.
    proxy_healthy = False
    status, _, body = get(("127.0.0.1", port), "/any/path")
    assert status == 503 and '"serviceProxyHealthy": false' in body
    proxy_healthy = True

    # Only remote endpoints left: 503, localEndpoints 0.
    cluster.set_endpoint_slice(endpoint_slice("web", [endpoint("10.244.2.2", "node-b")]))
    hcs.sync_state(state_of(cluster))
    status, headers, body = get(("127.0.0.1", port), "/")
    assert status == 503
    assert '"localEndpoints": 0' in body and headers["X-Load-Balancing-Endpoint-Weight"] == "0"

    # The port changes: the old one closes, the new one opens.
    cluster.set_service(lb_service("web", other))
    cluster.set_endpoint_slice(local)
    hcs.sync_state(state_of(cluster))
    assert refused(port)
    assert get(("127.0.0.1", other), "/")[0] == 200

    # The Service goes: its port closes.
    cluster.delete_service("default", "web")
    hcs.sync_state(state_of(cluster))
    assert hcs.ports() == {}
    assert refused(other)
    hcs.close()


def test_a_health_port_that_cannot_bind_is_reported_and_retried(serving: HTTPServing) -> None:
    hcs = ServiceHealthServer(serving, addresses=("127.0.0.1",), node_name=NODE)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        errors = hcs.sync_services({("default", "web"): port})
        assert len(errors) == 1
        assert f"node {NODE} failed to start health check default/web on port {port}" in errors[0]
        assert hcs.ports() == {}
    # The port is free now: the next sync opens it.
    assert hcs.sync_services({("default", "web"): port}) == []
    assert hcs.ports() == {("default", "web"): port}
    hcs.close()


# ------------------------------------------------------------------------------- operations


def make_ops(clock: Clock, node: dict[str, bool]) -> tuple[Operations, ClusterState, FakeBackend]:
    cluster = ClusterState(NODE, (IPFamily.IPv4,))
    backend = FakeBackend()
    proxier = Proxier(cluster, backend)
    ops = start_operations(
        default_config(),
        proxier,
        cluster,
        lambda: node["deleting"],
        sysctls=False,
        healthz_address="127.0.0.1:0",
        metrics_address="127.0.0.1:0",
        service_health_addresses=("127.0.0.1",),
        poll_interval=3600,  # the test calls poll_once itself
        clock=clock,
    )
    ops.conntrack.enabled = False  # no host conntrack table in a unit test
    return ops, cluster, backend


def test_operations_turn_unhealthy_when_syncs_fail_for_two_sync_periods() -> None:
    clock = Clock()
    node = {"deleting": False}
    ops, cluster, backend = make_ops(clock, node)
    try:
        assert ops.healthz_address is not None and ops.metrics_address is not None
        cluster.set_service(service("web", "10.96.0.50", 80))
        ops.poll_once()  # a change is waiting: stale from now on
        assert ops.sync(full=True)
        assert get(ops.healthz_address, "/healthz")[0] == 200

        backend.fail = True
        cluster.set_service(service("web", "10.96.0.50", 8080))
        ops.poll_once()
        assert not ops.sync()
        clock.now += 59  # syncPeriod 30s: healthTimeout 60s
        assert get(ops.healthz_address, "/healthz")[0] == 200
        clock.now += 1
        assert get(ops.healthz_address, "/healthz")[0] == 503
        assert get(ops.healthz_address, "/livez")[0] == 503

        backend.fail = False
        assert ops.sync()
        assert get(ops.healthz_address, "/livez")[0] == 200
        node["deleting"] = True
        assert get(ops.healthz_address, "/healthz")[0] == 503
        assert get(ops.healthz_address, "/livez")[0] == 200

        text = get(ops.metrics_address, "/metrics")[2]
        assert 'kubeproxy_proxy_healthz_total{code="503"} 2.0' in text
        assert 'kubeproxy_proxy_livez_total{code="200"} 2.0' in text
        assert (
            'kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family="IPv4"} 1.0'
            in text
        )
        partial = "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total"
        assert f'{partial}{{ip_family="IPv4"}} 1.0' in text
        assert get(ops.metrics_address, "/proxyMode")[2] == "iptables"
    finally:
        ops.stop()
    assert ops.listener not in ops.proxier.listeners


def test_operations_open_health_check_ports_after_a_sync() -> None:
    clock = Clock()
    ops, cluster, _ = make_ops(clock, {"deleting": False})
    port = free_port()
    try:
        cluster.set_service(lb_service("web", port))
        cluster.set_endpoint_slice(endpoint_slice("web", [endpoint("10.244.1.2", NODE)]))
        assert ops.sync(full=True)
        status, _, body = get(("127.0.0.1", port), "/")
        assert status == 200 and '"localEndpoints": 1' in body
    finally:
        ops.stop()
    assert refused(port)


def test_once_mode_serves_nothing_but_still_listens_to_syncs() -> None:
    cluster = ClusterState(NODE, (IPFamily.IPv4,))
    proxier = Proxier(cluster, FakeBackend())
    ops = start_operations(default_config(), proxier, cluster, serve=False, sysctls=False)
    try:
        assert ops.healthz_address is None and ops.serving is None
        cluster.set_service(service("web", "10.96.0.50", 80))
        assert ops.sync(full=True)
        assert (
            ops.metrics.value(
                "kubeproxy_sync_proxy_rules_duration_seconds_count", {"ip_family": "IPv4"}
            )
            == 1
        )
    finally:
        ops.stop()


def test_bind_address_hard_fail_stops_the_start() -> None:
    cfg = replace(default_config(), bind_address_hard_fail=True)
    cluster = ClusterState(NODE, (IPFamily.IPv4,))
    proxier = Proxier(cluster, FakeBackend())
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(KubeplexError, match=f"healthz on 127.0.0.1:{port}"):
            start_operations(
                cfg, proxier, cluster, sysctls=False,
                healthz_address=f"127.0.0.1:{port}", metrics_address="127.0.0.1:0",
            )  # fmt: skip
    assert proxier.listeners == []


def test_parse_bind_address_allows_port_zero_for_tests() -> None:
    assert parse_bind_address("0.0.0.0:10256") == ("0.0.0.0", 10256)
    assert parse_bind_address("[::1]:0") == ("::1", 0)
    with pytest.raises(ValueError):
        parse_bind_address("localhost:10256")
