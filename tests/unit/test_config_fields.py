"""Every KubeProxyConfiguration field is honoured or warned about, and the docs say which."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kubeplex.core.config import fields
from kubeplex.core.config.kubeproxy import (
    API_VERSION,
    KIND,
    KubeProxyConfiguration,
    default_config,
    parse_config,
)
from kubeplex.core.daemon import process

HEADER = f"apiVersion: {API_VERSION}\nkind: {KIND}\n"
CONFIGURATION_DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
OOM = Path("/proc/self/oom_score_adj")


def _cfg(body: str) -> KubeProxyConfiguration:
    return parse_config(HEADER + body, "config.yaml")


def _warned(body: str) -> list[str]:
    return [path for path, _ in fields.start_warnings(_cfg(body))]


def test_the_table_lists_every_field_of_the_schema() -> None:
    listed = {path for path in fields.FIELDS if not path.startswith("logging.")}
    assert listed == set(fields.schema_paths())


def test_every_entry_has_a_status_and_warned_ones_a_reason() -> None:
    for path, use in fields.FIELDS.items():
        assert use.status in (fields.HONOURED, fields.PARTLY, fields.WARNED), path
        assert use.does, path
        assert bool(use.why) == (use.status != fields.HONOURED), path


def test_the_defaults_warn_about_nothing() -> None:
    assert fields.start_warnings(default_config()) == []


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ("featureGates:\n  SomeGate: true\n", "featureGates"),
        ("clientConnection:\n  acceptContentTypes: application/json\n",
         "clientConnection.acceptContentTypes"),
        ("clientConnection:\n  contentType: application/yaml\n", "clientConnection.contentType"),
        ("logging:\n  options:\n    json:\n      infoBufferSize: 64Ki\n",
         "logging.options.json.infoBufferSize"),
        ("logging:\n  options:\n    text:\n      infoBufferSize: 512\n",
         "logging.options.text.infoBufferSize"),
        ("bindAddress: 10.0.0.1\n", "bindAddress"),
        ("enableProfiling: true\n", "enableProfiling"),
        ('showHiddenMetricsForVersion: "1.32"\n', "showHiddenMetricsForVersion"),
        ("portRange: 30000-32767\n", "portRange"),
        ("windowsRunAsService: true\n", "windowsRunAsService"),
        ("logging:\n  sanitization: true\n", "logging.sanitization"),
        ("logging:\n  options:\n    json:\n      colour: true\n", "logging.options.json.colour"),
    ],
)  # fmt: skip
def test_a_field_that_cannot_apply_warns_once_by_name(body: str, path: str) -> None:
    assert _warned(body) == [path]


@pytest.mark.parametrize(
    "body",
    [
        "clientConnection:\n  contentType: application/json\n",
        "clientConnection:\n  contentType: application/vnd.kubernetes.protobuf\n",
        "bindAddress: 0.0.0.0\n",
        "bindAddress: '::'\n",
        "enableProfiling: false\nfeatureGates: {}\n",
        "logging:\n  options:\n    json:\n      infoBufferSize: '0'\n      splitStream: true\n",
    ],
)
def test_default_or_harmless_values_do_not_warn(body: str) -> None:
    assert _warned(body) == []


def test_honoured_fields_set_to_other_values_do_not_warn() -> None:
    body = """\
hostnameOverride: node-a
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 0.0.0.0:10249
bindAddressHardFail: true
mode: nftables
clusterCIDR: 10.244.0.0/16
oomScoreAdj: -500
configSyncPeriod: 5m
logging:
  format: json
  verbosity: 4
  flushFrequency: 1s
  vmodule:
  - filePattern: proxier
    verbosity: 6
conntrack:
  maxPerCore: 0
  tcpBeLiberal: true
clientConnection:
  qps: 50
  burst: 100
"""
    assert _warned(body) == []


def test_the_configuration_doc_holds_the_table() -> None:
    text = CONFIGURATION_DOC.read_text(encoding="utf-8")
    start = text.index("\n## Configuration fields\n")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end >= 0 else len(text)]
    table = "".join(line + "\n" for line in section.splitlines() if line.startswith("|"))
    assert table == fields.markdown_table(), "the doc's table is stale: paste markdown_table()"


def test_warnings_are_logged_once_each(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    caplog.set_level(logging.WARNING, logger=process.__name__)
    oom = tmp_path / "oom_score_adj"
    oom.write_text("0\n")
    process.prepare_process(_cfg("enableProfiling: true\nportRange: 1-2\n"), oom)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert "enableProfiling is set but not used: it enables Go's pprof" in messages[0]
    assert "portRange" in messages[1]
    assert oom.read_text() == "-999\n"


def test_a_refused_oom_score_is_told_at_info(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    # As upstream (V(2)): the pod's own score, the kubelet's, still applies.
    caplog.set_level(logging.INFO, logger=process.__name__)
    process.prepare_process(default_config(), tmp_path / "missing" / "oom_score_adj")
    (record,) = caplog.records
    assert record.levelno == logging.INFO
    assert record.getMessage().startswith("oomScoreAdj -999: cannot write ")


@pytest.mark.parametrize("current", ["-999", "-1000"])
def test_a_score_as_protective_is_kept_without_a_word(
    caplog: pytest.LogCaptureFixture, tmp_path: Path, current: str
) -> None:
    caplog.set_level(logging.DEBUG, logger=process.__name__)
    oom = tmp_path / "oom_score_adj"
    oom.write_text(f"{current}\n")
    process.prepare_process(default_config(), oom)
    assert oom.read_text() == f"{current}\n"
    assert caplog.records == []


@pytest.mark.skipif(not OOM.exists(), reason="no /proc")
def test_oom_score_adj_lands_on_the_process() -> None:
    # In a child: the score is the process's own; raising it needs no privilege, nor does
    # lowering it again down to where it was.
    code = (
        "from pathlib import Path\n"
        "from kubeplex.core.daemon.process import apply_oom_score_adj\n"
        "Path('/proc/self/oom_score_adj').write_text('600')\n"
        "assert apply_oom_score_adj(517) is None\n"
        "print(Path('/proc/self/oom_score_adj').read_text().strip())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ
    )
    assert out.stdout.strip() == "517"


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None or not OOM.exists(),
    reason="needs root (to drop to an unprivileged user with setpriv) and /proc",
)
def test_the_kernel_refuses_a_lower_score_without_privilege() -> None:
    # Lowering the score needs CAP_SYS_RESOURCE: an unprivileged child gets the warning text.
    code = (
        "from kubeplex.core.daemon.process import apply_oom_score_adj\n"
        "print(apply_oom_score_adj(-500))\n"
    )
    drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    out = subprocess.run(
        [*drop, sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/"
    )
    assert out.stdout.strip() == (
        f"oomScoreAdj -500: cannot write {OOM} (the score stays 0): Permission denied"
    )


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None or not OOM.exists(),
    reason="needs root (to drop to an unprivileged user with setpriv) and /proc",
)
def test_an_unprivileged_process_keeps_the_lower_score_it_was_given() -> None:
    # The kubelet's way: the score is set before the process starts, without the privilege
    # to lower it further. A higher wanted score is not written (it would make the process
    # an earlier victim); a lower one is refused, and said at info only.
    code = (
        "from dataclasses import replace\n"
        "from kubeplex.core.cli import logs\n"
        "from kubeplex.core.config.kubeproxy import default_config\n"
        "from kubeplex.core.daemon.process import prepare_process\n"
        "open('/proc/self/oom_score_adj', 'w').write('300')  # as it was started\n"
        "logs.configure(None, None)\n"
        "for wanted in (400, -999):\n"
        "    prepare_process(replace(default_config(), oom_score_adj=wanted))\n"
        "print(open('/proc/self/oom_score_adj').read().strip())\n"
    )
    drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    out = subprocess.run(
        [*drop, sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/"
    )
    assert out.stdout.strip() == "300"
    assert out.stderr == ""  # nothing at the default verbosity
