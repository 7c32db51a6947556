"""Manifests built to hurt: malformed structure, deep nesting, alias bombs, huge files. Each is
refused with one error naming the file (and the object and field, or the bound it breaks), the
other files load, and the source keeps following changes. The CLI exits 3 on them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kits.cli_kit import LAB, kubeplex
from kits.hostile_kit import HOSTILE, alias_bomb
from kits.manifests_kit import NODE, V4, service_yaml, services, spn, write

from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.sources import manifest_loader
from kubeplex.core.sources.manifests import ManifestSource


@pytest.fixture
def cluster() -> ClusterState:
    return ClusterState(NODE, families=(V4,))


@pytest.mark.parametrize(("name", "text", "says"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_hostile_file_is_one_error_and_the_rest_loads(
    tmp_path: Path, cluster: ClusterState, name: str, text: str, says: str
) -> None:
    write(tmp_path / "good.yaml", service_yaml("web", "10.96.0.10"))
    bad = write(tmp_path / name, text)
    source = ManifestSource(tmp_path, cluster)
    source.load()
    problems = [str(p) for p in source.problems] + [str(e) for e in cluster.invalid.values()]
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{bad}: ") and says in problems[0], problems
    assert len(problems[0]) < 300  # a line, not the expanded document
    assert spn("web") in services(cluster)


def test_an_alias_bomb_costs_nothing_after_the_first_read(
    tmp_path: Path, cluster: ClusterState, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path / "bomb.yaml", alias_bomb())
    web = write(tmp_path / "web.yaml", service_yaml("web", "10.96.0.10"))
    source = ManifestSource(tmp_path, cluster)
    source.load()
    read: list[str] = []
    real = manifest_loader.load_documents
    monkeypatch.setattr(
        manifest_loader,
        "load_documents",
        lambda path, *a, **k: read.append(path) or real(path, *a, **k),
    )
    for port in (81, 82, 83):
        write(web, service_yaml("web", "10.96.0.10", port=port))
        assert any([source.poll() for _ in range(3)])
    assert read == [str(web)] * 3  # the bomb was not parsed again
    assert services(cluster)[spn("web")] == 83
    assert [p.file for p in source.problems] == [str(tmp_path / "bomb.yaml")]


def test_few_aliases_are_fine(tmp_path: Path, cluster: ClusterState) -> None:
    write(
        tmp_path / "svc.yaml",
        "kind: List\nitems:\n"
        "- kind: Service\n  metadata: {name: a, namespace: &ns prod}\n"
        "  spec: {clusterIP: 10.96.0.1, ports: &ports [{name: http, port: 80}]}\n"
        "- kind: Service\n  metadata: {name: b, namespace: *ns}\n"
        "  spec: {clusterIP: 10.96.0.2, ports: *ports}\n",
    )
    source = ManifestSource(tmp_path, cluster)
    source.load()
    assert source.problems == []
    assert services(cluster) == {spn("a"): 80, spn("b"): 80}


def test_a_file_larger_than_the_bound_is_not_read(tmp_path: Path, cluster: ClusterState) -> None:
    write(tmp_path / "web.yaml", service_yaml("web", "10.96.0.10"))
    huge = tmp_path / "huge.yaml"
    with huge.open("wb") as f:  # sparse: the size says it all, nothing needs reading
        f.truncate(manifest_loader.MAX_FILE_BYTES + 1)
    source = ManifestSource(tmp_path, cluster)
    source.load()
    (problem,) = source.problems
    assert problem.file == str(huge)
    assert f"more than the {manifest_loader.MAX_FILE_BYTES // 2**20} MiB" in problem.message
    assert services(cluster) == {spn("web"): 80}


def test_a_list_with_odd_items(tmp_path: Path, cluster: ClusterState) -> None:
    file = write(
        tmp_path / "list.json",
        json.dumps(
            {
                "kind": "List",
                "items": [
                    5,
                    {"kind": "List", "items": [json.loads(json.dumps(svc_obj("inner")))]},
                    svc_obj("outer", "10.96.0.11"),
                ],
            }
        ),
    )
    source = ManifestSource(tmp_path, cluster)
    source.load()
    assert [str(p) for p in source.problems] == [
        f"{file}: document 1: items[0]: must be a mapping, got 5"
    ]
    assert services(cluster) == {spn("inner"): 80, spn("outer"): 80}


def svc_obj(name: str, ip: str = "10.96.0.10") -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": "prod"},
        "spec": {"clusterIP": ip, "ports": [{"name": "http", "port": 80}]},
    }


def test_a_hostile_file_does_not_stop_the_following(tmp_path: Path, cluster: ClusterState) -> None:
    """A crash in one file's objects used to stop every later change from being applied."""
    web = write(tmp_path / "web.yaml", service_yaml("web", "10.96.0.10"))
    write(tmp_path / "db.yaml", service_yaml("db", "10.96.0.20"))
    source = ManifestSource(tmp_path, cluster)
    source.load()
    for name, text, _ in HOSTILE:
        write(tmp_path / name, text)
    for _ in range(3):
        source.poll()
    assert services(cluster) == {spn("web"): 80, spn("db"): 80}
    (tmp_path / "db.yaml").unlink()  # a deletion goes through while the bad files stay
    write(web, service_yaml("web", "10.96.0.10", port=81))
    assert any([source.poll() for _ in range(3)])
    assert services(cluster) == {spn("web"): 81}


# --- the command line --------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "text", "says"), HOSTILE[:8], ids=[h[0] for h in HOSTILE[:8]])
def test_render_exits_3_naming_the_file(tmp_path: Path, name: str, text: str, says: str) -> None:
    (tmp_path / "web.yaml").write_text((LAB / "manifests" / "web.yaml").read_text())
    (tmp_path / name).write_text(text)
    proc = kubeplex("render", "--config", str(LAB / "config.yaml"), "--manifests", str(tmp_path))
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if str(tmp_path / name) in ln]
    assert says in line
    assert "KUBE-SVC-LOLE4ISW44XBNF3G" in proc.stdout  # the rest rendered


def test_an_unreadable_root_at_start_is_exit_3(tmp_path: Path) -> None:
    proc = kubeplex(
        "render", "--config", str(LAB / "config.yaml"), "--manifests", str(tmp_path / "gone")
    )
    assert proc.returncode == 3
    assert "Traceback" not in proc.stderr
    assert str(tmp_path / "gone") in proc.stderr
