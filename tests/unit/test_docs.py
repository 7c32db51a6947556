"""README stays short with the comparison on top; its figures and the modes stay in the docs."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

#: A third of README's length before the measurements moved to docs/benchmarks.md.
README_LIMIT = 15_800

#: A figure as the docs write one: 1.33, 10,000, or a range of two joined by an en dash.
FIGURE = re.compile(r"\d[\d,.]*\d(?:\u2013\d[\d,.]*\d)?|\d")


def _sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) of each ``## `` section, in order."""
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return list(zip(parts[1::2], parts[2::2], strict=True))


def _section(text: str, heading: str) -> str:
    return next(body for head, body in _sections(text) if head == heading)


def _modes() -> list[str]:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return sorted(pyproject["project"]["entry-points"]["kubeplex.backends"])


def _figures(text: str) -> set[str]:
    return {figure.rstrip(".,") for figure in FIGURE.findall(text)}


def test_readme_is_short() -> None:
    assert len(README.read_text(encoding="utf-8")) < README_LIMIT


def test_readme_opens_with_the_comparison_to_kube_proxy() -> None:
    heading, body = _sections(README.read_text(encoding="utf-8"))[0]
    assert "kube-proxy" in heading
    header = next(line for line in body.splitlines() if line.startswith("|"))
    assert header.count("kube-proxy") == 2 and header.count("kubeplex") == 2


def test_every_figure_of_the_comparison_is_in_the_record() -> None:
    body = _sections(README.read_text(encoding="utf-8"))[0][1]
    rows = [line.split("|")[2:-1] for line in body.splitlines() if line.startswith("| ")]
    cells = " ".join(cell for row in rows[1:] for cell in row)  # the header names no figure
    record = _figures((DOCS / "benchmarks.md").read_text(encoding="utf-8"))
    assert _figures(cells) <= record  # a footnote mark is no decimal digit


def test_every_mode_is_described_where_the_modes_are() -> None:
    readme_modes = _section(README.read_text(encoding="utf-8"), "Modes")
    architecture = (DOCS / "architecture.md").read_text(encoding="utf-8")
    writing = _section(architecture, "How each mode writes the kernel")
    for mode in _modes():
        assert f"| `{mode}`" in readme_modes, mode
        assert f"- **{mode}**" in writing, mode


def test_links_between_the_docs_resolve() -> None:
    for page in [README, *DOCS.glob("*.md")]:
        text = page.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
            assert (page.parent / target).exists(), f"{page.name}: {target}"
