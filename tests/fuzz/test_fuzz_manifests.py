"""The manifests source under fuzzing: folders of valid, nearly valid and hostile objects in
every file form (multi-document YAML, kind: List, JSON), plus files no parser should choke on."""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path

import yaml
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
from hypothesis import strategies as st
from kube_strategies import (
    NODE,
    GoodService,
    Mix,
    good_services,
    hostile_files,
    manifest_text,
    mixes,
)

from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.sources.manifests import ManifestSource

#: More polls than any settling of the folder needs.
POLLS = 10


@st.composite
def folders(draw: st.DrawFn) -> tuple[Mix, list[tuple[str, bytes]]]:
    """A mix split over one to three files in random forms, plus hostile files."""
    mix = draw(mixes(max_good=3, max_broken=4))
    n = draw(st.integers(1, 3))
    cuts = sorted(draw(st.lists(st.integers(0, len(mix.order)), min_size=n - 1, max_size=n - 1)))
    bounds = [0, *cuts, len(mix.order)]
    files = []
    for a, b in itertools.pairwise(bounds):
        suffix, text = draw(manifest_text(mix.order[a:b]))
        files.append((suffix, text.encode()))
    files += draw(st.lists(hostile_files(), max_size=3))
    return mix, files


@scaled(0.4, deadline_ms=5000)
@given(folders(), good_services(50))
def test_a_folder_of_any_files_loads_and_keeps_following_changes(
    folder: tuple[Mix, list[tuple[str, bytes]]], later: GoodService
) -> None:
    """ManifestSource.load never raises; good Services are programmed safely; rejections and
    problems name the file (on one line); a good Service added afterwards is picked up by poll()."""
    mix, files = folder
    sink = Rejections()
    cluster = ClusterState(NODE, FAMILIES, on_invalid=sink)
    with tempfile.TemporaryDirectory(prefix="kubeplex-fuzz-") as tmp:
        root = Path(tmp)
        for i, (suffix, data) in enumerate(files):
            (root / f"f{i}{suffix}").write_bytes(data)
        source = ManifestSource(root, cluster)
        source.load()
        rendered = render_all(cluster)
        assert missing_services(rendered, mix.good) == []
        assert unsafe_lines(rendered) == []
        assert unnamed_rejections(sink.seen, origin=str(root)) == []
        unnamed = [p for p in source.problems if not p.file.startswith(str(root))]
        assert unnamed == []
        assert [str(p) for p in source.problems if "\n" in str(p) or "\r" in str(p)] == []

        (root / "later.yaml").write_text(yaml.safe_dump_all(later.objects))
        # poll() may wait for the folder to settle for a few polls; it must get there.
        assert any(source.poll() for _ in range(POLLS)), "poll() never applied the new file"
        assert missing_services(render_all(cluster), [*mix.good, later]) == []
