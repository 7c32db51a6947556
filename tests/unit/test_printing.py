"""What the commands print: text from outside escaped, the report's own lines kept."""

from __future__ import annotations

import pytest

from kubeplex.core.cli.options import EXIT_BACKEND, reporting_errors
from kubeplex.core.cli.printing import echo, escaped_fields, printable
from kubeplex.core.model.errors import KubeplexError

FORGED = "\x1b[31mred\x07\r\nkubeplex: forged"


def test_an_error_quoting_outside_text_is_printed_escaped(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Its own line breaks stay (a trust-list snippet to paste); the colour, bell and carriage
    # return a tool's output brought are escaped.
    def failing() -> int:
        raise KubeplexError(f"iptables-restore: {FORGED}")

    assert reporting_errors("kubeplex", failing) == EXIT_BACKEND
    assert capsys.readouterr().err == (
        "kubeplex: iptables-restore: \\x1b[31mred\\x07\\r\nkubeplex: forged\n"
    )


def test_a_report_keeps_its_lines_and_escapes_the_rest(capsys: pytest.CaptureFixture[str]) -> None:
    echo(f"== title\n  {FORGED}")
    assert capsys.readouterr().out == "== title\n  \\x1b[31mred\\x07\\r\nkubeplex: forged\n"
    assert printable("a\nb") == "a\nb"


def test_report_fields_are_escaped_whole() -> None:
    report = {"entries": [f"-A X {FORGED}"], "n": 1, "none": None}
    assert escaped_fields(report) == {
        "entries": ["-A X \\x1b[31mred\\x07\\r\\nkubeplex: forged"],
        "n": 1,
        "none": None,
    }
