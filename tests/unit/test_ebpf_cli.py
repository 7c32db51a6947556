"""The ebpf mode from the command line, as an operator meets it: ``kubeplex render`` prints
the map operations as a user without any privilege, and ``kubeplex backends`` names each
requirement of the mode the node lacks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from kits.cli_kit import RENDER_LAB, kubeplex
from kits.ebpf_kit import write_trust_list

#: Drops to nobody (setpriv, from util-linux), no capability kept.
AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root (to drop to an unprivileged user with setpriv)",
)
def test_render_prints_the_map_operations_as_a_user_without_privilege() -> None:
    command = [sys.executable, "-m", "kubeplex.core.cli.main", *RENDER_LAB]
    proc = subprocess.run(
        [*AS_NOBODY, *command, "--proxy-mode", "ebpf"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd="/",
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stdout.splitlines()
    web = next(line for line in lines if line.startswith("update kpx_svc4 10.96.88.59:80/tcp"))
    assert web.endswith("count 3")
    svc_id = web.split()[5]
    assert [line for line in lines if line.startswith(f"update kpx_backends svc {svc_id} ")] == [
        f"update kpx_backends svc {svc_id} slot {i} -> {ip}:8080"
        for i, ip in enumerate(["10.244.1.2", "10.244.2.2", "10.244.2.3"])
    ]
    # The NodePort on the Node's own address; nothing is deleted in a render from nothing.
    assert any(line.startswith("update kpx_svc4 172.18.0.5:30080/tcp") for line in lines)
    assert not any(line.startswith("delete kpx_") for line in lines)


def test_backends_names_each_missing_requirement_of_the_mode(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    gone = tmp_path / "gone"
    trust = write_trust_list(tmp_path / "plugins.toml", {"cgroup": str(gone), "bpffs": str(plain)})
    proc = kubeplex("backends", "--plugins", str(trust))
    assert proc.returncode == 0, proc.stderr
    assert "ebpf         requirements missing" in proc.stdout
    found = json.loads(kubeplex("backends", "--plugins", str(trust), "--json").stdout)
    (ebpf,) = [b for b in found["backends"] if b["mode"] == "ebpf"]
    assert ebpf["status"] == "requirements missing"
    detail = ebpf["detail"].split("; ")
    assert f"bpffs {plain} is not a bpffs mount" in detail
    assert any(d.startswith(f"cgroup2 {gone}") for d in detail), detail
    assert f"attaches to cgroup {gone}, pins under {plain / 'kubeplex'}" in ebpf["about"]


def test_backends_names_options_that_are_not_paths(tmp_path: Path) -> None:
    trust = write_trust_list(tmp_path / "plugins.toml", {"cgroup": "sys/fs/cgroup", "pins": "/x"})
    proc = kubeplex("backends", "--plugins", str(trust))
    assert "ebpf         broken" in proc.stdout
    assert "cgroup: must be an absolute path, not 'sys/fs/cgroup'" in proc.stdout
    assert "pins: unknown option" in proc.stdout
