"""What a running daemon says at the default verbosity: its mode, its source and its first
sync (upstream logs its mode and its start at v0), and no warning where nothing is wrong."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from kits.cli_kit import kubeplex, wait_until

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "testing" / "lab"

pytestmark = pytest.mark.kernel


def test_the_daemon_tells_its_mode_source_and_first_sync(tmp_path: Path, netns: str) -> None:
    cfg = yaml.safe_load((LAB / "config.yaml").read_text())
    cfg["healthzBindAddress"] = "127.0.0.1:10256"  # inside the namespace
    cfg["metricsBindAddress"] = "127.0.0.1:10249"
    # nf_conntrack_max can be set only in the initial namespace: left as it is.
    cfg["conntrack"] = {"maxPerCore": 0}
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    manifests = LAB / "manifests"
    argv = [sys.executable, "-m", "kubeplex.core.cli.main", "run", "--config", str(config)]
    argv += ["--manifests", str(manifests), "--netns", netns]
    log = tmp_path / "daemon.log"
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: "first sync done" in log.read_text(), "the first sync's line")
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        kubeplex("cleanup", "--config", str(config), "--netns", netns)
    lines = log.read_text().splitlines()
    assert len(lines) == 2, "\n".join(lines)
    started, synced = lines
    assert (
        f" INFO kubeplex: running in mode iptables on node kind-worker, from manifests {manifests}"
        in started
    )
    assert " INFO kubeplex: first sync done in " in synced
    assert synced.endswith(": service ports IPv4 2, IPv6 0")
