"""The commands' log set-up: text or component-base JSON lines, klog's verbosity, vmodule."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
from kits.logs_kit import root_logger_kept

from kubeplex.core.cli import logs
from kubeplex.core.config.kubeproxy import KubeProxyConfiguration, parse_config

log = logging.getLogger("kubeplex.core.daemon.proxier")


@pytest.fixture(autouse=True)
def _restore_root() -> Iterator[None]:
    with root_logger_kept():
        yield


def _cfg(logging_section: str) -> KubeProxyConfiguration:
    text = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
    return parse_config(text + logging_section, "config.yaml")


def _json_lines(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines()]


def test_text_by_default_shows_warnings_not_info(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure(None, None)
    log.info("hidden")
    log.warning("shown %d", 1)
    err = capsys.readouterr().err
    assert "hidden" not in err
    assert "WARNING kubeplex.core.daemon.proxier: shown 1" in err


def test_json_lines_carry_ts_v_msg_and_key_values(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure(_cfg("logging:\n  format: json\n  verbosity: 4\n"), None)
    log.info("synced %s", "rules", extra={"services": 3, "mode": "iptables"})
    log.debug("detail")
    log.warning("careful")
    entries = _json_lines(capsys.readouterr().err)
    assert [e["msg"] for e in entries] == ["synced rules", "detail", "careful"]
    assert [e["v"] for e in entries] == [1, 4, 0]
    first = entries[0]
    assert list(first)[:4] == ["ts", "caller", "msg", "v"]
    assert first["services"] == 3 and first["mode"] == "iptables"
    assert isinstance(first["ts"], float) and first["ts"] > 1e12  # milliseconds
    assert str(first["caller"]).startswith("unit/test_logs.py:")


def test_json_errors_have_err_and_no_v(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure(_cfg("logging:\n  format: json\n"), None)
    try:
        raise OSError("no such table")
    except OSError:
        log.exception("sync failed")
    log.error("plain error")
    failed, plain = _json_lines(capsys.readouterr().err)
    assert failed["msg"] == "sync failed" and failed["err"] == "no such table"
    assert "v" not in failed
    assert "err" not in plain and "v" not in plain


def test_key_values_never_replace_the_entry_keys(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure(_cfg("logging:\n  format: json\n"), None)
    log.warning("real", extra={"v": 9, "err": "fake", "node": "a"})
    (entry,) = _json_lines(capsys.readouterr().err)
    assert entry["v"] == 0 and "err" not in entry and entry["node"] == "a"


def test_flag_verbosity_wins_over_the_file(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure(_cfg("logging:\n  verbosity: 0\n"), 2)
    log.info("info at v1")
    log.debug("debug at v4")
    err = capsys.readouterr().err
    assert "info at v1" in err and "debug at v4" not in err


def test_logging_verbosity_from_the_file(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure(_cfg("logging:\n  verbosity: 5\n"), None)
    log.log(5, "below debug")
    assert "below debug" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("verbosity", "level"),
    [(0, logs.NOTICE), (1, logging.INFO), (3, logging.INFO), (4, logging.DEBUG), (7, 1)],
)
def test_verbosity_levels(verbosity: int, level: int) -> None:
    assert logs.level_for(verbosity) == level
    assert logs.verbosity_of(level) <= verbosity


def test_vmodule_raises_one_file(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure(_cfg("logging:\n  vmodule:\n  - filePattern: test_l*\n    verbosity: 4\n"), None)
    log.debug("from this file")
    other = logging.LogRecord("kubeplex.x", logging.DEBUG, "/src/other.py", 1, "other", (), None)
    logging.getLogger("kubeplex.x").handle(other)
    err = capsys.readouterr().err
    assert "from this file" in err and "other" not in err


def test_split_stream_sends_errors_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    section = "logging:\n  format: json\n  options:\n    json:\n      splitStream: true\n"
    logs.configure(_cfg(section), None)
    log.warning("to stdout")
    log.error("to stderr")
    out, err = capsys.readouterr()
    assert [e["msg"] for e in _json_lines(out)] == ["to stdout"]
    assert [e["msg"] for e in _json_lines(err)] == ["to stderr"]


def test_configure_again_replaces_its_handlers(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure(None, 0)
    logs.configure(_cfg("logging:\n  format: json\n"), 0)
    log.warning("once")
    (entry,) = _json_lines(capsys.readouterr().err)
    assert entry["msg"] == "once"


def test_json_lines_are_compact_like_zap(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure(_cfg("logging:\n  format: json\n"), None)
    log.warning("a b", extra={"k": "v"})
    line = capsys.readouterr().err
    assert line.endswith('"msg":"a b","v":0,"k":"v"}\n') and ", " not in line


#: What a hostile server's message or a kernel tool's output may hold: a colour, a bell, a
#: carriage return and a newline that starts a forged record.
FORGED = "\x1b[31mred\x07\r\n2030-01-01 00:00:00,000 ERROR kubeplex: forged"
FORGED_ESCAPED = "\\x1b[31mred\\x07\\r\\n2030-01-01 00:00:00,000 ERROR kubeplex: forged"


def _one_clean_line(text: str) -> str:
    (line,) = text.splitlines()
    assert line.isprintable(), line
    return line


def test_text_lines_escape_what_the_arguments_bring(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure(None, None)
    log.warning("watch broke (%s): relisting", f"HTTP 403 Forbidden: {FORGED}")
    line = _one_clean_line(capsys.readouterr().err)
    assert line.endswith(f"watch broke (HTTP 403 Forbidden: {FORGED_ESCAPED}): relisting")


def test_json_lines_escape_message_values_and_error(capsys: pytest.CaptureFixture[str]) -> None:
    # JSON escapes C0 controls itself; C1 (CSI) and bidi controls it writes raw.
    logs.configure(_cfg("logging:\n  format: json\n"), None)
    try:
        raise OSError(f"\x9b31m{FORGED}")
    except OSError:
        log.exception("sync of %s failed", "\u202eweb", extra={"object": "\x9bweb\u2028"})
    line = _one_clean_line(capsys.readouterr().err)
    entry = json.loads(line)
    assert entry["msg"] == "sync of \\u202eweb failed"
    assert entry["err"] == f"\\x9b31m{FORGED_ESCAPED}"
    assert entry["object"] == "\\x9bweb\\u2028"


def test_a_traceback_keeps_its_lines_and_escapes_the_messages(
    capsys: pytest.CaptureFixture[str],
) -> None:
    logs.configure(None, None)
    try:
        try:
            raise ValueError(FORGED)
        except ValueError as err:
            raise RuntimeError(f"sync: {FORGED}") from err
    except RuntimeError:
        log.exception("backend crashed")
    lines = capsys.readouterr().err.splitlines()
    assert [line for line in lines if not line.isprintable()] == []
    assert not [line for line in lines if line.startswith("2030-")]
    assert f"ValueError: {FORGED_ESCAPED}" in lines
    assert f"RuntimeError: sync: {FORGED_ESCAPED}" in lines
    assert lines.count("Traceback (most recent call last):") == 2
    assert "The above exception was the direct cause of the following exception:" in lines
    assert lines[0].endswith("ERROR kubeplex.core.daemon.proxier: backend crashed")


def test_notice_is_an_info_line_shown_at_verbosity_0(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure(None, None)
    log.log(logs.NOTICE, "running in mode %s", "iptables")
    log.info("hidden")
    line = _one_clean_line(capsys.readouterr().err)
    assert line.endswith(" INFO kubeplex.core.daemon.proxier: running in mode iptables")
    logs.configure(_cfg("logging:\n  format: json\n"), None)
    log.log(logs.NOTICE, "running")
    assert json.loads(capsys.readouterr().err)["v"] == 0
