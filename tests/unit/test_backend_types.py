"""The contract is generic over a plugin's own types (kernel seam, observation, settings,
plan): a plugin's type checker (mypy --strict here) holds its methods to them."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

api = pytest.importorskip("mypy.api")

ROOT = Path(__file__).resolve().parents[2]

PLUGIN = """
from dataclasses import dataclass

from kubeplex.core.dataplane.backend import Backend, FamilyBackend, Rendered, SyncResult
from kubeplex.core.model.graph import ChangeSet, ProxyState, ServiceGraph
from kubeplex.core.model.types import IPFamily


class Seam:
    def write(self, text: str) -> None: ...


@dataclass(frozen=True)
class Seen:
    chains: frozenset[str]


@dataclass
class Renderer:
    settings: str
    force_full: bool = True

    def invalidate(self) -> None:
        self.force_full = True


class Text(Rendered):
    def __init__(self, plans: list[int]) -> None:
        self.plans = plans

    def __str__(self) -> str:
        return str(self.plans)


class Whole(Backend[Seam, Seen]):
    def observe(self, state: ProxyState) -> Seen:
        return Seen(frozenset())

    def render(self, state: ProxyState, observed: Seen | None = None) -> Text:
        return Text([len(observed.chains) if observed else 0])

    def apply(self, rendered: Rendered) -> SyncResult:
        self.kernel.write(str(rendered))
        return SyncResult(full=True)


class PerFamily(FamilyBackend[Renderer, Text, Seam, Seen, str, int]):
    def make_renderer(self, settings: str) -> Renderer:
        return Renderer(settings)

    def family_settings(self, family: IPFamily, state: ProxyState, observed: Seen | None) -> str:
        return family.value

    def render_family(
        self, renderer: Renderer, graph: ServiceGraph, changes: ChangeSet, observed: Seen | None
    ) -> int:
        return len(graph.services)

    def combine(self, plans: list[int]) -> Text:
        return Text(plans)

    def apply(self, rendered: Rendered) -> SyncResult:
        self.kernel.write(str(rendered))
        return SyncResult(full=True)
"""

MISTAKES = """

class Wrong(Backend[Seam, Seen]):
    def observe(self, state: ProxyState) -> str:  # not its observation
        return ""

    def render(self, state: ProxyState, observed: Seen | None = None) -> Text:
        return Text([])

    def apply(self, rendered: Rendered) -> SyncResult:
        self.kernel.send(str(rendered))  # no such method on its seam
        return SyncResult(full=True)


class WrongPlans(PerFamily):
    def combine(self, plans: list[str]) -> Text:  # its plans are ints
        return Text([])
"""


def check(tmp_path: Path, source: str) -> list[str]:
    """mypy --strict's errors for ``source``, checked against the contract as installed
    (kubeplex.core through a tree named like the package, as scripts/typecheck.sh does)."""
    (tmp_path / "kubeplex").mkdir()
    (tmp_path / "kubeplex" / "core").symlink_to(ROOT / "core")
    (tmp_path / "plugin.py").write_text(textwrap.dedent(source))
    out, _, _ = api.run(
        [
            "--strict",
            "--follow-imports=silent",
            "--cache-dir", str(tmp_path / ".cache"),
            "--config-file", str(tmp_path / "none.ini"),
            str(tmp_path / "plugin.py"),
        ]
    )  # fmt: skip
    return [line.split(": error: ", 1)[1] for line in out.splitlines() if ": error: " in line]


@pytest.fixture(autouse=True)
def _no_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "none.ini").write_text("[mypy]\n")
    monkeypatch.setenv("MYPYPATH", str(tmp_path))
    monkeypatch.chdir(tmp_path)


def test_a_plugin_true_to_its_types_checks_clean(tmp_path: Path) -> None:
    assert check(tmp_path, PLUGIN) == []


def test_a_plugin_untrue_to_its_types_is_told_where(tmp_path: Path) -> None:
    errors = check(tmp_path, PLUGIN + MISTAKES)
    assert len(errors) == 4, errors
    assert errors[0].startswith('Return type "str" of "observe" incompatible')
    assert errors[1].startswith('"Seam" has no attribute "send"')
    # (once against PerFamily, once against FamilyBackend[..., int])
    assert all('of "combine" is incompatible' in e and '"list[int]"' in e for e in errors[2:])
