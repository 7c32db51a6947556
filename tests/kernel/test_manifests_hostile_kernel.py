"""``kubeplex run --once`` on a folder of hostile manifests in a scratch network namespace: it
exits 3 naming each file and programs the rest (tests/unit/test_manifests_hostile.py loads them
without root)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kits.cli_kit import LAB, in_netns, kubeplex
from kits.hostile_kit import HOSTILE


@pytest.mark.kernel
def test_run_once_exits_3_naming_each_file_and_programs_the_rest(
    tmp_path: Path, netns: str
) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "web.yaml").write_text((LAB / "manifests" / "web.yaml").read_text())
    for name, text, _ in HOSTILE:
        (folder / name).write_text(text)
    args = ("--config", str(LAB / "config.yaml"), "--netns", netns, "--manifests", str(folder))
    proc = kubeplex("run", *args, "--once")
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr
    for name, _, says in HOSTILE:
        (line,) = [ln for ln in proc.stderr.splitlines() if str(folder / name) in ln]
        assert says in line
    assert "KUBE-SVC-LOLE4ISW44XBNF3G" in in_netns(netns, "iptables-save", "-t", "nat")
