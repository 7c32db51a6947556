"""scripts/as-root, which README's two commands go through: root runs directly, others via sudo."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
AS_ROOT = ROOT / "scripts" / "as-root"


def _fake_bin(tmp_path: Path, uid: int, with_sudo: bool) -> str:
    """A PATH whose ``id`` says ``uid`` (and whose ``sudo``, if any, says what it was asked)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "id").write_text(f"#!/bin/sh\necho {uid}\n")
    if with_sudo:
        (bin_dir / "sudo").write_text('#!/bin/sh\necho "sudo $*"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return f"{bin_dir}:/usr/bin:/bin"


def _run(path: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(AS_ROOT), *argv], capture_output=True, text=True, env={"PATH": path}, check=False
    )


def test_root_runs_the_command_itself_without_sudo(tmp_path: Path) -> None:
    done = _run(_fake_bin(tmp_path, 0, with_sudo=False), "echo", "ran")
    assert (done.returncode, done.stdout) == (0, "ran\n")


def test_a_user_goes_through_sudo(tmp_path: Path) -> None:
    done = _run(_fake_bin(tmp_path, 1000, with_sudo=True), "echo", "ran")
    assert (done.returncode, done.stdout) == (0, "sudo -- echo ran\n")


def test_a_user_without_sudo_is_told_what_to_do(tmp_path: Path) -> None:
    done = _run(_fake_bin(tmp_path, 1000, with_sudo=False), "echo", "ran")
    assert done.returncode == 1 and done.stdout == ""
    assert "run it as root, or install sudo" in done.stderr


def test_readme_commands_need_no_sudo_and_ci_runs_the_test_command() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    top = readme[readme.index("## The two commands") : readme.index("## What the lab shows")]
    commands = re.findall(r"```sh\n(.*?)\n```", top, re.S)
    assert len(commands) == 2
    for command in commands:
        assert "sudo" not in command
        assert command.startswith("scripts/as-root bash scripts/setup.sh && scripts/as-root ")
    test_command = commands[1].rsplit("scripts/as-root ", 1)[1]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert test_command in ci.splitlines()
