"""The layering of the design: the core imports no backend, and no backend imports another."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIBRARIES = {"netfilter"}
BACKENDS = sorted(
    p.name
    for p in (ROOT / "backends").iterdir()
    if (p / "__init__.py").exists() and p.name not in LIBRARIES
)


def imported_modules(folder: Path) -> dict[str, set[str]]:
    """Every module each file imports, absolute names (relative imports resolved as kubeplex.*)."""
    found: dict[str, set[str]] = {}
    for file in sorted(folder.rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    names.add(f"<relative:{node.module}>")
                elif node.module:
                    names.update({node.module} | {f"{node.module}.{a.name}" for a in node.names})
        found[str(file.relative_to(ROOT))] = names
    return found


def test_there_are_backends_to_check() -> None:
    assert "iptables" in BACKENDS


def test_no_relative_imports_hide_a_dependency() -> None:
    for folder in ("core", "backends", "testing"):
        for file, names in imported_modules(ROOT / folder).items():
            assert not [n for n in names if n.startswith("<relative")], file


@pytest.mark.parametrize("folder", ["core", "testing"])
def test_core_and_the_test_kit_import_no_backend(folder: str) -> None:
    # Backends are reached only through their entry points (and the trust list); the
    # conformance kit in testing/ must work for any backend, built in or not.
    for file, names in imported_modules(ROOT / folder).items():
        bad = sorted(n for n in names if n.startswith("kubeplex.backends"))
        assert not bad, f"{file} imports {bad}"


def test_the_example_plugin_imports_no_builtin_backend() -> None:
    example = ROOT / "tests" / "plugins" / "kubeplex-example-backend"
    for file, names in imported_modules(example).items():
        bad = sorted(n for n in names if n.startswith("kubeplex.backends"))
        assert not bad, f"{file} imports {bad}"
        assert not [n for n in names if n.startswith("<relative")], file


@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_imports_no_other_backend(backend: str) -> None:
    others = [b for b in BACKENDS if b != backend]
    for file, names in imported_modules(ROOT / "backends" / backend).items():
        bad = sorted(
            n
            for n in names
            for o in others
            if n == f"kubeplex.backends.{o}" or n.startswith(f"kubeplex.backends.{o}.")
        )
        assert not bad, f"{file} imports {bad}"
