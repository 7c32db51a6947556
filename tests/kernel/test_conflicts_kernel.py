"""A manifests folder handing web's ClusterIP to a newcomer: traffic to the address still
reaches web's endpoints only, until web is gone (namespace lab, both Linux modes)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kits.dataplane_kit import shared_dataplane

from kubeplex.core.sources.manifests import ManifestSource
from kubeplex.testing.dataplane import DataplaneCluster, endpoint_slice, service
from kubeplex.testing.netlab import CLIENT_POD, WEB_A, WEB_B, WEB_C, tally

pytestmark = pytest.mark.kernel

WEB_VIP = "10.96.88.59"
REQUESTS = 40


@pytest.fixture(scope="module", params=["iptables", "nftables"])
def shared(request: pytest.FixtureRequest) -> Iterator[DataplaneCluster]:
    yield from shared_dataplane(request.param)


def manifest(
    dp: DataplaneCluster, name: str, *pods: str, created: str | None = None
) -> list[dict[str, Any]]:
    svc = service(name, WEB_VIP, 80, target_port=8080)
    if created is not None:
        svc["metadata"]["creationTimestamp"] = created
    return [svc, endpoint_slice(name, dp.endpoints(*pods), port=8080)]


def write(path: Path, objs: list[dict[str, Any]]) -> None:
    path.write_text(yaml.safe_dump_all(objs))


class Nodes:
    """A manifest source per lab node, as `kubeplex run --manifests` has on each."""

    def __init__(self, dp: DataplaneCluster, folder: Path) -> None:
        self.dp = dp
        self.sources = [ManifestSource(folder, a.state) for a in dp.agents.values()]

    def load_and_sync(self) -> None:
        for source in self.sources:
            source.load()
        self.dp.sync_or_raise()

    def who_answers(self) -> set[str]:
        results = self.dp.lab.http(CLIENT_POD, WEB_VIP, 80, count=REQUESTS)
        assert all(r.ok for r in results), [r for r in results if not r.ok][:3]
        return set(tally(results))


def test_a_newcomer_with_webs_cluster_ip_gets_none_of_its_traffic(
    dp: DataplaneCluster, tmp_path: Path
) -> None:
    nodes = Nodes(dp, tmp_path)
    write(tmp_path / "web.yaml", manifest(dp, "web", WEB_A, WEB_B))
    nodes.load_and_sync()
    assert nodes.who_answers() == {WEB_A, WEB_B}

    # named to be read first; its Service sorts before web's too
    write(tmp_path / "another.yaml", manifest(dp, "another", WEB_C))
    nodes.load_and_sync()
    assert nodes.who_answers() == {WEB_A, WEB_B}
    for agent in dp.agents.values():
        err = agent.state.invalid["Service default/another"]
        assert "Service default/web" in str(err) and "spec.clusterIP" in str(err)

    (tmp_path / "web.yaml").unlink()
    nodes.load_and_sync()
    assert nodes.who_answers() == {WEB_C}
    assert all(not a.state.invalid for a in dp.agents.values())


def test_after_a_restart_the_older_by_creation_timestamp_keeps_the_address(
    dp: DataplaneCluster, tmp_path: Path
) -> None:
    write(tmp_path / "web.yaml", manifest(dp, "web", WEB_A, created="2024-01-01T00:00:00Z"))
    write(tmp_path / "another.yaml", manifest(dp, "another", WEB_C, created="2025-01-01T00:00:00Z"))
    nodes = Nodes(dp, tmp_path)  # fresh agents read both at once, the newcomer's file first
    nodes.load_and_sync()
    assert nodes.who_answers() == {WEB_A}
