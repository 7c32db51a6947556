"""ManifestSource against what happens to a folder in real life: permissions taken away, the
folder removed, files written in halves or truncated, a ConfigMap volume's ``..data`` swap.
Nothing that was loaded is deleted unless a file really says so, and every removal is logged
with the file it came from."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from kits.manifests_kit import NODE, V4, service_yaml, services, slice_yaml, spn, write
from kits.perm_kit import can_drop_dac, without_dac_override

from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.sources.manifests import ManifestSource

LOGGER = "kubeplex.core.sources.manifests"


@pytest.fixture
def cluster() -> ClusterState:
    return ClusterState(NODE, families=(V4,))


needs_dac = pytest.mark.skipif(
    not can_drop_dac(), reason="needs root with CAP_DAC_OVERRIDE to drop (so modes bind)"
)


def poll_quiet(source: ManifestSource, polls: int = 4) -> bool:
    """Poll as the daemon does while nothing else changes; True if any poll applied a change."""
    return any([source.poll() for _ in range(polls)])


def endpoints(cluster: ClusterState, name: str) -> list[str]:
    graph = cluster.checkout().graphs[V4]
    return [str(e) for e in graph.endpoints_of(spn(name))]


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "manifests"
    root.mkdir()
    yield root
    for path in (root, *root.rglob("*")):  # give back what a test took away, so it can go
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o755)


def web_and_db(root: Path) -> tuple[Path, Path]:
    web = write(
        root / "web.yaml",
        service_yaml("web", "10.96.0.10") + "---\n" + slice_yaml("web-1", "web", "10.244.1.2"),
    )
    sub = root / "db"
    sub.mkdir(exist_ok=True)
    db = write(sub / "db.yaml", service_yaml("db", "10.96.0.20"))
    return web, db


# --- unreadable and vanished ------------------------------------------------------------------


@needs_dac
def test_an_unreadable_folder_keeps_everything_and_says_so_once(
    folder: Path, cluster: ClusterState, caplog: pytest.LogCaptureFixture
) -> None:
    web_and_db(folder)
    source = ManifestSource(folder, cluster)
    source.load()
    cluster.checkout()
    caplog.set_level(logging.INFO, logger=LOGGER)

    folder.chmod(0o000)
    with without_dac_override():
        poll_quiet(source, 10)
    assert cluster.checkout().empty
    assert services(cluster) == {spn("web"): 80, spn("db"): 80}
    lines = [r.getMessage() for r in caplog.records if str(folder) in r.getMessage()]
    assert len(lines) == 1, lines  # once, not every poll
    assert "Permission denied" in lines[0] and "keeping" in lines[0]

    folder.chmod(0o755)
    write(folder / "web.yaml", service_yaml("web", "10.96.0.10", port=81))
    with without_dac_override():
        assert poll_quiet(source)
    assert services(cluster) == {spn("web"): 81, spn("db"): 80}


@needs_dac
def test_an_unreadable_subfolder_keeps_its_files_objects(
    folder: Path, cluster: ClusterState
) -> None:
    web, _ = web_and_db(folder)
    source = ManifestSource(folder, cluster)
    source.load()
    cluster.checkout()

    (folder / "db").chmod(0o000)
    write(web, service_yaml("web", "10.96.0.10", port=81))  # the rest is still followed
    with without_dac_override():
        assert poll_quiet(source)
    assert services(cluster) == {spn("web"): 81, spn("db"): 80}
    (problem,) = source.problems
    assert problem.file == str(folder / "db") and "Permission denied" in problem.message

    (folder / "db").chmod(0o755)
    with without_dac_override():
        poll_quiet(source)
    assert source.problems == []
    assert services(cluster) == {spn("web"): 81, spn("db"): 80}


@needs_dac
def test_an_unreadable_file_keeps_its_objects_until_readable_again(
    folder: Path, cluster: ClusterState
) -> None:
    web, _ = web_and_db(folder)
    source = ManifestSource(folder, cluster)
    source.load()
    cluster.checkout()

    write(web, service_yaml("web", "10.96.0.10", port=81))
    web.chmod(0o000)
    with without_dac_override():
        poll_quiet(source)
    assert services(cluster) == {spn("web"): 80, spn("db"): 80}
    (problem,) = source.problems
    assert problem.file == str(web) and "Permission denied" in problem.message

    web.chmod(0o644)  # the content did not change since: the mode change alone must be seen
    with without_dac_override():
        assert poll_quiet(source)
    assert source.problems == []
    assert services(cluster) == {spn("web"): 81, spn("db"): 80}


def test_a_removed_folder_keeps_the_last_state_and_says_so_once(
    folder: Path, cluster: ClusterState, caplog: pytest.LogCaptureFixture
) -> None:
    web_and_db(folder)
    source = ManifestSource(folder, cluster)
    source.load()
    cluster.checkout()
    caplog.set_level(logging.INFO, logger=LOGGER)
    saved = folder.with_name("saved")
    shutil.copytree(folder, saved)

    shutil.rmtree(folder)
    for _ in range(10):
        assert not source.poll()  # no exception, no change
    assert cluster.checkout().empty
    assert services(cluster) == {spn("web"): 80, spn("db"): 80}
    lines = [r for r in caplog.records if str(folder) in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert "keeping" in lines[0].getMessage()
    assert not any(r.exc_info for r in caplog.records)  # a plain line, no traceback

    saved.rename(folder)  # back, with one change
    write(folder / "db" / "db.yaml", service_yaml("db", "10.96.0.20", port=5432))
    assert poll_quiet(source)
    assert services(cluster) == {spn("web"): 80, spn("db"): 5432}


def test_a_folder_gone_at_the_first_load_is_an_error(tmp_path: Path, cluster: ClusterState) -> None:
    with pytest.raises(Exception, match=f"{tmp_path / 'nope'}.*does not exist"):
        ManifestSource(tmp_path / "nope", cluster).load()


# --- removals are logged ------------------------------------------------------------------------


def test_every_removal_is_logged_with_its_origin(
    folder: Path, cluster: ClusterState, caplog: pytest.LogCaptureFixture
) -> None:
    web, db = web_and_db(folder)
    cidr = write(
        folder / "cidr.yaml",
        "apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: {name: main}\n"
        "spec: {cidrs: [10.96.0.0/16]}\n",
    )
    node = write(folder / "node.yaml", "apiVersion: v1\nkind: Node\nmetadata: {name: node-a}\n")
    source = ManifestSource(folder, cluster)
    source.load()
    caplog.set_level(logging.INFO, logger=LOGGER)

    for file in (web, db, cidr, node):
        file.unlink()
    assert poll_quiet(source)
    removals = sorted(r.getMessage() for r in caplog.records if r.levelno == logging.INFO)
    assert removals == sorted(
        [
            f"removed Service prod/web (it was in {web})",
            f"removed EndpointSlice prod/web-1 (it was in {web})",
            f"removed Service prod/db (it was in {db})",
            f"removed ServiceCIDR main (it was in {cidr})",
            f"removed Node node-a (it was in {node}); its last labels and addresses stay in effect",
        ]
    )
    assert services(cluster) == {}


# --- debounce -----------------------------------------------------------------------------------


def test_a_file_written_in_two_halves_is_applied_whole(folder: Path, cluster: ClusterState) -> None:
    web, _ = web_and_db(folder)
    source = ManifestSource(folder, cluster)
    source.load()
    cluster.checkout()
    whole = service_yaml("web", "10.96.0.10") + "---\n" + slice_yaml("web-1", "web", "10.244.1.9")
    half = whole[: whole.index("---")]  # the Service, not yet its slice

    write(web, half)
    assert not source.poll()  # seen once: the writer may not be done
    write(web, whole)
    assert not source.poll()  # changed again: wait for quiet
    assert poll_quiet(source)
    # The slice was never taken away: only its endpoint changed.
    state = cluster.checkout()
    assert [str(e) for e in state.graphs[V4].endpoints_of(spn("web"))] == ["10.244.1.9:8080"]
    assert cluster.endpoint_events == 2  # the first load's slice, then the new version


def test_a_change_is_applied_once_the_folder_is_quiet(folder: Path, cluster: ClusterState) -> None:
    web, _ = web_and_db(folder)
    source = ManifestSource(folder, cluster, settle_polls=3)
    source.load()
    write(web, service_yaml("web", "10.96.0.10", port=81))
    assert [source.poll() for _ in range(4)] == [False, False, True, False]
    assert services(cluster)[spn("web")] == 81


def test_the_first_load_has_no_debounce(folder: Path, cluster: ClusterState) -> None:
    web_and_db(folder)
    assert ManifestSource(folder, cluster, settle_polls=5).load()
    assert services(cluster) == {spn("web"): 80, spn("db"): 80}


def test_a_truncated_file_keeps_its_objects_while_it_may_be_written(
    folder: Path, cluster: ClusterState, caplog: pytest.LogCaptureFixture
) -> None:
    web, _ = web_and_db(folder)
    source = ManifestSource(folder, cluster, settle_polls=2, empty_grace_polls=6)
    source.load()
    cluster.checkout()
    caplog.set_level(logging.INFO, logger=LOGGER)

    write(web, "")
    assert not poll_quiet(source, 4)  # quiet, but empty: a writer may be about to fill it
    assert cluster.checkout().empty
    held = [r.getMessage() for r in caplog.records if str(web) in r.getMessage()]
    assert len(held) == 1 and "empty" in held[0] and "keeping" in held[0]
    write(
        web, service_yaml("web", "10.96.0.10") + "---\n" + slice_yaml("web-1", "web", "10.244.1.2")
    )
    assert not poll_quiet(source)  # the same objects again: nothing changed at all
    assert cluster.checkout().empty
    assert endpoints(cluster, "web") == ["10.244.1.2:8080"]


def test_a_file_emptied_on_purpose_loses_its_objects_after_the_grace(
    folder: Path, cluster: ClusterState, caplog: pytest.LogCaptureFixture
) -> None:
    web, _ = web_and_db(folder)
    source = ManifestSource(folder, cluster, settle_polls=2, empty_grace_polls=6)
    source.load()
    cluster.checkout()
    caplog.set_level(logging.INFO, logger=LOGGER)

    write(web, "")
    results = [source.poll() for _ in range(8)]
    assert results.count(True) == 1 and not any(results[:5])
    assert services(cluster) == {spn("db"): 80}
    messages = [r.getMessage() for r in caplog.records]
    assert any(str(web) in m and "stayed empty" in m for m in messages), messages
    assert f"removed Service prod/web (it was in {web})" in messages


# --- a ConfigMap mounted as a volume --------------------------------------------------------------


def configmap_volume(root: Path, stamp: str, files: dict[str, str]) -> None:
    """kubelet's atomic writer: the data in a timestamped folder, ``..data`` pointing at it,
    and one symlink per key through ``..data``; an update swaps ``..data`` with a rename."""
    data = root / f"..{stamp}"
    data.mkdir()
    for name, text in files.items():
        write(data / name, text)
    tmp = root / "..data_tmp"
    tmp.symlink_to(data.name)
    tmp.rename(root / "..data")
    for name in files:
        link = root / name
        if not link.is_symlink():
            link.symlink_to(Path("..data") / name)


def test_a_configmap_volume_is_read_once_and_follows_the_data_swap(
    folder: Path, cluster: ClusterState
) -> None:
    configmap_volume(
        folder,
        "2026_01_01_00_00_00.123",
        {
            "web.yaml": service_yaml("web", "10.96.0.10"),
            "db.yaml": service_yaml("db", "10.96.0.20"),
        },
    )
    source = ManifestSource(folder, cluster)
    assert source.load()
    assert source.problems == []
    assert services(cluster) == {spn("web"): 80, spn("db"): 80}

    configmap_volume(
        folder,
        "2026_01_01_00_05_00.456",
        {
            "web.yaml": service_yaml("web", "10.96.0.10", port=81),
            "db.yaml": service_yaml("db", "10.96.0.20"),
        },
    )
    shutil.rmtree(folder / "..2026_01_01_00_00_00.123")
    assert poll_quiet(source)
    assert source.problems == []
    assert services(cluster) == {spn("web"): 81, spn("db"): 80}


def test_a_symlink_loop_is_walked_once(folder: Path, cluster: ClusterState) -> None:
    web_and_db(folder)
    os.symlink("..", folder / "db" / "loop")
    source = ManifestSource(folder, cluster)
    source.load()
    assert source.problems == []
    assert services(cluster) == {spn("web"): 80, spn("db"): 80}


def test_a_folder_that_never_goes_quiet_is_applied_after_the_longest_wait(
    folder: Path, cluster: ClusterState, caplog: pytest.LogCaptureFixture
) -> None:
    web, _ = web_and_db(folder)
    source = ManifestSource(folder, cluster, settle_polls=2, max_wait_polls=5)
    source.load()
    caplog.set_level(logging.WARNING, logger=LOGGER)
    applied = []
    for port in range(81, 93):  # a writer that rewrites the file before every poll
        write(web, service_yaml("web", "10.96.0.10", port=port))
        applied.append(source.poll())
    # Never two polls alike, so never quiet: still applied every fifth poll, as it was then.
    assert applied == [False, False, False, False, True] * 2 + [False, False]
    assert services(cluster)[spn("web")] == 90
    restless = [r for r in caplog.records if "has not been quiet" in r.getMessage()]
    assert len(restless) == 1  # said once while it keeps changing
