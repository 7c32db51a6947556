"""ManifestSource: a folder of YAML/JSON manifests feeding ClusterState (pure, no root)."""

from __future__ import annotations

import json
from pathlib import Path
from textwrap import dedent
from typing import Any

import pytest
from kits.manifests_kit import NODE, V4, service_yaml, services, slice_yaml, spn, write

from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.errors import InvalidObject
from kubeplex.core.sources.manifests import ManifestSource, ManifestsUnavailable


def settled(source: ManifestSource) -> bool:
    """Poll until a change has settled (the source waits for a quiet folder); True if one
    was applied."""
    return any([source.poll() for _ in range(source.settle_polls + 1)])


class Sink:
    def __init__(self) -> None:
        self.messages: list[str] = []

    def __call__(self, err: InvalidObject, obj: Any) -> None:
        self.messages.append(str(err))


@pytest.fixture
def sink() -> Sink:
    return Sink()


@pytest.fixture
def cluster(sink: Sink) -> ClusterState:
    return ClusterState(NODE, families=(V4,), on_invalid=sink)


def test_multi_document_list_and_unknown_kinds(tmp_path: Path, cluster: ClusterState) -> None:
    write(
        tmp_path / "web.yaml",
        service_yaml("web", "10.96.0.10")
        + "---\n"
        + slice_yaml("web-1", "web", "10.244.1.2")
        + dedent("""\
        ---
        apiVersion: apps/v1
        kind: Deployment
        metadata: {name: web, namespace: prod}
        ---
        # an empty document
        """),
    )
    items = [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "db", "namespace": "prod"},
            "spec": {"clusterIP": "10.96.0.20", "ports": [{"name": "http", "port": 5432}]},
        },
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}},
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {"z": "1"}}},
    ]
    write(tmp_path / "more.json", json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    write(tmp_path / "notes.txt", service_yaml("ignored", "10.96.0.30"))
    sub = tmp_path / "sub"
    sub.mkdir()
    write(sub / "api.yml", service_yaml("api", "10.96.0.40"))

    source = ManifestSource(tmp_path, cluster)
    assert source.load()
    assert source.problems == []
    state = cluster.checkout()
    graph = state.graphs[V4]
    assert set(graph.services) == {spn("web"), spn("db"), spn("api")}
    assert [str(e) for e in graph.endpoints_of(spn("web"))] == ["10.244.1.2:8080"]
    assert graph.endpoints_of(spn("web"))[0].is_local
    assert cluster.node.labels == (("z", "1"),)
    assert state.is_full()  # the Node's labels arrived
    assert state.changes[V4].services == {spn("web"), spn("db"), spn("api")}


def test_single_file_path(tmp_path: Path, cluster: ClusterState) -> None:
    file = write(tmp_path / "web.yaml", service_yaml("web", "10.96.0.10"))
    ManifestSource(file, cluster).load()
    assert services(cluster) == {spn("web"): 80}


def test_missing_path(tmp_path: Path, cluster: ClusterState) -> None:
    with pytest.raises(ManifestsUnavailable, match="does not exist"):
        ManifestSource(tmp_path / "nope", cluster).load()


def test_malformed_object_reported_and_skipped(
    tmp_path: Path, cluster: ClusterState, sink: Sink
) -> None:
    file = write(
        tmp_path / "svc.yaml",
        service_yaml("web", "10.96.0.10")
        + "---\n"
        + service_yaml("evil", "10.0.0.1 -j ACCEPT")
        + "---\n"
        + service_yaml("db", "10.96.0.20"),
    )
    source = ManifestSource(tmp_path, cluster)
    source.load()
    assert sink.messages == [
        f"{file}: Service prod/evil: spec.clusterIP: must be a valid IP address, "
        'got "10.0.0.1 -j ACCEPT"'
    ]
    assert set(cluster.invalid) == {"Service prod/evil"}
    assert services(cluster) == {spn("web"): 80, spn("db"): 80}


def test_document_problems(tmp_path: Path, cluster: ClusterState) -> None:
    file = write(
        tmp_path / "odd.yaml",
        dedent("""\
        - just
        - a list
        ---
        kind: Service
        metadata: {namespace: prod}
        ---
        """)
        + service_yaml("web", "10.96.0.10"),
    )
    source = ManifestSource(tmp_path, cluster)
    source.load()
    assert [str(p) for p in source.problems] == [
        f"{file}: document 1: not a mapping",
        f"{file}: document 2: Service without metadata.name",
    ]
    assert services(cluster) == {spn("web"): 80}


def test_same_object_in_two_files_is_reported(tmp_path: Path, cluster: ClusterState) -> None:
    a = write(tmp_path / "a.yaml", service_yaml("web", "10.96.0.10"))
    b = write(tmp_path / "b.yaml", service_yaml("web", "10.96.0.10", port=81))
    source = ManifestSource(tmp_path, cluster)
    source.load()
    assert [str(p) for p in source.problems] == [f"{b}: Service prod/web also in {a}"]
    assert services(cluster) == {spn("web"): 81}  # the later file wins


def test_invalid_yaml_keeps_the_previous_objects_of_that_file(
    tmp_path: Path, cluster: ClusterState
) -> None:
    web = write(tmp_path / "web.yaml", service_yaml("web", "10.96.0.10"))
    write(tmp_path / "db.yaml", service_yaml("db", "10.96.0.20"))
    source = ManifestSource(tmp_path, cluster)
    source.load()
    cluster.checkout()

    write(web, "kind: Service\nmetadata: {name: web\n  oops: [\n")
    write(tmp_path / "db.yaml", service_yaml("db", "10.96.0.20", port=5432))
    assert settled(source)
    (problem,) = source.problems
    assert problem.file == str(web)
    assert problem.message.startswith("line ")
    assert "invalid YAML" in problem.message
    state = cluster.checkout()
    # web is kept as it was; db's change went through.
    assert state.changes[V4].services == {spn("db")}
    assert {n: p.port for n, p in state.graphs[V4].services.items()} == {
        spn("web"): 80,
        spn("db"): 5432,
    }

    # Fixed again: the problem is gone, and the unchanged object is no change.
    write(web, service_yaml("web", "10.96.0.10"))
    assert not settled(source)
    assert source.problems == []
    assert cluster.checkout().empty


def test_editing_a_file_feeds_only_the_difference(tmp_path: Path, cluster: ClusterState) -> None:
    file = write(
        tmp_path / "all.yaml",
        service_yaml("web", "10.96.0.10")
        + "---\n"
        + service_yaml("db", "10.96.0.20")
        + "---\n"
        + slice_yaml("web-1", "web", "10.244.1.2")
        + "---\n"
        + slice_yaml("db-1", "db", "10.244.1.3"),
    )
    source = ManifestSource(tmp_path, cluster)
    source.load()
    cluster.checkout()
    assert not settled(source)  # nothing changed on disk
    assert not cluster.changed.is_set()

    write(
        file,
        service_yaml("web", "10.96.0.10")
        + "---\n"
        + service_yaml("db", "10.96.0.20")
        + "---\n"
        + slice_yaml("web-1", "web", "10.244.1.9")
        + "---\n"
        + slice_yaml("db-1", "db", "10.244.1.3"),
    )
    assert settled(source)
    assert cluster.pending() == (0, 1)
    state = cluster.checkout()
    changes = state.changes[V4]
    assert not changes.full
    assert changes.services == {spn("web")}
    assert [str(e) for e in state.graphs[V4].endpoints_of(spn("web"))] == ["10.244.1.9:8080"]
    assert [str(e) for e in state.graphs[V4].endpoints_of(spn("db"))] == ["10.244.1.3:8080"]


def test_touching_a_file_without_changing_it_is_no_change(
    tmp_path: Path, cluster: ClusterState
) -> None:
    file = write(tmp_path / "web.yaml", service_yaml("web", "10.96.0.10"))
    source = ManifestSource(tmp_path, cluster)
    source.load()
    cluster.checkout()
    write(file, service_yaml("web", "10.96.0.10"))
    assert not settled(source)
    assert cluster.checkout().empty


def test_deleting_a_file_deletes_its_objects(tmp_path: Path, cluster: ClusterState) -> None:
    web = write(
        tmp_path / "web.yaml",
        service_yaml("web", "10.96.0.10") + "---\n" + slice_yaml("web-1", "web", "10.244.1.2"),
    )
    write(tmp_path / "db.yaml", service_yaml("db", "10.96.0.20"))
    source = ManifestSource(tmp_path, cluster)
    source.load()
    cluster.checkout()

    web.unlink()
    assert settled(source)
    state = cluster.checkout()
    assert state.changes[V4].services == {spn("web")}
    assert set(state.graphs[V4].services) == {spn("db")}
    assert state.graphs[V4].endpoints == {}
    assert cluster.slice_keys() == set()


def test_removing_an_object_from_a_file_deletes_it(tmp_path: Path, cluster: ClusterState) -> None:
    file = write(
        tmp_path / "all.yaml",
        service_yaml("web", "10.96.0.10") + "---\n" + service_yaml("db", "10.96.0.20"),
    )
    source = ManifestSource(tmp_path, cluster)
    source.load()
    cluster.checkout()
    write(file, service_yaml("db", "10.96.0.20"))
    assert settled(source)
    state = cluster.checkout()
    assert state.changes[V4].services == {spn("web")}
    assert set(state.graphs[V4].services) == {spn("db")}


def test_a_fixed_object_replaces_the_last_valid_version(
    tmp_path: Path, cluster: ClusterState, sink: Sink
) -> None:
    file = write(tmp_path / "web.yaml", service_yaml("web", "10.96.0.10"))
    source = ManifestSource(tmp_path, cluster)
    source.load()
    cluster.checkout()

    write(file, service_yaml("web", "10.96.0.10", port=70000))
    settled(source)
    assert sink.messages == [
        f"{file}: Service prod/web: spec.ports[0].port: must be between 1 and 65535, got 70000"
    ]
    state = cluster.checkout()
    assert state.empty
    assert state.graphs[V4].services[spn("web")].port == 80  # the last valid version

    write(file, service_yaml("web", "10.96.0.10", port=8000))
    settled(source)
    assert cluster.invalid == {}
    assert services(cluster) == {spn("web"): 8000}


def service_cidr_yaml(name: str, *cidrs: str) -> str:
    return dedent(f"""\
        apiVersion: networking.k8s.io/v1
        kind: ServiceCIDR
        metadata: {{name: {name}}}
        spec:
          cidrs: [{", ".join(cidrs)}]
        """)


def test_service_cidrs_are_loaded_changed_and_deleted(
    tmp_path: Path, cluster: ClusterState, sink: Sink
) -> None:
    file = write(tmp_path / "cidrs.yaml", service_cidr_yaml("kubernetes", "10.96.0.0/16"))
    items = [
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "ServiceCIDR",
            "metadata": {"name": "extra"},
            "spec": {"cidrs": ["fd00:10:96::/112"]},
        }
    ]
    write(tmp_path / "list.json", json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    write(tmp_path / "web.yaml", service_yaml("web", "10.96.0.10"))
    source = ManifestSource(tmp_path, cluster)
    assert source.load() and source.problems == []
    state = cluster.checkout()
    assert state.service_cidrs == ("10.96.0.0/16", "fd00:10:96::/112")
    assert set(state.graphs[V4].services) == {spn("web")}

    # Cluster-scoped: a namespace in the manifest does not make it another object.
    write(
        file,
        service_cidr_yaml("kubernetes", "10.96.0.0/12").replace(
            "{name: kubernetes}", "{name: kubernetes, namespace: prod}"
        ),
    )
    assert settled(source)
    state = cluster.checkout()
    assert state.is_full()
    assert state.service_cidrs == ("10.96.0.0/12", "fd00:10:96::/112")

    write(file, service_cidr_yaml("kubernetes", "10.96.0.0/12", "10.97.0.0/16"))
    settled(source)
    assert sink.messages == [
        f"{file}: ServiceCIDR kubernetes: spec.cidrs: may hold at most one CIDR per IP family,"
        " got two IPv4 CIDRs"
    ]
    assert cluster.checkout().service_cidrs == ("10.96.0.0/12", "fd00:10:96::/112")

    (tmp_path / "list.json").unlink()
    file.unlink()
    assert settled(source)
    assert cluster.invalid == {}
    state = cluster.checkout()
    assert state.is_full() and state.service_cidrs == ()
    assert set(state.graphs[V4].services) == {spn("web")}
