"""A plugin backend on a node: the example out-of-tree backend through ``kubeplex run --once``
and ``cleanup`` in a scratch network namespace (tests/unit/test_plugins.py covers the rest)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from kits.cli_kit import LAB
from kits.plugins_kit import RECORDING, kubeplex, own_trust_list, require_example, write_trust


@pytest.fixture(autouse=True)
def _own_trust_list(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from own_trust_list(monkeypatch)


@pytest.fixture
def example() -> None:
    require_example()


@pytest.mark.kernel
def test_run_and_cleanup_with_the_example_backend(
    tmp_path: Path, example: None, netns: str
) -> None:
    out = tmp_path / "rules"
    trust = write_trust(
        tmp_path / "p.toml", RECORDING, f'[backends.recording.options]\ndirectory = "{out}"\n'
    )
    common = ("--proxy-mode", "recording", "--netns", netns, "--plugins", str(trust))
    args = ("--config", str(LAB / "config.yaml"), "--hostname-override", "kind-worker")
    proc = kubeplex("run", *common, *args, "--manifests", str(LAB / "manifests"), "--once")
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(ln) for ln in (out / "kind-worker.jsonl").read_text().splitlines()]
    assert {ln.get("clusterIP") for ln in lines} >= {"10.96.88.59"}
    proc = kubeplex("cleanup", *common, *args)
    assert proc.returncode == 0, proc.stderr
    assert not (out / "kind-worker.jsonl").exists()
