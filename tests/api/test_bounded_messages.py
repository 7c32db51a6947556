"""User-controlled values in log lines, errors and Events are bounded: whatever an object holds
(a 10 MB name, a YAML alias bomb, a hundred thousand bad ports), one log line or Event message
stays a few KB and still names the object and the field."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from apiserver import KUBE_PROXY_PERMISSIONS, FakeApiServer

from kubeplex.core.config.kubeproxy import default_config
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.errors import FieldError, InvalidObject, clip, shown
from kubeplex.core.sources.event_recorder import EventRecorder
from kubeplex.core.sources.kubeclient import make_api_client
from kubeplex.core.sources.manifests import ManifestSource
from kubeplex.testing.dataplane import node_object, service

NODE = "node-a"
BIG = 10 * 1024 * 1024
#: What one log line or Event message may take, whatever the input.
LINE_LIMIT = 8 * 1024


def alias_bomb(levels: int = 6, width: int = 10) -> Any:
    """A YAML "billion laughs": small as loaded (shared lists), width**levels items printed."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        refs = ", ".join([f"*a{i - 1}"] * width)
        lines.append(f"a{i}: &a{i} [{refs}]")
    lines.append(f"bomb: *a{levels - 1}")
    return yaml.safe_load("\n".join(lines))["bomb"]


def long_lines(caplog: pytest.LogCaptureFixture) -> list[int]:
    return [len(r.getMessage()) for r in caplog.records if len(r.getMessage()) > LINE_LIMIT]


def hostile_services() -> Iterator[tuple[str, dict[str, Any], str]]:
    """(what, Service, the field its error must name)."""
    svc = service("web", "10.96.0.10")
    svc["metadata"]["namespace"] = "n" * BIG
    yield "10 MB namespace", svc, "metadata.namespace"
    svc = service("web", "10.96.0.10")
    svc["metadata"]["name"] = "w" * BIG
    yield "10 MB name", svc, "metadata.name"
    svc = service("web", "10.96.0.10")
    svc["spec"]["type"] = "\x1b[31m" + "T" * BIG
    yield "10 MB field value", svc, "spec.type"
    svc = service("web", "10.96.0.10")
    svc["metadata"]["namespace"] = alias_bomb()
    yield "alias bomb namespace", svc, "metadata.namespace"
    svc = service("web", "10.96.0.10")
    svc["spec"]["ports"] = [{"name": f"p{i}", "port": 99999} for i in range(20000)]
    yield "20,000 bad ports", svc, "spec.ports[0].port"


@pytest.mark.parametrize(
    "what,obj,field", list(hostile_services()), ids=[w for w, _, _ in hostile_services()]
)
def test_an_invalid_service_is_logged_and_reported_in_a_few_kb(
    caplog: pytest.LogCaptureFixture, what: str, obj: dict[str, Any], field: str
) -> None:
    reported: list[InvalidObject] = []
    cluster = ClusterState(NODE, on_invalid=lambda err, _: reported.append(err))
    with caplog.at_level(logging.ERROR):
        cluster.set_service(obj, origin="manifests/web.yaml")
    assert [r.levelno for r in caplog.records] == [logging.ERROR]
    line = caplog.records[0].getMessage()
    assert len(line) <= LINE_LIMIT, (what, len(line))
    assert "manifests/web.yaml: Service " in line and field in line
    (err,) = reported
    assert len(str(err)) <= LINE_LIMIT and field in err.details
    assert cluster.service_keys() == set()


def test_a_node_label_key_of_10_mb_is_bounded(caplog: pytest.LogCaptureFixture) -> None:
    node = node_object(NODE, "192.0.2.1", "10.244.0.0/24")
    node["metadata"]["labels"]["k" * BIG] = 7
    cluster = ClusterState(NODE)
    with caplog.at_level(logging.ERROR):
        cluster.set_node(node)
    assert len(caplog.records) == 1 and not long_lines(caplog)
    assert f"Node {NODE}: metadata.labels[kkk" in caplog.records[0].getMessage()
    assert "bytes)" in caplog.records[0].getMessage()  # says how much was left out


def test_shown_quotes_escapes_and_says_what_was_cut() -> None:
    assert shown("web") == '"web"'
    assert shown("a\nb") == '"a\\nb"'
    assert shown(3) == "3"
    text = shown("é" * 1000, limit=10)
    assert text == '"' + "é" * 10 + '"…(2000 bytes)'
    assert len(shown(alias_bomb())) < 300
    assert clip("x" * 10, 10) == "x" * 10
    assert clip("x" * 11, 10) == "x" * 10 + "…(11 bytes)"


def test_every_part_of_an_invalid_object_is_bounded() -> None:
    big = "p" * BIG
    errors = [FieldError(big, big) for _ in range(100)]
    err = InvalidObject(big, errors)
    assert len(str(err)) <= LINE_LIMIT
    assert str(err).startswith("p" * 100) and "; and 90 more" not in str(err)  # clipped whole
    few = InvalidObject("Service a/b", [FieldError(f"spec.ports[{i}]", "bad") for i in range(25)])
    assert str(few).endswith("spec.ports[9]: bad; and 15 more")
    assert len(few.errors) == 25  # every error is still there for code to look at


# ------------------------------------------------------------------------------ Events


@pytest.fixture
def recorder(tmp_path: Path) -> Iterator[tuple[FakeApiServer, EventRecorder]]:
    srv = FakeApiServer(authorizer=set(KUBE_PROXY_PERMISSIONS)).start()
    cfg = default_config()
    kubeconfig = srv.write_kubeconfig(tmp_path / "kubeconfig")
    cc = replace(cfg.client_connection, kubeconfig=str(kubeconfig))
    api = make_api_client(cc)
    events = EventRecorder(api, NODE)
    events.start()
    try:
        yield srv, events
    finally:
        events.stop()
        api.close()
        srv.stop()


def test_an_event_about_a_10_mb_name_stays_small(
    recorder: tuple[FakeApiServer, EventRecorder], caplog: pytest.LogCaptureFixture
) -> None:
    srv, events = recorder
    svc = service("x" * BIG, "10.96.0.10", 99999)
    svc["metadata"]["uid"] = "5b1f6f1e-0000-4000-8000-000000000001"
    cluster = ClusterState(NODE, on_invalid=events.invalid_object)
    with caplog.at_level(logging.WARNING):
        cluster.set_service(svc)
        assert events.flush(10)
    assert not long_lines(caplog)
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("event "))
    assert "on Service default/" in line and "spec.ports[0].port" in line
    assert "metadata.name" in line
    (ev,) = srv.list_objects("Event")
    assert len(ev["message"]) <= 1100 and "spec.ports[0].port" in ev["message"]
    ref = ev["involvedObject"]
    assert ref["kind"] == "Service" and ref["uid"] == svc["metadata"]["uid"]
    assert all(len(str(v)) <= 253 for v in ref.values())
    assert events.failed == 0


def test_a_failing_event_post_is_logged_bounded(
    recorder: tuple[FakeApiServer, EventRecorder], caplog: pytest.LogCaptureFixture
) -> None:
    srv, events = recorder
    srv.stop()  # nothing answers: the post fails, and says so in one bounded line
    events.request_timeout = (0.5, 0.5)
    with caplog.at_level(logging.WARNING):
        events.record(service("web", "10.96.0.10"), "Warning", "Test", "m" * BIG)
        assert events.flush(10)
    assert events.failed == 1
    assert not long_lines(caplog)


# ------------------------------------------------------------------------------ manifests


def test_manifest_problems_about_huge_names_are_bounded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    text = f"kind: Service\nmetadata: {{name: {'x' * BIG}}}\nspec: {{clusterIP: None}}\n"
    (tmp_path / "a.yaml").write_text(text)
    (tmp_path / "b.yaml").write_text(text)  # the same object twice: a problem naming it
    source = ManifestSource(tmp_path, ClusterState(NODE))
    with caplog.at_level(logging.ERROR):
        source.load()
    lines = [r.getMessage() for r in caplog.records]
    assert any("also in" in line for line in lines), lines[:3]
    assert not long_lines(caplog)
