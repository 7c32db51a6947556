"""The command line on a node: ``kubeplex run --once``, ``cleanup`` and ``render`` in a scratch
network namespace (tests/unit/test_cli.py runs the rest without root)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kits.cli_kit import LAB, RENDER_LAB, in_netns, kubeplex


@pytest.mark.kernel
def test_run_once_programs_and_cleanup_removes(netns: str) -> None:
    args = ("--config", str(LAB / "config.yaml"), "--netns", netns)
    proc = kubeplex("run", *args, "--manifests", str(LAB / "manifests"), "--once")
    assert proc.returncode == 0, proc.stderr
    saved = in_netns(netns, "iptables-save", "-t", "nat")
    assert "-A KUBE-SVC-LOLE4ISW44XBNF3G" in saved
    assert (
        '-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES' in saved
    )

    proc = kubeplex("cleanup", *args)
    assert proc.returncode == 0, proc.stderr
    removed = proc.stdout.splitlines()
    # Every mode says what it removed (one line per artifact) or that it had nothing.
    ours = [line for line in removed if line.startswith("iptables: removed ")]
    assert ours and all(
        line in ours or (": nothing to remove" in line and not line.startswith("iptables"))
        for line in removed
    ), removed
    assert any("KUBE-SVC-LOLE4ISW44XBNF3G" in line for line in removed)
    saved = in_netns(netns, "iptables-save")
    assert "KUBE-SVC-" not in saved
    assert "KUBE-SERVICES" not in saved
    proc = kubeplex("cleanup", *args)
    assert proc.returncode == 0
    assert "iptables: nothing to remove\n" in proc.stdout
    assert "removed" not in proc.stdout
    proc = kubeplex("cleanup", *args, "--mode", "iptables")
    assert (proc.returncode, proc.stdout) == (0, "iptables: nothing to remove\n")


@pytest.mark.kernel
def test_render_prints_what_the_next_apply_sends_to_this_node(netns: str) -> None:
    """With the node's kernel read, render holds what it has left over; without, the rules
    alone."""
    args = (*RENDER_LAB, "--netns", netns)
    run = ("run", *args[1:], "--once")
    assert kubeplex(*run).returncode == 0
    in_netns(netns, "iptables", "-t", "nat", "-N", "KUBE-SVC-LEFTOVER0000000")
    observed = kubeplex(*args)
    assert observed.returncode == 0, observed.stderr
    assert "-X KUBE-SVC-LEFTOVER0000000" in observed.stdout
    alone = kubeplex(*args, "--no-observe")
    assert "LEFTOVER" not in alone.stdout
    assert alone.stdout == kubeplex(*RENDER_LAB, "--no-observe").stdout


@pytest.mark.kernel
def test_run_names_the_fields_it_cannot_use(netns: str, tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text((LAB / "config.yaml").read_text() + "enableProfiling: true\n")
    args = ("--config", str(cfg), "--netns", netns, "--manifests", str(LAB / "manifests"))
    proc = kubeplex("run", *args, "--once")
    assert proc.returncode == 0, proc.stderr
    assert "configuration field enableProfiling is set but not used" in proc.stderr
    plain = kubeplex("run", "--config", str(LAB / "config.yaml"), *args[2:], "--once")
    assert "is set but not used" not in plain.stderr
