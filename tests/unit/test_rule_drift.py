"""Whole-chain comparison: ``drift.diff_rules`` by each mode's key of a rule, and how a
difference reads in ``compare``."""

from __future__ import annotations

from kubeplex.backends.iptables.rulekey import rule_key as iptables_key
from kubeplex.backends.nftables.listing import rule_key as nft_key
from kubeplex.core.dataplane.backend import RuleDrift
from kubeplex.core.dataplane.drift import diff_rules, summary

SVC = "KUBE-SVC-LOLE4ISW44XBNF3G"
RENDERED = [
    f'-A {SVC} -m comment --comment "default/web cluster IP" -m tcp -p tcp -d 10.96.88.59 '
    "--dport 80 ! -s 10.244.0.0/16 -j KUBE-MARK-MASQ",
    f'-A {SVC} -m comment --comment "default/web -> 10.244.1.2:8080" -m statistic --mode random '
    "--probability 0.5000000000 -j KUBE-SEP-PXJ2U7QYT2QW5545",
    f'-A {SVC} -m comment --comment "default/web -> 10.244.2.2:8080" -j KUBE-SEP-5Q3P56IRA2PP7VYF',
]
#: The same rules as iptables-save prints them.
SAVED = [
    f"-A {SVC} ! -s 10.244.0.0/16 -d 10.96.88.59/32 -p tcp -m comment --comment "
    '"default/web cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ',
    f'-A {SVC} -m comment --comment "default/web -> 10.244.1.2:8080" -m statistic --mode random '
    "--probability 0.50000000000 -j KUBE-SEP-PXJ2U7QYT2QW5545",
    f'-A {SVC} -m comment --comment "default/web -> 10.244.2.2:8080" -j KUBE-SEP-5Q3P56IRA2PP7VYF',
]


def test_the_same_rules_printed_by_the_tool_are_no_drift() -> None:
    assert diff_rules(SVC, RENDERED, SAVED, iptables_key) == []
    assert iptables_key("-A X -j MARK --or-mark 0x00004000") == iptables_key(
        "-A X -j MARK --set-xmark 0x4000/0x4000"
    )
    assert nft_key("mark set mark or 0x00004000") == nft_key("meta mark set meta mark | 0x00004000")
    assert nft_key("ip saddr != { 203.0.113.0/25 } drop") == nft_key(
        "ip saddr != 203.0.113.0/25 drop"
    )
    assert nft_key("numgen random mod 2 vmap { 0 : goto a , 1 : goto b }") == nft_key(
        "numgen random mod 2 vmap { 0 : goto a, 1 : goto b }"
    )


def test_an_inserted_rule_is_extra_and_a_moved_or_edited_one_changed() -> None:
    foreign = f"-A {SVC} -j RETURN"
    assert diff_rules(SVC, RENDERED, [foreign, *SAVED], iptables_key) == [
        RuleDrift(SVC, "extra", found=foreign)
    ]
    assert diff_rules(SVC, RENDERED, SAVED[:2], iptables_key) == [
        RuleDrift(SVC, "missing", expected=RENDERED[2])
    ]
    edited = SAVED[2].replace("5Q3P56IRA2PP7VYF", "FOREIGNFOREIGN00")
    assert diff_rules(SVC, RENDERED, [*SAVED[:2], edited], iptables_key) == [
        RuleDrift(SVC, "changed", found=edited, expected=RENDERED[2])
    ]
    # Order matters: the same rules in another order send traffic elsewhere.
    assert diff_rules(SVC, RENDERED, [SAVED[0], SAVED[2], SAVED[1]], iptables_key) != []
    assert diff_rules("c", ["drop"], ["drop", "accept"], nft_key) == [
        RuleDrift("c", "extra", found="accept")
    ]


def test_summary_counts_per_chain() -> None:
    drift = [RuleDrift("A", "extra", "x"), RuleDrift("A", "extra", "y"), RuleDrift("B", "missing")]
    assert summary(drift) == "A: 2 extra; B: 1 missing"
