"""The resourceVersions and limits the API source lists with: client-go's reflector and pager.

The first list asks for resourceVersion 0 (the watch cache answers it whole, whatever the
limit); relists ask for the last resourceVersion seen, unpaged; a list whose resourceVersion
is too old or too new is retried at once with none (a consistent, paged list); a server that
paged the first list (no watch cache) gets paged relists."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from apiserver import KUBE_PROXY_PERMISSIONS, FakeApiServer
from kits.kubeapi_kit import api_source, rbac_server
from kubernetes.client.exceptions import ApiException

from kubeplex.core.model.types import IPFamily
from kubeplex.core.sources.api_errors import resource_version_unavailable
from kubeplex.core.sources.kubeapi import ENDPOINTSLICES, NODES, SERVICES, KubeApiSource

NODE = "kind-worker"
NS = "default"


def svc(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": NS},
        "spec": {"selector": {"app": name}, "ports": [{"name": "http", "port": 80}]},
    }


def eps(name: str, service: str, ip: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {"kubernetes.io/service-name": service},
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip], "conditions": {"ready": True}, "nodeName": NODE}],
        "ports": [{"name": "http", "port": 8080}],
    }


def populate(srv: FakeApiServer, n: int) -> None:
    srv.create("Node", {"metadata": {"name": NODE}, "spec": {"podCIDR": "10.244.1.0/24"}})
    for i in range(n):
        srv.create("Service", svc(f"s{i}"))
        srv.create("EndpointSlice", eps(f"s{i}-abc", f"s{i}", f"10.244.1.{i + 10}"))


def wait_until(cond: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"{what} not met in time"
        time.sleep(0.01)


def programmed(source: KubeApiSource) -> set[str]:
    """The Services a sync would program now (checks out, as the proxier would)."""
    state = source.cluster.checkout()
    return {sp.name.namespaced_name for sp in state.graphs[IPFamily.IPv4]}


def asked(srv: FakeApiServer, resource: str) -> list[tuple[str | None, str | None, bool, int]]:
    """(resourceVersion, limit, continued, status) of each list of ``resource``."""
    return [
        (r.query.get("resourceVersion"), r.query.get("limit"), "continue" in r.query, r.status or 0)
        for r in srv.find_requests("list", resource)
    ]


@pytest.fixture
def srv(request: pytest.FixtureRequest) -> Iterator[FakeApiServer]:
    yield from rbac_server(request)


@pytest.fixture
def make_source(srv: FakeApiServer, tmp_path: Path) -> Iterator[Callable[..., KubeApiSource]]:
    made: list[KubeApiSource] = []

    def make(**kwargs: Any) -> KubeApiSource:
        source = api_source(srv, tmp_path, NODE, **kwargs)
        made.append(source)
        return source.start()

    yield make
    for source in made:
        source.stop()


def test_the_first_list_is_at_resource_version_0_and_comes_whole(
    srv: FakeApiServer, make_source: Callable[..., KubeApiSource]
) -> None:
    populate(srv, 5)
    source = make_source()
    assert source.wait_for_initial_sync(5)
    # One request each: the watch cache ignores the limit of a list at resourceVersion 0.
    assert asked(srv, SERVICES) == [("0", "2", False, 200)]
    assert asked(srv, ENDPOINTSLICES) == [("0", "2", False, 200)]
    assert asked(srv, NODES) == [("0", "2", False, 200)]
    assert len(programmed(source)) == 5 and len(source.cluster.slice_keys()) == 5
    # the watches start from the list's resourceVersion
    watch = srv.wait_for_request(lambda r: r.verb == "watch" and r.resource == SERVICES)
    assert watch.query["resourceVersion"] == str(srv.resource_version)


@pytest.mark.parametrize("srv", [{"bookmark_interval": 60.0}], indirect=True)
def test_a_relist_asks_for_the_last_resource_version_seen_unpaged(
    srv: FakeApiServer, make_source: Callable[..., KubeApiSource]
) -> None:
    populate(srv, 3)
    source = make_source(config_sync_period=0.5, watch_timeout=1.0)
    assert source.wait_for_initial_sync(5)
    srv.wait_for_watches(4)
    srv.create("Service", svc("late"))  # seen through the watch: the rv a relist asks for
    wait_until(lambda: "default/late" in programmed(source), what="watched service")
    seen = source.resource_versions[SERVICES]
    assert seen == str(srv.resource_version)
    wait_until(lambda: source.list_count(SERVICES) >= 2, what="periodic relist")
    first, relist = asked(srv, SERVICES)[:2]
    assert first == ("0", "2", False, 200)
    # Served by the watch cache (at least that fresh): no limit, which would make it exact.
    assert relist[:3] == (seen, None, False) and relist[3] == 200


@pytest.mark.parametrize("srv", [{"bookmark_interval": 60.0}], indirect=True)
def test_a_relist_after_an_expired_watch_asks_for_the_last_resource_version(
    srv: FakeApiServer, make_source: Callable[..., KubeApiSource]
) -> None:
    populate(srv, 2)
    source = make_source()
    assert source.wait_for_initial_sync(5)
    srv.wait_for_watches(4)
    old_rv = source.resource_versions[SERVICES]
    # A change the watch does not see (outside the selector), then compaction: resuming the
    # watch at old_rv is 410 Expired now.
    hidden = svc("hidden")
    hidden["metadata"]["labels"] = {"service.kubernetes.io/headless": ""}
    srv.create("Service", hidden)
    srv.compact()
    srv.drop_watches("close", resource=SERVICES)
    wait_until(lambda: source.list_count(SERVICES) == 2, what="relist after 410")
    # Not "unavailable": a list at that resourceVersion returns something at least as fresh.
    assert asked(srv, SERVICES)[1] == (old_rv, None, False, 200)
    assert programmed(source) == {"default/s0", "default/s1"}


def test_a_list_whose_resource_version_is_gone_is_retried_at_once_as_a_consistent_list(
    srv: FakeApiServer, make_source: Callable[..., KubeApiSource]
) -> None:
    populate(srv, 3)
    srv.fail_next(1, code=410, match=lambda r: r.verb == "list" and r.resource == SERVICES)
    source = make_source(backoff_initial=5.0, backoff_max=5.0)  # a backoff would show
    assert source.wait_for_initial_sync(3)
    # RV "" lists the latest (paged: served by etcd, or consistently by the cache)
    assert asked(srv, SERVICES) == [
        ("0", "2", False, 410),
        (None, "2", False, 200),
        (None, "2", True, 200),
    ]
    assert len(programmed(source)) == 3


def test_a_timeout_that_is_no_resource_version_problem_backs_off(
    srv: FakeApiServer, make_source: Callable[..., KubeApiSource]
) -> None:
    populate(srv, 1)
    srv.fail_next(1, code=504, match=lambda r: r.verb == "list" and r.resource == SERVICES)
    source = make_source()
    assert source.wait_for_initial_sync(5)
    assert asked(srv, SERVICES) == [("0", "2", False, 504), ("0", "2", False, 200)]


def test_a_server_restored_from_an_older_state_is_listed_again_from_scratch(
    srv: FakeApiServer, make_source: Callable[..., KubeApiSource]
) -> None:
    """Its revision is behind what the source saw: the relist at the source's resourceVersion
    waits, gets 504 ResourceVersionTooLarge, and is retried with none."""
    populate(srv, 2)
    for i in range(20):  # revisions the restored server never had
        srv.create("Service", svc(f"gone{i}"))
        srv.delete("Service", f"gone{i}")
    source = make_source()
    assert source.wait_for_initial_sync(5)
    srv.wait_for_watches(4)
    seen = int(source.resource_versions[SERVICES])
    srv.stop()
    restored = FakeApiServer(
        port=srv.port, authorizer=set(KUBE_PROXY_PERMISSIONS), too_large_rv_wait=0.2
    )
    populate(restored, 1)
    assert restored.resource_version < seen
    with restored.start():
        wait_until(lambda: programmed(source) == {"default/s0"}, 10, "the restored state")
        lists = [
            (r.query.get("resourceVersion"), r.status)
            for r in restored.requests
            if r.verb == "list" and r.resource == SERVICES
        ]
        assert lists[:2] == [(str(seen), 504), (None, 200)]
        assert not [r for r in restored.requests if r.status == 403]


@pytest.mark.parametrize("srv", [{"watch_cache": False}], indirect=True)
def test_without_a_watch_cache_the_lists_are_paged_and_so_are_the_relists(
    srv: FakeApiServer, make_source: Callable[..., KubeApiSource]
) -> None:
    populate(srv, 3)
    source = make_source(config_sync_period=0.5, watch_timeout=1.0)
    assert source.wait_for_initial_sync(5)
    rv = source.resource_versions[SERVICES]
    wait_until(lambda: source.list_count(SERVICES) >= 2, what="periodic relist")
    lists = asked(srv, SERVICES)
    # the pager: continued pages carry no resourceVersion
    assert lists[:2] == [("0", "2", False, 200), (None, "2", True, 200)]
    # a relist at the resourceVersion seen, paged (upstream's "legacy exact" list)
    assert lists[2][:3] == (rv, "2", False)


def _api_exception(status: int, body: dict[str, Any]) -> ApiException:
    err = ApiException(status=status, reason="x")
    err.body = json.dumps(body)
    return err


@pytest.mark.parametrize(
    ("status", "body", "unavailable"),
    [
        (410, {"reason": "Expired"}, True),
        (410, {"reason": "Gone"}, True),
        (
            504,
            {
                "reason": "Timeout",
                "message": "Timeout: Too large resource version: 9, current: 3",
                "details": {"causes": [{"reason": "ResourceVersionTooLarge"}]},
            },
            True,
        ),
        (504, {"details": {"causes": [{"message": "Too large resource version"}]}}, True),
        (504, {"message": "Too large resource version: 9, current: 3"}, True),
        (504, {"message": "Timeout: request did not complete within the allowed duration"}, False),
        (504, {"details": "not a mapping"}, False),
        (500, {"message": "Too large resource version"}, False),
    ],
)
def test_what_makes_a_resource_version_unavailable(
    status: int, body: dict[str, Any], unavailable: bool
) -> None:
    assert resource_version_unavailable(_api_exception(status, body)) is unavailable
