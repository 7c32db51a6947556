"""The Kubernetes API source, driven through the REAL ``kubernetes`` client over real HTTP
against the fake API server, which only grants what kube-proxy's RBAC grants."""

from __future__ import annotations

import gc
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import kubernetes.client as k8s
import pytest
from apiserver import DEFAULT_RESOURCES, KUBE_PROXY_PERMISSIONS, FakeApiServer, RequestRecord
from apiserver import server as apiserver_module
from kits.kubeapi_kit import api_source, rbac_server, write_config

from kubeplex.core.cli import main as cli
from kubeplex.core.cli import run as run_command
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.graph import ProxyState
from kubeplex.core.model.types import IPFamily
from kubeplex.core.sources import list_decoder
from kubeplex.core.sources.event_recorder import REASON_FAILED_TO_PROGRAM
from kubeplex.core.sources.gated_cluster import GatedClusterState
from kubeplex.core.sources.kubeapi import (
    ENDPOINTSLICES,
    NODES,
    PROXY_LABEL_SELECTOR,
    SERVICECIDRS,
    SERVICES,
    KubeApiSource,
)
from kubeplex.core.sources.token_bucket import TokenBucket
from kubeplex.core.startup import collector

NODE = "kind-worker"
NS = "default"


# ------------------------------------------------------------------------------------ helpers


def svc(name: str, port: int = 80, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": NS, "labels": labels or {}},
        "spec": {"selector": {"app": name}, "ports": [{"name": "http", "port": port}]},
    }


def eps(name: str, service: str, ip: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {"kubernetes.io/service-name": service, **(labels or {})},
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip], "conditions": {"ready": True}, "nodeName": NODE}],
        "ports": [{"name": "http", "port": 8080}],
    }


def node(name: str = NODE, zone: str = "zone-a", finalizers: list[str] | None = None) -> Any:
    meta: dict[str, Any] = {"name": name, "labels": {"topology.kubernetes.io/zone": zone}}
    if finalizers:
        meta["finalizers"] = finalizers
    return {
        "metadata": meta,
        "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"]},
        "status": {"addresses": [{"type": "InternalIP", "address": "172.18.0.5"}]},
    }


def wait_until(cond: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"{what} not met in time"
        time.sleep(0.01)


def ports(state: ProxyState) -> dict[str, int]:
    return {sp.name.namespaced_name: sp.port for sp in state.graphs[IPFamily.IPv4]}


def programmed(cluster: ClusterState) -> set[str]:
    """The Services a sync would program now (checks out, as the proxier would)."""
    return set(ports(cluster.checkout()))


class SpyCluster(GatedClusterState):
    """Records what the source feeds, to prove no delete ever reaches a live object."""

    def __init__(self) -> None:
        super().__init__(NODE)
        self.calls: list[tuple[str, str]] = []

    def set_service(self, obj: Mapping[str, Any], origin: str = "") -> None:
        self.calls.append(("set_service", obj["metadata"]["name"]))
        super().set_service(obj, origin)

    def delete_service(self, namespace: str, name: str) -> None:
        self.calls.append(("delete_service", name))
        super().delete_service(namespace, name)

    def set_endpoint_slice(self, obj: Mapping[str, Any], origin: str = "") -> None:
        self.calls.append(("set_endpoint_slice", obj["metadata"]["name"]))
        super().set_endpoint_slice(obj, origin)

    def delete_endpoint_slice(self, namespace: str, name: str) -> None:
        self.calls.append(("delete_endpoint_slice", name))
        super().delete_endpoint_slice(namespace, name)

    def set_node(self, obj: Mapping[str, Any], origin: str = "") -> None:
        self.calls.append(("set_node", obj["metadata"]["name"]))
        super().set_node(obj, origin)

    def deleted(self) -> set[str]:
        return {name for call, name in self.calls if call.startswith("delete")}


@pytest.fixture
def srv(request: pytest.FixtureRequest) -> Iterator[FakeApiServer]:
    yield from rbac_server(request)


@pytest.fixture
def make_source(srv: FakeApiServer, tmp_path: Path) -> Iterator[Callable[..., KubeApiSource]]:
    made: list[KubeApiSource] = []

    def make(**kwargs: Any) -> KubeApiSource:
        source = api_source(srv, tmp_path, NODE, **kwargs)
        made.append(source)
        return source

    yield make
    for source in made:
        started = time.monotonic()
        source.stop()
        assert time.monotonic() - started < 1.5, "stop() did not return promptly"


def synced(make_source: Callable[..., KubeApiSource], **kwargs: Any) -> KubeApiSource:
    source = make_source(**kwargs).start()
    assert source.wait_for_initial_sync(5)
    return source


def populate(srv: FakeApiServer, n: int = 2) -> None:
    srv.create("Node", node())
    for i in range(n):
        srv.create("Service", svc(f"s{i}"))
        srv.create("EndpointSlice", eps(f"s{i}-abc", f"s{i}", f"10.244.1.{i + 10}"))


def watches(srv: FakeApiServer, resource: str) -> list[RequestRecord]:
    return srv.find_requests("watch", resource)


# ------------------------------------------------------------------------------------ tests


@pytest.mark.parametrize("srv", [{"stream_lists": True}, {"stream_lists": False}], indirect=True)
def test_lists_streamed_or_sent_whole_give_the_same_cluster(
    srv: FakeApiServer, make_source: Callable[..., KubeApiSource], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Small pieces on both sides: items cut across chunks, the decoded text let go often.
    monkeypatch.setattr(apiserver_module, "LIST_BUFFER", 300)
    monkeypatch.setattr(list_decoder, "_CHUNK", 500)
    populate(srv, 40)
    source = synced(make_source)
    assert programmed(source.cluster) == {f"default/s{i}" for i in range(40)}
    assert len(source.cluster.checkout().graphs[IPFamily.IPv4].endpoints) == 40
    # The watches that follow the lists work as before.
    srv.create("Service", svc("late"))
    wait_until(lambda: "default/late" in programmed(source.cluster), what="the watch")


# A server without a watch cache: a list at resourceVersion 0 comes in pages.
@pytest.mark.parametrize("srv", [{"watch_cache": False}], indirect=True)
def test_no_checkout_before_the_initial_lists_are_complete(
    srv: FakeApiServer, make_source: Callable[..., KubeApiSource]
) -> None:
    populate(srv, 5)
    cluster = SpyCluster()
    source = make_source(cluster=cluster, backoff_initial=0.4, backoff_max=0.5)
    srv.pause()
    source.start()
    srv.wait_for_request(lambda r: r.resource == "endpointslices" and r.status is None)
    assert not source.wait_for_initial_sync(0.2)
    assert set(source.pending) == {SERVICES, ENDPOINTSLICES, NODES}
    checked_out: list[ProxyState] = []
    sync = threading.Thread(target=lambda: checked_out.append(cluster.checkout(full=True)))
    sync.start()
    # The second page of the EndpointSlice list fails: the first page must not be applied.
    srv.fail_next(
        1, code=500, match=lambda r: r.resource == "endpointslices" and "continue" in r.query
    )
    srv.resume()
    srv.wait_for_request(lambda r: r.resource == "endpointslices" and r.status == 500)
    assert cluster.slice_keys() == set()
    wait_until(lambda: source.pending == (ENDPOINTSLICES,), what="only slices pending")
    time.sleep(0.1)
    assert checked_out == [] and sync.is_alive(), "a sync ran on a half-listed cluster"
    assert source.wait_for_initial_sync(5)
    sync.join(5)
    assert len(checked_out) == 1
    state = checked_out[0]
    assert set(ports(state)) == {f"default/s{i}" for i in range(5)}
    assert sum(len(v) for v in state.graphs[IPFamily.IPv4].endpoints.values()) == 5
    # paged lists, with upstream's label selector; the Node by field selector
    lists = srv.find_requests("list", "endpointslices")
    assert all(r.query["labelSelector"] == PROXY_LABEL_SELECTOR for r in lists)
    assert [r.query.get("limit") for r in lists[:2]] == ["2", "2"]
    assert srv.find_requests("list", "nodes")[0].query["fieldSelector"] == f"metadata.name={NODE}"
    # every slice applied exactly once: the failed partial list was thrown away
    assert sorted(n for c, n in cluster.calls if c == "set_endpoint_slice") == sorted(
        f"s{i}-abc" for i in range(5)
    )


def test_watch_add_update_delete_reach_the_cluster(
    srv: FakeApiServer, make_source: Callable[..., KubeApiSource]
) -> None:
    populate(srv, 2)
    srv.create(
        "Service", svc("other-proxy", labels={"service.kubernetes.io/service-proxy-name": "x"})
    )
    srv.create(
        "EndpointSlice", eps("hl-1", "hl", "10.244.1.99", {"service.kubernetes.io/headless": ""})
    )
    source = synced(make_source)
    cluster = source.cluster
    assert ports(cluster.checkout(full=True)) == {"default/s0": 80, "default/s1": 80}
    assert cluster.slice_keys() == {"default/s0-abc", "default/s1-abc"}
    srv.wait_for_watches(4)

    srv.create("Service", svc("s2", port=81))
    srv.create("EndpointSlice", eps("s2-abc", "s2", "10.244.1.20"))
    srv.patch(
        "Service", "s0", {"spec": {"ports": [{"name": "http", "port": 8443, "protocol": "TCP"}]}}
    )
    srv.delete("Service", "s1")
    srv.delete("EndpointSlice", "s1-abc")
    wait_until(lambda: cluster.slice_keys() == {"default/s0-abc", "default/s2-abc"}, what="slices")
    wait_until(lambda: programmed(cluster) == {"default/s0", "default/s2"}, what="services")
    wait_until(lambda: ports(cluster.checkout()) == {"default/s0": 8443, "default/s2": 81})
    # a Service that leaves the selector (now handled by another proxy) is removed
    srv.patch(
        "Service", "s2", {"metadata": {"labels": {"service.kubernetes.io/service-proxy-name": "x"}}}
    )
    wait_until(lambda: programmed(cluster) == {"default/s0"}, what="relabelled service gone")
    assert source.list_count(SERVICES) == 1  # all of it through the watch, no relist


@pytest.mark.parametrize("srv", [{"bookmark_interval": 60.0}], indirect=True)
def test_relist_after_410_keeps_every_rule(
    srv: FakeApiServer, make_source: Callable[..., KubeApiSource]
) -> None:
    populate(srv, 3)
    cluster = SpyCluster()
    source = synced(make_source, cluster=cluster)
    cluster.checkout(full=True)
    srv.wait_for_watches(4)
    old_rv = source.resource_versions[SERVICES]
    # Changes the source cannot see (filtered out), then compaction: resuming at old_rv is 410.
    srv.create("Service", svc("hidden", labels={"service.kubernetes.io/headless": ""}))
    srv.compact()
    # A watch that ends in its first second without an event is a "very short watch" that
    # client-go relists after, without resuming it: let the watches be older than that.
    time.sleep(1.1)
    srv.drop_watches("close")
    wait_until(lambda: source.list_count(SERVICES) == 2, what="relist after 410")
    wait_until(lambda: source.list_count(ENDPOINTSLICES) == 2, what="relist after 410")
    expired = [r for r in watches(srv, "services") if r.query.get("resourceVersion") == old_rv]
    assert len(expired) == 2  # the first watch, then the resumed one that got Expired
    # nothing was deleted, nothing even changed: the next sync has nothing to do
    assert cluster.deleted() == set()
    assert cluster.service_keys() == {"default/s0", "default/s1", "default/s2"}
    assert cluster.pending() == (0, 0)
    assert cluster.checkout().empty
    # and the watch resumes from the relist's resourceVersion
    srv.wait_for_request(
        lambda r: (
            r.verb == "watch"
            and r.resource == "services"
            and r.query.get("resourceVersion") == str(srv.resource_version)
        )
    )


def test_deletes_while_disconnected_disappear_after_relist(
    srv: FakeApiServer, make_source: Callable[..., KubeApiSource]
) -> None:
    populate(srv, 3)
    cluster = SpyCluster()
    source = synced(make_source, cluster=cluster)
    assert len(programmed(cluster)) == 3
    srv.wait_for_watches(4)
    srv.pause()
    srv.drop_watches("reset")
    srv.delete("Service", "s1")
    srv.delete("EndpointSlice", "s1-abc")
    srv.create("Service", svc("s9"))
    time.sleep(0.3)  # the source retries against a hanging server meanwhile
    assert cluster.deleted() == set()  # no flush while disconnected
    assert cluster.pending() == (0, 0)
    assert len(programmed(cluster)) == 3
    srv.resume()
    wait_until(lambda: programmed(cluster) == {"default/s0", "default/s2", "default/s9"})
    wait_until(lambda: cluster.slice_keys() == {"default/s0-abc", "default/s2-abc"})
    assert cluster.deleted() == {"s1", "s1-abc"}
    assert source.list_count(SERVICES) >= 2


def test_periodic_relist_changes_nothing_that_did_not_change(
    srv: FakeApiServer, make_source: Callable[..., KubeApiSource]
) -> None:
    populate(srv, 2)
    cluster = SpyCluster()
    source = synced(make_source, cluster=cluster, config_sync_period=0.3)
    assert len(programmed(cluster)) == 2
    wait_until(lambda: source.list_count(ENDPOINTSLICES) >= 2, what="periodic relist")
    assert cluster.pending() == (0, 0) and cluster.deleted() == set()
    assert [c for c in cluster.calls if c[0] == "set_service"] == [
        ("set_service", "s0"),
        ("set_service", "s1"),
    ]  # unchanged objects (same resourceVersion) are not fed again


# A server without a watch cache: a list at resourceVersion 0 comes in pages.
@pytest.mark.parametrize("srv", [{"watch_cache": False}], indirect=True)
def test_expired_continue_token_restarts_the_list_in_one_piece(
    srv: FakeApiServer, make_source: Callable[..., KubeApiSource]
) -> None:
    populate(srv, 3)
    srv.fail_next(1, code=410, match=lambda r: r.resource == "services" and "continue" in r.query)
    source = synced(make_source)
    assert programmed(source.cluster) == {"default/s0", "default/s1", "default/s2"}
    lists = srv.find_requests("list", "services")
    assert [(r.query.get("limit"), "continue" in r.query, r.status) for r in lists] == [
        ("2", False, 200),
        ("2", True, 410),
        (None, False, 200),
    ]


def test_bookmarks_advance_the_resource_version(
    srv: FakeApiServer, make_source: Callable[..., KubeApiSource]
) -> None:
    populate(srv, 1)
    source = synced(make_source, watch_timeout=1.0)
    first = srv.wait_for_request(lambda r: r.verb == "watch" and r.resource == "services")
    assert first.query["allowWatchBookmarks"] == "true"
    assert 1 <= int(first.query["timeoutSeconds"]) <= 2
    listed_rv = first.query["resourceVersion"]
    # A change the Services watch never sees; only bookmarks can tell it the new revision.
    srv.create("Node", node("elsewhere"))
    now = str(srv.resource_version)
    assert int(now) > int(listed_rv)
    wait_until(lambda: source.resource_versions[SERVICES] == now, what="bookmark rv")
    nxt = srv.wait_for_request(
        lambda r: r.verb == "watch" and r.resource == "services" and r.time > first.time,
        timeout=5,
    )
    assert nxt.query["resourceVersion"] == now
    assert source.list_count(SERVICES) == 1  # a watch timeout re-watches, it does not relist


def test_node_labels_reach_the_cluster_and_deletion_is_exposed(
    srv: FakeApiServer, make_source: Callable[..., KubeApiSource]
) -> None:
    srv.create("Node", node(finalizers=["example.com/keep"]))
    srv.create("Node", node("kind-worker2", zone="zone-b"))
    cluster = SpyCluster()
    source = synced(make_source, cluster=cluster)
    assert cluster.node.zone == "zone-a" and cluster.node.pod_cidrs == ("10.244.1.0/24",)
    assert not cluster.checkout(full=True).empty
    assert not source.node_deleting
    srv.wait_for_watches(4)
    srv.patch("Node", NODE, {"metadata": {"labels": {"topology.kubernetes.io/zone": "zone-c"}}})
    srv.patch("Node", "kind-worker2", {"metadata": {"labels": {"x": "y"}}})
    wait_until(lambda: cluster.node.zone == "zone-c", what="zone change")
    assert cluster.changed.is_set()
    assert cluster.checkout().is_full()  # a zone change resyncs every Service
    assert {n for c, n in cluster.calls if c == "set_node"} == {NODE}
    srv.delete("Node", NODE, respect_finalizers=True)
    wait_until(lambda: source.node_deleting, what="deletionTimestamp seen")
    srv.patch("Node", NODE, {"metadata": {"finalizers": None}})
    assert NODE not in {n["metadata"]["name"] for n in srv.list_objects("Node")}
    gone_rv = str(srv.resource_version)
    wait_until(lambda: source.resource_versions[NODES] == gone_rv, what="node deletion seen")
    assert source.node_deleting
    assert cluster.node.zone == "zone-c"  # the last state stays in effect


def test_invalid_service_becomes_an_event(
    srv: FakeApiServer, make_source: Callable[..., KubeApiSource]
) -> None:
    populate(srv, 1)
    srv.create("Service", svc("bad", port=99999))
    source = synced(make_source)
    assert programmed(source.cluster) == {"default/s0"}  # the rest is programmed

    def events() -> list[dict[str, Any]]:
        return srv.list_objects("Event")

    wait_until(lambda: len(events()) == 1, what="event created")
    ev = events()[0]
    assert ev["reason"] == REASON_FAILED_TO_PROGRAM and ev["type"] == "Warning"
    assert ev["involvedObject"]["kind"] == "Service"
    assert ev["involvedObject"]["name"] == "bad"
    assert ev["involvedObject"]["uid"] == srv.get("Service", "bad")["metadata"]["uid"]
    assert "spec.ports[0].port: must be between 1 and 65535" in ev["message"]
    assert ev["source"] == {"component": "kube-proxy", "host": NODE}
    assert ev["metadata"]["namespace"] == NS and ev["count"] == 1

    # fixed, then broken the same way again: the same Event, its count patched
    srv.wait_for_watches(4)
    srv.patch(
        "Service", "bad", {"spec": {"ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}}
    )
    wait_until(lambda: "default/bad" in programmed(source.cluster), what="fixed")
    srv.patch(
        "Service", "bad", {"spec": {"ports": [{"name": "http", "port": 99999, "protocol": "TCP"}]}}
    )
    wait_until(lambda: events()[0]["count"] == 2, what="event count patched")
    assert len(events()) == 1
    assert srv.find_requests("patch", "events")
    assert "default/bad" in programmed(source.cluster)  # the last valid version stays


def test_unreachable_api_keeps_retrying_then_syncs(
    srv: FakeApiServer, make_source: Callable[..., KubeApiSource]
) -> None:
    populate(srv, 1)
    srv.stop()
    source = make_source().start()
    assert not source.wait_for_initial_sync(0.5)
    assert "services" in source.last_error
    srv.start()  # same port
    assert source.wait_for_initial_sync(5)
    assert programmed(source.cluster) == {"default/s0"}
    # ServiceCIDRs do not gate the sync: their list may recover a moment later.
    wait_until(lambda: source.last_error == "", what="every list recovered")


def test_token_bucket_limits_requests() -> None:
    now = [0.0]
    bucket = TokenBucket(qps=2.0, burst=3, clock=lambda: now[0])
    assert [bucket.reserve() for _ in range(3)] == [0.0, 0.0, 0.0]  # the burst
    assert bucket.reserve() == pytest.approx(0.5)
    assert bucket.reserve() == pytest.approx(1.0)  # waiters queue up
    now[0] = 10.0
    assert bucket.try_acquire() and bucket.try_acquire() and bucket.try_acquire()
    assert not bucket.try_acquire()
    assert TokenBucket(qps=0, burst=0).reserve() == 0.0  # qps <= 0: unlimited
    stop = threading.Event()
    stop.set()
    slow = TokenBucket(qps=0.001, burst=1)
    assert slow.acquire(stop) is False  # a stopped source does not wait for a token


def test_kubeconfig_loads_into_a_dedicated_configuration(
    srv: FakeApiServer, make_source: Callable[..., KubeApiSource]
) -> None:
    before = k8s.Configuration.get_default_copy().host
    source = make_source()
    assert source.host == srv.url
    assert k8s.Configuration.get_default_copy().host == before


# ------------------------------------------------------------------------------------ ServiceCIDRs

#: A server from before Kubernetes 1.33: no networking.k8s.io/v1 servicecidrs (404).
WITHOUT_SERVICECIDRS = tuple(rt for rt in DEFAULT_RESOURCES if rt.plural != "servicecidrs")
KUBEAPI_LOGGER = "kubeplex.core.sources.kubeapi"


def service_cidr(name: str, *cidrs: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"cidrs": list(cidrs)}}


def test_service_cidrs_are_listed_and_watched(
    srv: FakeApiServer, make_source: Callable[..., KubeApiSource]
) -> None:
    populate(srv, 1)
    srv.create("ServiceCIDR", service_cidr("kubernetes", "10.96.0.0/16", "fd00:10:96::/112"))
    source = synced(make_source)
    cluster = source.cluster
    wait_until(lambda: source.list_count(SERVICECIDRS) == 1, what="servicecidrs listed")
    state = cluster.checkout(full=True)
    assert state.service_cidrs == ("10.96.0.0/16", "fd00:10:96::/112")
    srv.wait_for_watches(1, "servicecidrs")
    listed = srv.find_requests("list", "servicecidrs")[0]
    assert listed.path == "/apis/networking.k8s.io/v1/servicecidrs"
    assert "labelSelector" not in listed.query and "fieldSelector" not in listed.query

    srv.create("ServiceCIDR", service_cidr("extra", "10.100.0.0/24"))
    wait_until(lambda: cluster.changed.is_set(), what="a new ServiceCIDR")
    state = cluster.checkout()
    assert state.is_full()  # every family's base rules depend on the CIDRs
    assert state.service_cidrs == ("10.96.0.0/16", "10.100.0.0/24", "fd00:10:96::/112")
    srv.delete("ServiceCIDR", "kubernetes")
    wait_until(lambda: cluster.service_cidrs == ("10.100.0.0/24",), what="deleted ServiceCIDR")
    assert cluster.checkout().is_full()
    assert source.list_count(SERVICECIDRS) == 1  # all through the watch


def test_failing_service_cidr_lists_do_not_hold_up_the_initial_sync(
    srv: FakeApiServer, make_source: Callable[..., KubeApiSource]
) -> None:
    populate(srv, 2)
    srv.create("ServiceCIDR", service_cidr("kubernetes", "10.96.0.0/16"))
    srv.fail_next(3, code=500, match=lambda r: r.resource == "servicecidrs")
    source = synced(make_source)
    assert source.pending == ()
    assert programmed(source.cluster) == {"default/s0", "default/s1"}
    # the ServiceCIDR list is retried with the usual backoff and arrives later
    wait_until(lambda: source.cluster.service_cidrs == ("10.96.0.0/16",), what="late CIDRs")
    assert source.cluster.checkout().is_full()
    assert len(srv.find_requests("list", "servicecidrs")) == 4


@pytest.mark.parametrize("srv", [{"resources": WITHOUT_SERVICECIDRS}], indirect=True)
def test_server_without_servicecidrs_still_syncs(
    srv: FakeApiServer,
    make_source: Callable[..., KubeApiSource],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=KUBEAPI_LOGGER)
    populate(srv, 2)
    source = synced(make_source, missing_retry=0.05)
    assert source.pending == ()
    state = source.cluster.checkout(full=True)
    assert set(ports(state)) == {"default/s0", "default/s1"}
    assert state.service_cidrs == ()
    # asked again now and then (a server upgrade is noticed), said once, never an error
    wait_until(lambda: len(srv.find_requests("list", "servicecidrs")) >= 3, what="retries")
    assert {r.status for r in srv.find_requests("list", "servicecidrs")} == {404}
    assert srv.find_requests("watch", "servicecidrs") == []
    said = [r for r in caplog.records if r.getMessage().startswith("servicecidrs:")]
    assert len(said) == 1 and said[0].levelno == logging.INFO
    assert "not served by this API server" in said[0].getMessage()
    assert "no drop rule for unallocated ClusterIPs" in said[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert source.last_error == ""


def test_a_role_without_servicecidrs_still_syncs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=KUBEAPI_LOGGER)
    older_role = {p for p in KUBE_PROXY_PERMISSIONS if p[1] != "servicecidrs"}
    server = FakeApiServer(authorizer=older_role, bookmark_interval=0.2).start()
    try:
        populate(server, 1)
        server.create("ServiceCIDR", service_cidr("kubernetes", "10.96.0.0/16"))
        api = server.api_client()
        source = KubeApiSource(api, NODE, backoff_initial=0.05, missing_retry=0.05).start()
        try:
            assert source.wait_for_initial_sync(5)
            assert programmed(source.cluster) == {"default/s0"}
            wait_until(lambda: len(server.find_requests("list", "servicecidrs")) >= 3)
        finally:
            source.stop()
            api.close()
        assert {r.status for r in server.find_requests("list", "servicecidrs")} == {403}
        assert source.cluster.service_cidrs == ()
        said = [r for r in caplog.records if r.getMessage().startswith("servicecidrs:")]
        assert len(said) == 1 and said[0].levelno == logging.WARNING
        assert "grant list and watch on it" in said[0].getMessage()
    finally:
        server.stop()


def test_invalid_service_cidr_becomes_an_event_and_is_not_programmed(
    srv: FakeApiServer, make_source: Callable[..., KubeApiSource]
) -> None:
    populate(srv, 1)
    srv.create("ServiceCIDR", service_cidr("kubernetes", "10.96.0.0/16", "10.97.0.0/16"))
    source = synced(make_source)
    wait_until(lambda: len(srv.list_objects("Event")) == 1, what="event created")
    ev = srv.list_objects("Event")[0]
    assert ev["involvedObject"]["kind"] == "ServiceCIDR"
    assert ev["involvedObject"]["name"] == "kubernetes"
    assert "namespace" not in ev["involvedObject"]
    assert "spec.cidrs: may hold at most one CIDR per IP family" in ev["message"]
    assert source.cluster.checkout(full=True).service_cidrs == ()


# ------------------------------------------------------------------------------------ CLI


def test_run_once_with_an_unreachable_api_fails_after_a_bounded_wait(
    srv: FakeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_config(tmp_path, srv.write_kubeconfig(tmp_path / "kubeconfig"))
    srv.stop()  # nothing listens on that port any more
    monkeypatch.setattr(run_command, "ONCE_SYNC_TIMEOUT", 1.0)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    started = time.monotonic()
    try:
        code = cli.main(["run", "--config", str(config), "--once"])
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    assert code == cli.EXIT_SYNC_FAILED
    assert time.monotonic() - started < 5


def test_the_collector_is_off_while_the_initial_lists_are_decoded_only(
    srv: FakeApiServer, make_source: Callable[..., KubeApiSource]
) -> None:
    populate(srv, 5)
    source = make_source()
    seen: list[bool] = []
    set_service = source.cluster.set_service

    def recording(obj: Mapping[str, Any], origin: str = "") -> None:
        seen.append(gc.isenabled())
        set_service(obj, origin)

    source.cluster.set_service = recording  # type: ignore[method-assign]
    assert gc.isenabled()
    source.start()
    assert source.wait_for_initial_sync(5)
    assert len(seen) == 5 and not any(seen)  # every listed Service decoded with it off
    assert gc.isenabled()  # and on again once the lists are complete
    srv.update("Service", svc("s0", port=81))
    wait_until(lambda: len(seen) == 6)
    assert seen[-1] is True  # watch events: the collector runs as usual


def test_the_collector_is_on_before_the_initial_lists_let_a_sync_in(
    srv: FakeApiServer, make_source: Callable[..., KubeApiSource], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A sync pauses the collector for itself: the source ending its own pause after the gate
    # opened would turn it on under that sync.
    populate(srv, 5)
    source = make_source()
    assert isinstance(source.cluster, GatedClusterState)
    seen: list[bool] = []
    open_gate = source.cluster.open

    def recording() -> None:
        seen.append(gc.isenabled())
        open_gate()

    source.cluster.open = recording  # type: ignore[method-assign]
    gc.unfreeze()
    monkeypatch.setattr(collector, "_frozen", False)  # as in a process that has not frozen yet
    source.start()
    assert source.wait_for_initial_sync(5)
    assert seen == [True]
    # What the lists made is frozen, not scanned by a young collection at the gate.
    assert gc.get_freeze_count() > 0


def test_a_source_stopped_before_its_lists_gives_the_collector_back() -> None:
    # A role that may not list Services: the initial sync never completes.
    server = FakeApiServer(
        authorizer={p for p in KUBE_PROXY_PERMISSIONS if p[1] != "services"}
    ).start()
    api = server.api_client()
    try:
        source = KubeApiSource(api, NODE, backoff_initial=0.05).start()
        assert not source.wait_for_initial_sync(0.5)
        assert not gc.isenabled()
        source.stop()
        assert gc.isenabled()
    finally:
        gc.enable()
        api.close()
        server.stop()
