"""Text from outside printed by the commands comes out escaped: a foreign rule's iptables
comment holding a colour and a bell, read back by ``kubeplex explain``,
neither drives the terminal nor forges a line."""

from __future__ import annotations

import json

import pytest
from kits.cli_kit import LAB, in_netns, kubeplex

pytestmark = pytest.mark.kernel

COMMENT = "evil\x1b[31mred\x07bell"
WEB_CHAIN = "KUBE-SVC-LOLE4ISW44XBNF3G"


def args(ns: str, *extra: str) -> tuple[str, ...]:
    config, manifests = str(LAB / "config.yaml"), str(LAB / "manifests")
    return ("--config", config, "--manifests", manifests, "--netns", ns, *extra)


def test_explain_escapes_a_foreign_rules_comment(netns: str) -> None:
    proc = kubeplex("run", *args(netns), "--once")
    assert proc.returncode == 0, proc.stderr
    # Someone else's rule into web's chain, first in KUBE-SERVICES, with its own comment.
    rule = ["-d", "10.96.88.59/32", "-p", "tcp", "--dport", "80", "-j", WEB_CHAIN]
    rule += ["-m", "comment", "--comment", COMMENT]
    in_netns(netns, "iptables", "-t", "nat", "-I", "KUBE-SERVICES", *rule)
    assert "evil\x1b[31mred\x07bell" in in_netns(netns, "iptables-save", "-t", "nat")

    text = kubeplex("explain", "default/web", *args(netns))
    assert [line for line in text.stdout.splitlines() if not line.isprintable()] == []
    assert '--comment "evil\\x1b[31mred\\x07bell"' in text.stdout

    doc = kubeplex("explain", "default/web", *args(netns, "-o", "json"))
    assert "\x1b" not in doc.stdout and "\x07" not in doc.stdout  # JSON's own escapes
    (report,) = json.loads(doc.stdout)["services"]
    entries = [e for f in report["frontends"] for e in f["entries"]] + report["other_entries"]
    assert [e for e in entries if COMMENT in e]  # the data as the kernel holds it
