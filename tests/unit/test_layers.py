"""What of the layering import-linter cannot say (its contracts are in pyproject.toml)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("core", "backends", "testing", "tests/plugins/kubeplex-example-backend")
LIBRARIES = {"netfilter"}


def contracts() -> list[dict[str, Any]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    found: list[dict[str, Any]] = config["tool"]["importlinter"]["contracts"]
    return found


def test_no_relative_imports() -> None:
    # An absolute name says which layer a file reaches into, in the file itself.
    for folder in FOLDERS:
        for file in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(file.read_text(), str(file))
            relative = [
                n.lineno for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level
            ]
            assert not relative, f"{file.relative_to(ROOT)}: relative import on lines {relative}"


def test_every_mode_is_independent_of_the_others() -> None:
    # The exhaustive layers contract makes a new package under backends/ be listed; this makes
    # a listed mode also be kept apart from the others (a library goes under the modes).
    modes = sorted(
        p.name
        for p in (ROOT / "backends").iterdir()
        if (p / "__init__.py").exists() and p.name not in LIBRARIES
    )
    assert "iptables" in modes
    (independence,) = [c for c in contracts() if c["type"] == "independence"]
    assert sorted(m.removeprefix("kubeplex.backends.") for m in independence["modules"]) == modes
    (layers,) = [c for c in contracts() if c.get("containers") == ["kubeplex.backends"]]
    assert layers["layers"][-1] == "netfilter" and layers["exhaustive"]


def test_no_test_module_imports_another() -> None:
    # What tests share lives in tests/kits; a test module is run, never imported, so that
    # moving or splitting one breaks no other. Only tests/ is on pytest's path (kits.<name>).
    pytest_options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    assert pytest_options["ini_options"]["pythonpath"] == ["tests"]
    found = []
    for file in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            found += [
                f"{file.relative_to(ROOT)}:{node.lineno}: {name}"
                for name in names
                if any(part.startswith("test_") for part in name.split("."))
            ]
    assert found == []
