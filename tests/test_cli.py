"""The command line as a user runs it: a real process, its exit code and its messages."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAB = ROOT / "testing" / "lab"


def kubeplex(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kubeplex.core.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_version() -> None:
    proc = kubeplex("version")
    assert proc.returncode == 0
    assert proc.stdout.startswith("kubeplex ")


def test_render_the_lab_without_root() -> None:
    proc = kubeplex(
        "render", "--config", str(LAB / "config.yaml"), "--manifests", str(LAB / "manifests")
    )
    assert proc.returncode == 0, proc.stderr
    assert "-j KUBE-SVC-LOLE4ISW44XBNF3G" in proc.stdout
    assert "# ip6tables-restore --noflush input (IPv6, full sync)" in proc.stdout


def test_bad_config_names_the_field(tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\n"
        "kind: KubeProxyConfiguration\n"
        "iptables:\n  minSyncPeriod: -1s\n"
    )
    proc = kubeplex("render", "--config", str(cfg), "--manifests", str(LAB / "manifests"))
    assert proc.returncode == 3
    assert "iptables.minSyncPeriod: must be >= 0, got -1s" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_unknown_mode_is_refused() -> None:
    proc = kubeplex(
        "render",
        "--config",
        str(LAB / "config.yaml"),
        "--proxy-mode",
        "userspace",
        "--manifests",
        str(LAB / "manifests"),
    )
    assert proc.returncode == 3
    assert 'unknown proxy mode "userspace"' in proc.stderr


def test_malformed_manifest_is_reported_and_the_rest_renders(tmp_path: Path) -> None:
    (tmp_path / "web.yaml").write_text((LAB / "manifests" / "web.yaml").read_text())
    (tmp_path / "bad.yaml").write_text(
        "apiVersion: v1\nkind: Service\nmetadata: {name: bad, namespace: default}\n"
        "spec: {clusterIP: 10.96.0.99, ports: [{port: 99999}]}\n"
    )
    proc = kubeplex("render", "--config", str(LAB / "config.yaml"), "--manifests", str(tmp_path))
    assert proc.returncode == 3
    assert "Service default/bad: spec.ports[0].port: must be between 1 and 65535" in proc.stderr
    assert str(tmp_path / "bad.yaml") in proc.stderr
    assert "KUBE-SVC-LOLE4ISW44XBNF3G" in proc.stdout


@pytest.mark.kernel
def test_run_once_programs_and_cleanup_removes(netns: str) -> None:
    args = ("--config", str(LAB / "config.yaml"), "--netns", netns)
    proc = kubeplex("run", *args, "--manifests", str(LAB / "manifests"), "--once")
    assert proc.returncode == 0, proc.stderr
    saved = subprocess.run(
        ["ip", "netns", "exec", netns, "iptables-save", "-t", "nat"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "-A KUBE-SVC-LOLE4ISW44XBNF3G" in saved
    assert (
        '-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES' in saved
    )

    assert kubeplex("cleanup", *args).returncode == 0
    saved = subprocess.run(
        ["ip", "netns", "exec", netns, "iptables-save"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "KUBE-SVC-" not in saved
    assert "KUBE-SERVICES" not in saved


def test_run_needs_a_source() -> None:
    proc = kubeplex("run", "--config", str(LAB / "config.yaml"), "--once")
    assert proc.returncode == 4
    assert "--manifests" in proc.stderr
