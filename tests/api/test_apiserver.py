"""The fake API server, driven by the REAL ``kubernetes`` Python client over real HTTP."""

from __future__ import annotations

import http.client
import json
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3
from apiserver import KUBE_PROXY_PERMISSIONS, FakeApiServer, RequestRecord
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

NS = "default"


# ------------------------------------------------------------------------------------ helpers


@pytest.fixture
def srv() -> Iterator[FakeApiServer]:
    server = FakeApiServer(bookmark_interval=0.2, too_large_rv_wait=0.2).start()
    try:
        yield server
    finally:
        server.stop()
        assert not [t for t in threading.enumerate() if t.name == "fake-apiserver"]


@pytest.fixture
def api(srv: FakeApiServer, tmp_path: Path) -> client.ApiClient:
    """A client configured the way kubeplex will be: from a kubeconfig file."""
    kubeconfig = srv.write_kubeconfig(tmp_path / "kubeconfig")
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    assert cfg.host == srv.url
    return client.ApiClient(cfg)


def svc(
    name: str, ns: str = NS, labels: dict[str, str] | None = None, port: int = 80
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": ns, "labels": labels or {}},
        "spec": {"selector": {"app": name}, "ports": [{"name": "http", "port": port}]},
    }


def slice_(name: str, service: str, ip: str, ns: str = NS) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": {"kubernetes.io/service-name": service},
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip], "conditions": {"ready": True}}],
        "ports": [{"name": "http", "port": 8080}],
    }


class Collector:
    """Consume a ``Watch.stream`` generator on a thread; hand events over a queue."""

    def __init__(self, gen: Iterator[dict[str, Any]]) -> None:
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(gen,), daemon=True)
        self._thread.start()

    def _run(self, gen: Iterator[dict[str, Any]]) -> None:
        try:
            for ev in gen:
                self.events.put(ev)
        except BaseException as exc:
            self.error = exc
        finally:
            self.done.set()

    def next(self, timeout: float = 5.0, skip_bookmarks: bool = True) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            ev = self.events.get(timeout=max(0.01, deadline - time.monotonic()))
            if not (skip_bookmarks and ev["type"] == "BOOKMARK"):
                return ev

    def finish(self, timeout: float = 5.0) -> list[dict[str, Any]]:
        assert self.done.wait(timeout), "watch stream did not end"
        out = []
        while not self.events.empty():
            out.append(self.events.get())
        return out


def summary(ev: dict[str, Any]) -> tuple[str, str, str]:
    meta = ev["raw_object"]["metadata"]
    return ev["type"], meta.get("name", ""), meta["resourceVersion"]


def watch_requests(srv: FakeApiServer, resource: str) -> list[RequestRecord]:
    return srv.find_requests("watch", resource)


def wait_until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


# ------------------------------------------------------------------------------------ discovery


def test_discovery_and_version(api: client.ApiClient) -> None:
    assert client.VersionApi(api).get_code().major == "1"
    assert client.CoreApi(api).get_api_versions().versions == ["v1"]
    groups = {g.name for g in client.ApisApi(api).get_api_versions().groups}
    assert {"discovery.k8s.io", "events.k8s.io"} <= groups
    core = {r.name for r in client.CoreV1Api(api).get_api_resources().resources}
    assert {"services", "services/status", "nodes", "events"} <= core
    disc = client.DiscoveryV1Api(api).get_api_resources()
    assert [r.name for r in disc.resources] == ["endpointslices"]


# ------------------------------------------------------------------------------------ list


def test_list_services_paging_is_a_consistent_snapshot(
    srv: FakeApiServer, api: client.ApiClient
) -> None:
    v1 = client.CoreV1Api(api)
    for i in range(5):
        srv.create("Service", svc(f"s{i}", ns="a" if i % 2 else "b"))
    full = v1.list_service_for_all_namespaces()
    assert full.kind == "ServiceList" and full.api_version == "v1"
    assert full.metadata.resource_version == str(srv.resource_version)
    # like the real server, list items carry no kind/apiVersion; objects get uid/rv/timestamps
    item = full.items[0]
    assert item.kind is None and item.metadata.uid and item.metadata.creation_timestamp
    assert item.spec.cluster_ip.startswith("10.96.") and item.spec.ports[0].protocol == "TCP"
    # sorted by key (namespace/name) like etcd
    assert [(s.metadata.namespace, s.metadata.name) for s in full.items] == [
        ("a", "s1"), ("a", "s3"), ("b", "s0"), ("b", "s2"), ("b", "s4"),
    ]  # fmt: skip

    page = v1.list_service_for_all_namespaces(limit=2)
    snapshot_rv = page.metadata.resource_version
    assert page.metadata.remaining_item_count == 3 and page.metadata._continue
    names = [s.metadata.name for s in page.items]
    # changes between pages are invisible to the continued list (consistent snapshot)
    srv.delete("Service", "s0", namespace="b")
    srv.create("Service", svc("s9", ns="b"))
    while page.metadata._continue:
        page = v1.list_service_for_all_namespaces(limit=2, _continue=page.metadata._continue)
        assert page.metadata.resource_version == snapshot_rv
        names += [s.metadata.name for s in page.items]
    assert names == ["s1", "s3", "s0", "s2", "s4"]
    assert page.metadata.remaining_item_count is None
    lists = srv.find_requests("list", "services")
    assert [r.query.get("limit") for r in lists] == [None, "2", "2", "2"]


def test_list_at_resource_version_0_comes_whole_from_the_watch_cache(
    srv: FakeApiServer, api: client.ApiClient
) -> None:
    """Upstream's cacher ignores the limit of a list at resourceVersion "0" (computeListLimit);
    a continued list, or any other resourceVersion, is paged."""
    v1 = client.CoreV1Api(api)
    for i in range(5):
        srv.create("Service", svc(f"s{i}", ns="a"))
    whole = v1.list_service_for_all_namespaces(limit=2, resource_version="0")
    assert len(whole.items) == 5 and whole.metadata._continue is None
    assert whole.metadata.resource_version == str(srv.resource_version)
    assert whole.metadata.remaining_item_count is None
    match = v1.list_service_for_all_namespaces(
        limit=2, resource_version="0", resource_version_match="NotOlderThan"
    )
    assert len(match.items) == 5 and match.metadata._continue is None
    page = v1.list_service_for_all_namespaces(limit=2)
    assert len(page.items) == 2 and page.metadata._continue
    rest = v1.list_service_for_all_namespaces(
        limit=2, resource_version="0", _continue=page.metadata._continue
    )
    assert len(rest.items) == 2 and rest.metadata._continue


def test_a_streamed_list_comes_in_chunks_as_go_s_server_cuts_them(srv: FakeApiServer) -> None:
    """net/http buffers 2,048 bytes before each chunk; what is left of a write that does not fit
    the emptied buffer goes out whole."""
    for i in range(30):
        big = {"note": "x" * (3000 if i % 7 == 0 else 200)}
        srv.create("Service", {**svc(f"s{i}"), "metadata": {"name": f"s{i}", "annotations": big}})
    sock = socket.create_connection((srv.host, srv.port), timeout=5)
    try:
        sock.sendall(b"GET /api/v1/services?resourceVersion=0 HTTP/1.1\r\nHost: x\r\n\r\n")
        raw = b""
        while not raw.endswith(b"\r\n0\r\n\r\n"):
            got = sock.recv(65536)
            assert got, "the connection closed before the last chunk"
            raw += got
    finally:
        sock.close()
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head.lower()
    chunks: list[bytes] = []
    while True:
        line, _, rest = rest.partition(b"\r\n")
        size = int(line, 16)
        if size == 0:
            break
        chunks.append(rest[:size])
        rest = rest[size + 2 :]
    assert len(json.loads(b"".join(chunks))["items"]) == 30
    sizes = [len(c) for c in chunks]
    # Each a full buffer, or more when what was left of a write did not fit the emptied
    # buffer; the last what was buffered at the end.
    assert all(n >= 2048 for n in sizes[:-1]) and sizes[-1] <= 2048, sizes
    assert sizes.count(2048) >= len(sizes) // 2 and len(sizes) > 10, sizes


def test_list_at_resource_version_0_is_paged_without_a_watch_cache() -> None:
    with FakeApiServer(watch_cache=False) as srv, srv.api_client() as api:
        v1 = client.CoreV1Api(api)
        for i in range(3):
            srv.create("Service", svc(f"s{i}", ns="a"))
        page = v1.list_service_for_all_namespaces(limit=2, resource_version="0")
        assert len(page.items) == 2 and page.metadata.remaining_item_count == 1
        rest = v1.list_service_for_all_namespaces(limit=2, _continue=page.metadata._continue)
        assert [s.metadata.name for s in page.items + rest.items] == ["s0", "s1", "s2"]


def test_list_endpointslices_with_paging_and_selectors(
    srv: FakeApiServer, api: client.ApiClient
) -> None:
    d1 = client.DiscoveryV1Api(api)
    srv.create("EndpointSlice", slice_("web-abc", "web", "10.0.0.1"))
    srv.create("EndpointSlice", slice_("web-def", "web", "10.0.0.2"))
    srv.create("EndpointSlice", slice_("db-xyz", "db", "10.0.0.3", ns="other"))
    page1 = d1.list_endpoint_slice_for_all_namespaces(limit=1)
    assert page1.kind == "EndpointSliceList" and page1.api_version == "discovery.k8s.io/v1"
    assert page1.items[0].metadata.generation == 1
    page2 = d1.list_endpoint_slice_for_all_namespaces(limit=5, _continue=page1.metadata._continue)
    assert [e.metadata.name for e in page1.items + page2.items] == ["web-abc", "web-def", "db-xyz"]
    assert page2.metadata._continue is None
    web = d1.list_namespaced_endpoint_slice(NS, label_selector="kubernetes.io/service-name=web")
    assert [e.endpoints[0].addresses[0] for e in web.items] == ["10.0.0.1", "10.0.0.2"]
    assert web.items[0].ports[0].protocol == "TCP"  # defaulted
    # with a selector and a limit: continue but no remainingItemCount (like etcd3 GetList)
    sel = d1.list_endpoint_slice_for_all_namespaces(
        label_selector="kubernetes.io/service-name", limit=1
    )
    assert sel.metadata._continue and sel.metadata.remaining_item_count is None


def test_label_and_field_selectors(srv: FakeApiServer, api: client.ApiClient) -> None:
    v1 = client.CoreV1Api(api)
    srv.create("Service", svc("plain", labels={"app": "a"}))
    srv.create(
        "Service", svc("headless", labels={"service.kubernetes.io/headless": "", "app": "b"})
    )
    srv.create("Service", svc("other", labels={"service.kubernetes.io/service-proxy-name": "x"}))

    def names(**kw: Any) -> list[str]:
        return [s.metadata.name for s in v1.list_service_for_all_namespaces(**kw).items]

    kube_proxy = "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless"
    assert names(label_selector=kube_proxy) == ["plain"]
    assert names(label_selector="app") == ["headless", "plain"]
    assert names(label_selector="app!=a") == ["headless", "other"]
    assert names(label_selector="app in (a, b),app notin (b)") == ["plain"]
    assert names(label_selector="app==b") == ["headless"]
    assert names(field_selector="metadata.name=other") == ["other"]
    assert names(field_selector="metadata.namespace!=default") == []
    ip = srv.get("Service", "plain")["spec"]["clusterIP"]
    assert names(field_selector=f"spec.clusterIP={ip}") == ["plain"]
    with pytest.raises(ApiException) as exc:
        v1.list_service_for_all_namespaces(field_selector="spec.bogus=1")
    assert exc.value.status == 400
    assert json.loads(exc.value.body)["message"] == "field label not supported: spec.bogus"
    with pytest.raises(ApiException) as exc:
        v1.list_service_for_all_namespaces(label_selector="a in (b")
    assert exc.value.status == 400


def test_list_resource_version_semantics(srv: FakeApiServer, api: client.ApiClient) -> None:
    v1 = client.CoreV1Api(api)
    srv.create("Service", svc("a"))
    old_rv = str(srv.resource_version)
    srv.create("Service", svc("b"))
    srv.create("Service", svc("c"))
    now_rv = str(srv.resource_version)

    exact = v1.list_namespaced_service(NS, resource_version=old_rv, resource_version_match="Exact")
    assert [s.metadata.name for s in exact.items] == ["a"]
    assert exact.metadata.resource_version == old_rv
    # legacy: limit + rv (no match) means Exact
    legacy = v1.list_namespaced_service(NS, resource_version=old_rv, limit=10)
    assert [s.metadata.name for s in legacy.items] == ["a"]
    # NotOlderThan / rv=0 serve the latest
    for rv, match in ((old_rv, "NotOlderThan"), (old_rv, None), ("0", None)):
        got = v1.list_namespaced_service(NS, resource_version=rv, resource_version_match=match)
        assert got.metadata.resource_version == now_rv and len(got.items) == 3

    token = v1.list_namespaced_service(NS, limit=1).metadata._continue
    srv.create("Service", svc("d"))
    srv.compact()  # like etcd: reads at the compaction revision itself stay valid
    # too old: Exact -> 410 Expired; NotOlderThan is still fine
    with pytest.raises(ApiException) as exc:
        v1.list_namespaced_service(NS, resource_version=old_rv, resource_version_match="Exact")
    status = json.loads(exc.value.body)
    assert (exc.value.status, status["reason"]) == (410, "Expired")
    assert status["message"] == "The resourceVersion for the provided list is too old."
    assert len(v1.list_namespaced_service(NS, resource_version=old_rv).items) == 4
    # expired continue token -> 410 + an inconsistent continue token in the Status
    with pytest.raises(ApiException) as exc:
        v1.list_namespaced_service(NS, limit=1, _continue=token)
    status = json.loads(exc.value.body)
    assert (exc.value.status, status["reason"], status["code"]) == (410, "Expired", 410)
    assert status["message"].startswith("The provided continue parameter is too old")
    inconsistent = v1.list_namespaced_service(NS, limit=5, _continue=status["metadata"]["continue"])
    assert [s.metadata.name for s in inconsistent.items] == ["b", "c", "d"]

    # ListOptions validation (422 Invalid) and bad combinations (400)
    with pytest.raises(ApiException) as exc:
        v1.list_namespaced_service(NS, resource_version_match="NotOlderThan")
    assert exc.value.status == 422
    assert "resourceVersionMatch is forbidden unless resourceVersion is provided" in exc.value.body
    with pytest.raises(ApiException) as exc:
        v1.list_namespaced_service(NS, resource_version="5", _continue=token)
    assert exc.value.status == 400
    # a resourceVersion from the future: wait (too_large_rv_wait), then 504 Timeout
    with pytest.raises(ApiException) as exc:
        v1.list_namespaced_service(NS, resource_version=str(int(now_rv) + 100))
    status = json.loads(exc.value.body)
    assert (exc.value.status, status["reason"]) == (504, "Timeout")
    assert status["details"]["causes"][0]["reason"] == "ResourceVersionTooLarge"


def test_global_resource_version_and_crud_over_http(
    srv: FakeApiServer, api: client.ApiClient
) -> None:
    v1 = client.CoreV1Api(api)
    node = srv.create("Node", {"metadata": {"name": "n1"}, "spec": {"podCIDR": "10.244.0.0/24"}})
    created = v1.create_namespaced_service(NS, svc("web"))
    assert int(created.metadata.resource_version) > int(node["metadata"]["resourceVersion"])
    assert created.kind == "Service"
    assert v1.read_node("n1").spec.pod_cidr == "10.244.0.0/24"
    with pytest.raises(ApiException) as exc:
        v1.create_namespaced_service(NS, svc("web"))
    assert (exc.value.status, json.loads(exc.value.body)["reason"]) == (409, "AlreadyExists")
    with pytest.raises(ApiException) as exc:
        v1.read_namespaced_service("nope", NS)
    status = json.loads(exc.value.body)
    assert (exc.value.status, status["message"]) == (404, 'services "nope" not found')
    # optimistic concurrency on update
    stale = v1.read_namespaced_service("web", NS)
    v1.patch_namespaced_service("web", NS, {"metadata": {"labels": {"x": "1"}}})
    with pytest.raises(ApiException) as exc:
        v1.replace_namespaced_service("web", NS, stale)
    assert exc.value.status == 409
    # a no-op update does not bump the resourceVersion
    cur = v1.read_namespaced_service("web", NS)
    same = v1.replace_namespaced_service("web", NS, cur)
    assert same.metadata.resource_version == cur.metadata.resource_version
    v1.delete_namespaced_service("web", NS)
    assert srv.list_objects("Service") == []


# ------------------------------------------------------------------------------------ watch


def test_watch_from_list_resource_version_sees_changes_in_order(
    srv: FakeApiServer, api: client.ApiClient
) -> None:
    v1 = client.CoreV1Api(api)
    srv.create("Service", svc("before"))
    listed = v1.list_service_for_all_namespaces()
    rv = listed.metadata.resource_version
    srv.create("Service", svc("early"))  # after the list, before the watch: replayed from history
    w = watch.Watch()
    col = Collector(w.stream(v1.list_service_for_all_namespaces, resource_version=rv))
    srv.wait_for_watches(1, "services")
    srv.patch("Service", "early", {"metadata": {"labels": {"v": "2"}}})
    srv.delete("Service", "before")
    got = [col.next() for _ in range(3)]
    w.stop()
    assert [(e["type"], e["object"].metadata.name) for e in got] == [
        ("ADDED", "early"),
        ("MODIFIED", "early"),
        ("DELETED", "before"),
    ]
    rvs = [int(e["object"].metadata.resource_version) for e in got]
    assert rvs == sorted(rvs) and rvs[-1] == srv.resource_version  # DELETED carries the delete rv
    assert got[0]["object"].kind == "Service"  # watch objects do carry TypeMeta
    assert got[2]["raw_object"]["metadata"]["labels"] == {}
    assert w.resource_version == str(srv.resource_version)


def test_watch_without_resource_version_starts_with_synthetic_adds(
    srv: FakeApiServer, api: client.ApiClient
) -> None:
    d1 = client.DiscoveryV1Api(api)
    srv.create("EndpointSlice", slice_("web-1", "web", "10.0.0.1"))
    srv.create("EndpointSlice", slice_("web-2", "web", "10.0.0.2"))
    events = list(watch.Watch().stream(d1.list_namespaced_endpoint_slice, NS, timeout_seconds=1))
    assert [(e["type"], e["object"].metadata.name) for e in events] == [
        ("ADDED", "web-1"),
        ("ADDED", "web-2"),
    ]
    assert events[0]["object"].address_type == "IPv4"


def test_watch_selector_transitions_and_field_selected_node(
    srv: FakeApiServer, api: client.ApiClient
) -> None:
    v1 = client.CoreV1Api(api)
    srv.create("Service", svc("x", labels={"keep": "yes"}))
    srv.create("Node", {"metadata": {"name": "n1"}})
    srv.create("Node", {"metadata": {"name": "n2"}})
    rv = str(srv.resource_version)
    ws, wn = watch.Watch(), watch.Watch()
    cs = Collector(ws.stream(v1.list_service_for_all_namespaces, label_selector="keep=yes",
                             resource_version=rv))  # fmt: skip
    cn = Collector(wn.stream(v1.list_node, field_selector="metadata.name=n1", resource_version=rv))
    srv.wait_for_watches(2)
    srv.patch("Service", "x", {"metadata": {"labels": {"keep": "no"}}})  # leaves the selector
    srv.patch("Service", "x", {"metadata": {"labels": {"keep": "yes"}}})  # comes back
    srv.patch("Node", "n2", {"spec": {"unschedulable": True}})  # not watched
    srv.patch("Node", "n1", {"spec": {"unschedulable": True}})
    assert [cs.next()["type"], cs.next()["type"]] == ["DELETED", "ADDED"]
    ev = cn.next()
    assert (ev["type"], ev["object"].metadata.name, ev["object"].spec.unschedulable) == (
        "MODIFIED", "n1", True,
    )  # fmt: skip
    ws.stop()
    wn.stop()
    cs.finish()
    cn.finish()


def test_bookmarks_only_when_allowed(srv: FakeApiServer, api: client.ApiClient) -> None:
    v1 = client.CoreV1Api(api)
    rv = v1.list_service_for_all_namespaces().metadata.resource_version
    srv.create("Node", {"metadata": {"name": "elsewhere"}})  # bumps the global rv
    w = watch.Watch()
    events = list(w.stream(v1.list_service_for_all_namespaces, resource_version=rv,
                           allow_watch_bookmarks=True, timeout_seconds=1))  # fmt: skip
    assert len(events) >= 3 and {e["type"] for e in events} == {"BOOKMARK"}
    obj = events[-1]["raw_object"]
    assert obj == {
        "kind": "Service",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": str(srv.resource_version)},
    }
    assert w.resource_version == str(srv.resource_version)  # the client tracks bookmark rvs
    plain = list(watch.Watch().stream(v1.list_service_for_all_namespaces, resource_version=rv,
                                      timeout_seconds=1))  # fmt: skip
    assert plain == []


def test_watch_from_compacted_resource_version_is_410_expired(
    srv: FakeApiServer, api: client.ApiClient
) -> None:
    v1 = client.CoreV1Api(api)
    srv.create("Service", svc("a"))
    old_rv = str(srv.resource_version)
    srv.create("Service", svc("b"))
    srv.compact()
    # On the wire: HTTP 200, then one ERROR event carrying a Status 410 Expired, then EOF.
    resp = v1.list_service_for_all_namespaces(watch=True, resource_version=old_rv,
                                              _preload_content=False)  # fmt: skip
    assert resp.status == 200
    lines = resp.data.decode().splitlines()
    assert [json.loads(line) for line in lines] == [
        {
            "type": "ERROR",
            "object": {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": f"too old resource version: {old_rv} ({srv.resource_version})",
                "reason": "Expired",
                "code": 410,
            },
        }
    ]
    # The client never yields that ERROR event: it raises ApiException(status=410) ...
    with pytest.raises(ApiException) as exc:
        list(watch.Watch().stream(v1.list_service_for_all_namespaces, resource_version=old_rv,
                                  timeout_seconds=1))  # fmt: skip
    assert exc.value.status == 410 and exc.value.reason.startswith("Expired: too old resource")
    # ... and without timeout_seconds it first retries once with the same (still too old) rv.
    srv.clear_requests()
    with pytest.raises(ApiException) as exc:
        list(watch.Watch().stream(v1.list_service_for_all_namespaces, resource_version=old_rv))
    assert exc.value.status == 410
    assert [r.query["resourceVersion"] for r in watch_requests(srv, "services")] == [old_rv] * 2


@pytest.mark.parametrize("mode", ["reset", "eof"])
def test_drop_watches_abruptly_raises_protocol_error(
    srv: FakeApiServer, api: client.ApiClient, mode: str
) -> None:
    v1 = client.CoreV1Api(api)
    w = watch.Watch()
    col = Collector(w.stream(v1.list_service_for_all_namespaces, resource_version="1"))
    srv.wait_for_watches(1)
    srv.create("Service", svc("a"))
    assert col.next()["type"] == "ADDED"
    assert srv.drop_watches(mode) == 1  # type: ignore[arg-type]
    col.finish()
    assert isinstance(col.error, urllib3.exceptions.ProtocolError), repr(col.error)
    wait_until(lambda: srv.watch_count() == 0)


def test_drop_watches_cleanly_ends_stream_or_client_rewatches(
    srv: FakeApiServer, api: client.ApiClient
) -> None:
    v1 = client.CoreV1Api(api)
    # with timeout_seconds the client does not retry: a clean close just ends the stream
    col = Collector(watch.Watch().stream(v1.list_node, resource_version="1", timeout_seconds=30))
    srv.wait_for_watches(1)
    srv.drop_watches("close")
    assert col.finish() == [] and col.error is None

    # without it, Watch.stream transparently re-watches from the last resourceVersion it saw
    srv.clear_requests()
    w = watch.Watch()
    col = Collector(w.stream(v1.list_node, resource_version="1"))
    srv.wait_for_watches(1)
    first = srv.create("Node", {"metadata": {"name": "n1"}})
    assert col.next()["object"].metadata.name == "n1"
    srv.drop_watches("close")
    wait_until(lambda: len(watch_requests(srv, "nodes")) == 2)
    srv.wait_for_watches(1)
    srv.create("Node", {"metadata": {"name": "n2"}})
    assert col.next()["object"].metadata.name == "n2"
    w.stop()
    col.finish()
    assert [r.query["resourceVersion"] for r in watch_requests(srv, "nodes")] == [
        "1",
        first["metadata"]["resourceVersion"],
    ]


def test_watch_timeout_seconds_is_honoured(srv: FakeApiServer, api: client.ApiClient) -> None:
    v1 = client.CoreV1Api(api)
    t0 = time.monotonic()
    assert list(watch.Watch().stream(v1.list_node, resource_version="1", timeout_seconds=1)) == []
    assert 0.9 < time.monotonic() - t0 < 3


def test_a_watch_ended_with_its_last_chunk_keeps_the_connection(srv: FakeApiServer) -> None:
    """As Go's server: the next request may follow on the same connection; a watch dropped
    by EOF closes it."""
    conn = http.client.HTTPConnection(srv.host, srv.port, timeout=5)
    try:
        for query in ("watch=1&timeoutSeconds=0.2", "watch=1&resourceVersion=1&timeoutSeconds=0.2"):
            conn.request("GET", f"/api/v1/nodes?{query}")
            resp = conn.getresponse()
            assert resp.status == 200 and resp.getheader("Connection") != "close"
            resp.read()
            conn.request("GET", "/api/v1/nodes")
            listed = conn.getresponse()
            assert listed.status == 200 and json.loads(listed.read())["kind"] == "NodeList"
        conn.request("GET", "/api/v1/nodes?watch=1&resourceVersion=1")
        resp = conn.getresponse()
        srv.wait_for_watches(1)
        srv.drop_watches("eof")
        with pytest.raises(http.client.IncompleteRead):
            resp.read()
        conn.request("GET", "/api/v1/nodes")
        with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
            conn.getresponse()
    finally:
        conn.close()


# ------------------------------------------------------------------------------------ authz


def test_authorizer_returns_403_outside_the_allowed_verbs(
    srv: FakeApiServer, api: client.ApiClient
) -> None:
    srv.authorizer = set(KUBE_PROXY_PERMISSIONS)
    v1, d1 = client.CoreV1Api(api), client.DiscoveryV1Api(api)
    srv.create("Node", {"metadata": {"name": "n1"}})
    v1.list_service_for_all_namespaces()
    d1.list_endpoint_slice_for_all_namespaces()
    v1.read_node("n1")
    list(watch.Watch().stream(v1.list_node, field_selector="metadata.name=n1", timeout_seconds=1))
    with pytest.raises(ApiException) as exc:
        v1.create_namespaced_service(NS, svc("x"))
    assert exc.value.status == 403
    status = json.loads(exc.value.body)
    assert status["reason"] == "Forbidden" and status["details"] == {"kind": "services"}
    assert status["message"] == (
        'services is forbidden: User "system:kube-proxy" cannot create resource "services" '
        'in API group "" in the namespace "default"'
    )
    with pytest.raises(ApiException) as exc:
        d1.read_namespaced_endpoint_slice("s", NS)
    assert exc.value.status == 403
    assert json.loads(exc.value.body)["message"].startswith(
        'endpointslices.discovery.k8s.io "s" is forbidden'
    )
    with pytest.raises(ApiException) as exc:  # watch is refused before the stream starts
        list(watch.Watch().stream(v1.list_namespaced_pod, NS, timeout_seconds=1))
    assert exc.value.status == 403
    assert srv.verbs_used() - KUBE_PROXY_PERMISSIONS == {
        ("create", "services"),
        ("get", "endpointslices"),
        ("watch", "pods"),
    }


# ------------------------------------------------------------------------------------ events


def test_events_can_be_created_and_patched(srv: FakeApiServer, api: client.ApiClient) -> None:
    v1 = client.CoreV1Api(api)
    ev = client.CoreV1Event(
        metadata=client.V1ObjectMeta(name="n1.17a", namespace=NS),
        involved_object=client.V1ObjectReference(kind="Node", name="n1", uid="n1"),
        reason="Starting",
        message="Starting kube-proxy.",
        type="Normal",
        count=1,
        source=client.V1EventSource(component="kube-proxy", host="n1"),
    )
    created = v1.create_namespaced_event(NS, ev)
    assert created.metadata.uid and created.reason == "Starting"
    # client-go's recorder patches count/lastTimestamp (strategic merge patch by default here)
    v1.patch_namespaced_event("n1.17a", NS, {"count": 2, "message": "again"})
    stored = srv.get("Event", "n1.17a", namespace=NS)
    assert (stored["count"], stored["message"], stored["source"]["component"]) == (
        2, "again", "kube-proxy",
    )  # fmt: skip
    patch_req = srv.find_requests("patch", "events")[0]
    assert patch_req.headers["content-type"] == "application/strategic-merge-patch+json"
    listed = v1.list_namespaced_event(NS, field_selector="source=kube-proxy,reason=Starting")
    assert [e.metadata.name for e in listed.items] == ["n1.17a"]
    # events.k8s.io/v1 is served too (kept separately from core/v1 events in this fake)
    ev2 = client.EventsV1Event(
        metadata=client.V1ObjectMeta(name="n1.17b", namespace=NS),
        event_time="2025-01-01T00:00:00.000000Z",
        reporting_controller="kube-proxy",
        reporting_instance="n1",
        action="StartKubeProxy",
        reason="Starting",
        regarding=client.V1ObjectReference(kind="Node", name="n1"),
        type="Normal",
    )
    client.EventsV1Api(api).create_namespaced_event(NS, ev2)
    assert srv.get("events.events.k8s.io", "n1.17b", namespace=NS)["action"] == "StartKubeProxy"


# ------------------------------------------------------------------------------------ content types


def test_protobuf_accept_falls_back_to_json(srv: FakeApiServer, api: client.ApiClient) -> None:
    v1 = client.CoreV1Api(api)
    srv.create("Service", svc("a"))
    # what client-go sends for built-ins; a JSON-only server must answer JSON
    accept = "application/vnd.kubernetes.protobuf, application/json"
    got = v1.list_service_for_all_namespaces(_headers={"Accept": accept})
    assert [s.metadata.name for s in got.items] == ["a"]
    assert srv.requests[-1].headers["accept"] == accept
    # the Python client itself only ever asks for JSON
    v1.list_service_for_all_namespaces()
    assert srv.requests[-1].headers["accept"] == "application/json"
    # a Table request falls back to the plain JSON list, a protobuf-only one gets 406
    table = "application/json;as=Table;v=v1;g=meta.k8s.io, application/json"
    assert v1.list_service_for_all_namespaces(_headers={"Accept": table}).kind == "ServiceList"
    with pytest.raises(ApiException) as exc:
        v1.list_service_for_all_namespaces(
            _headers={"Accept": "application/vnd.kubernetes.protobuf"}
        )
    assert (exc.value.status, json.loads(exc.value.body)["reason"]) == (406, "NotAcceptable")


# ------------------------------------------------------------------------------------ faults


def test_fault_injection_and_request_log(srv: FakeApiServer, api: client.ApiClient) -> None:
    v1 = client.CoreV1Api(api)
    srv.fail_next(1, code=500, match=lambda r: r.resource == "services")
    with pytest.raises(ApiException) as exc:
        v1.list_service_for_all_namespaces()
    assert exc.value.status == 500
    v1.list_service_for_all_namespaces()
    srv.fail_next(1, code=503)
    with pytest.raises(ApiException) as exc:
        v1.list_node()
    assert (exc.value.status, json.loads(exc.value.body)["reason"]) == (503, "ServiceUnavailable")
    # 429 + Retry-After: urllib3 (under the client) sleeps and retries transparently
    srv.clear_requests()
    srv.fail_next(1, code=429, retry_after=0)
    assert v1.list_node().items == []
    assert [r.status for r in srv.find_requests("list", "nodes")] == [429, 200]
    # a connection reset before the response: urllib3 retries idempotent requests by itself
    srv.clear_requests()
    srv.fail_next(1, reset=True)
    assert v1.list_node().items == []
    assert [r.status for r in srv.find_requests("list", "nodes")] == [0, 200]

    # pause(): requests hang until resume()
    srv.pause()
    result: list[Any] = []
    t = threading.Thread(target=lambda: result.append(v1.list_node()))
    t.start()
    srv.wait_for_request(lambda r: r.status is None and r.resource == "nodes")
    time.sleep(0.1)
    assert result == []
    srv.resume()
    t.join(5)
    assert len(result) == 1


def test_stop_and_restart_keeps_state_and_port(srv: FakeApiServer, api: client.ApiClient) -> None:
    v1 = client.CoreV1Api(api)
    srv.create("Service", svc("a"))
    col = Collector(watch.Watch().stream(v1.list_node, resource_version="1", timeout_seconds=30))
    srv.wait_for_watches(1)
    port = srv.port
    srv.stop()
    col.finish()
    assert srv.watch_count() == 0
    srv.start()
    assert srv.port == port
    assert [s.metadata.name for s in v1.list_service_for_all_namespaces().items] == ["a"]


def test_defaulting_status_subresource_finalizers_and_patch_types(
    srv: FakeApiServer, api: client.ApiClient
) -> None:
    v1 = client.CoreV1Api(api)
    body = svc("lb")
    body["metadata"]["finalizers"] = ["service.kubernetes.io/load-balancer-cleanup"]
    body["spec"].update(type="LoadBalancer", externalTrafficPolicy="Local")
    lb = v1.create_namespaced_service(NS, body)
    assert lb.spec.ports[0].node_port and lb.spec.health_check_node_port
    assert lb.spec.ports[0].target_port == 80 and lb.spec.ip_families == ["IPv4"]
    # status is a subresource: the main resource ignores status, /status ignores the rest
    ingress = {"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}}}
    v1.patch_namespaced_service("lb", NS, ingress)
    assert srv.get("Service", "lb")["status"] == {"loadBalancer": {}}
    v1.patch_namespaced_service_status("lb", NS, {**ingress, "spec": {"type": "ClusterIP"}})
    got = srv.get("Service", "lb")
    assert got["status"]["loadBalancer"]["ingress"] == [{"ip": "192.0.2.1"}]
    assert got["spec"]["type"] == "LoadBalancer"
    # RFC 6902 JSON patch (a list body)
    v1.patch_namespaced_service("lb", NS, [{"op": "add", "path": "/metadata/labels", "value": {}}])
    # DELETE with finalizers only sets deletionTimestamp; dropping the finalizer deletes
    assert v1.delete_namespaced_service("lb", NS).metadata.deletion_timestamp is not None
    assert srv.get("Service", "lb")["metadata"]["deletionTimestamp"]
    v1.patch_namespaced_service("lb", NS, {"metadata": {"finalizers": None}})
    assert srv.list_objects("Service") == []
