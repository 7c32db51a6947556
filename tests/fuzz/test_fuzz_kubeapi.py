"""The Kubernetes API source under fuzzing: the real client against the test API server, which
(like a real one without admission) stores what it is given. One server and one source for all
examples: each example adds its objects in new namespaces, hostile ones first, then good ones,
which must be programmed, so the source is proven to keep following after every example."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
from apiserver import KUBE_PROXY_PERMISSIONS, ApiError, FakeApiServer
from fuzz_checks import (
    FAMILIES,
    Rejections,
    missing_services,
    render_all,
    unnamed_rejections,
    unsafe_lines,
)
from fuzz_profiles import scaled
from hypothesis import given
from kube_strategies import NODE, Mix, mixes, node_object

from kubeplex.core.config.kubeproxy import default_config
from kubeplex.core.sources.gated_cluster import GatedClusterState
from kubeplex.core.sources.kubeapi import KubeApiSource

#: Generous: a watch event takes milliseconds; this only turns a stall into a failure.
STALL_SECONDS = 30.0


@dataclass
class Live:
    srv: FakeApiServer
    source: KubeApiSource
    sink: Rejections


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    # No defaulting: the server stores objects as sent, as one without admission would.
    srv = FakeApiServer(
        authorizer=set(KUBE_PROXY_PERMISSIONS), defaulting=False, bookmark_interval=0.5
    ).start()
    source: KubeApiSource | None = None
    try:
        srv.create("Node", node_object())
        cfg = default_config()
        kubeconfig = srv.write_kubeconfig(tmp_path_factory.mktemp("fuzz-api") / "kubeconfig")
        cfg = replace(
            cfg, client_connection=replace(cfg.client_connection, kubeconfig=str(kubeconfig))
        )
        sink = Rejections()
        cluster = GatedClusterState(NODE, FAMILIES, on_invalid=sink)
        source = KubeApiSource.from_config(
            cfg,
            NODE,
            cluster=cluster,
            qps=1000.0,
            burst=100,
            watch_timeout=30.0,
            backoff_initial=0.05,
            backoff_max=0.3,
        ).start()
        assert source.wait_for_initial_sync(STALL_SECONDS)
        yield Live(srv, source, sink)
        assert srv.verbs_used() <= KUBE_PROXY_PERMISSIONS | {("create", "nodes")}
    finally:
        if source is not None:
            source.stop()
        srv.stop()


def _sendable(obj: dict[str, Any]) -> bool:
    """What any API server's schema lets through: metadata a mapping with a string name and
    namespace, labels and annotations mappings of strings (the test server matches label
    selectors on what it stores, and cannot with anything else)."""
    meta = obj.get("metadata")
    return (
        isinstance(meta, dict)
        and isinstance(meta.get("name"), str)
        and bool(meta["name"])
        and isinstance(meta.get("namespace", ""), str)
        and all(_string_map(meta.get(k, {})) for k in ("labels", "annotations"))
    )


def _string_map(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())


def _wait(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + STALL_SECONDS
    while not cond():
        assert time.monotonic() < deadline, f"stalled: {what}"
        time.sleep(0.01)


# The source's watch threads draw a random timeout when they re-watch; if that falls inside the
# drawing of an example, Hypothesis takes it for a strategy using ``random``.
@pytest.mark.filterwarnings("ignore:Do not use the `random` module")
@scaled(0.2, deadline_ms=15_000)
@given(mixes(max_good=2, max_broken=4))
def test_the_api_source_survives_any_objects_and_keeps_following(live: Live, mix: Mix) -> None:
    """Hostile and broken objects, then good ones: the good ones are programmed (the source
    neither crashed nor stopped following), safely, and every rejection is named. Afterwards
    the example's objects are deleted again, and that must reach the cluster too."""
    good = [o for g in mix.good for o in g.objects]
    sent = [b.obj for b in mix.broken if _sendable(b.obj)]
    applied: list[dict[str, Any]] = []
    cluster = live.source.cluster
    try:
        for obj in [*sent, *good]:
            with contextlib.suppress(ApiError):  # refused: never reaches kube-proxy
                live.srv.apply(str(obj["kind"]), obj)
                applied.append(obj)
        _wait(lambda: {g.key for g in mix.good} <= _programmed(live), "good Services")
        _wait(lambda: _keys(good, "EndpointSlice") <= cluster.slice_keys(), "good slices")
        rendered = render_all(cluster)
        assert missing_services(rendered, mix.good) == []
        assert unsafe_lines(rendered) == []
        assert unnamed_rejections(live.sink.seen) == []
    finally:
        for obj in applied:
            if obj["kind"] != "Node":
                with contextlib.suppress(ApiError):
                    live.srv.delete(
                        str(obj["kind"]),
                        obj["metadata"]["name"],
                        namespace=obj["metadata"].get("namespace", "default"),
                    )
        live.srv.apply("Node", node_object())
        live.sink.seen.clear()
    _wait(lambda: not _keys(applied, "Service") & _programmed(live), "deletes")
    _wait(lambda: not _keys(applied, "EndpointSlice") & cluster.slice_keys(), "deletes")


def _programmed(live: Live) -> set[str]:
    """The Services a sync would program now (checks out, as the proxier would)."""
    state = live.source.cluster.checkout()
    return {sp.name.namespaced_name for graph in state.graphs.values() for sp in graph}


def _keys(objects: list[dict[str, Any]], kind: str) -> set[str]:
    return {
        f"{o['metadata'].get('namespace', 'default')}/{o['metadata']['name']}"
        for o in objects
        if o["kind"] == kind
    }
