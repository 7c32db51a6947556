"""The rollback of a half-applied sync, as restore text (pure; the kernel tests are in
test_iptables_batches.py)."""

from __future__ import annotations

import pytest

from kubeplex.backends.netfilter import iptables
from kubeplex.backends.netfilter.iptables import SavedRuleset
from kubeplex.backends.netfilter.rollback import Before, may_have_committed, rollback_inputs

BEFORE = """*nat
:PREROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-A - [0:0]
:KUBE-SEP-OLD - [0:0]
:KUBE-SVC-SAME - [0:0]
-A PREROUTING -j KUBE-SERVICES
-A KUBE-SERVICES -d 10.96.0.1/32 -j KUBE-SVC-A
-A KUBE-SVC-A -j KUBE-SEP-OLD
-A KUBE-SEP-OLD -p tcp -j DNAT --to-destination 10.0.0.1:80
-A KUBE-SVC-SAME -j RETURN
COMMIT
"""

#: After the sync's inputs 1 (service chains) and 2 (fixed chains, deletions) committed.
NOW = """*nat
:PREROUTING ACCEPT [0:0]
:KUBE-NEW - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-A - [0:0]
:KUBE-SEP-NEW - [0:0]
:KUBE-SVC-SAME - [0:0]
-A PREROUTING -j KUBE-SERVICES
-A PREROUTING -j KUBE-NEW
-A KUBE-SERVICES -d 10.96.0.1/32 -j KUBE-SVC-A
-A KUBE-SVC-A -j KUBE-SEP-NEW
-A KUBE-SEP-NEW -p tcp -j DNAT --to-destination 10.0.0.2:80
-A KUBE-SVC-SAME -j RETURN
COMMIT
"""

ATTEMPTED = [
    "*nat\n:KUBE-SVC-A - [0:0]\n:KUBE-SEP-NEW - [0:0]\n:KUBE-SVC-SAME - [0:0]\n...\nCOMMIT\n",
    "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-NEW - [0:0]\n:KUBE-SEP-OLD - [0:0]\n"
    "-I PREROUTING 1 -j KUBE-NEW\n...\n-X KUBE-SEP-OLD\nCOMMIT\n",
]


def test_rollback_restores_changed_chains_and_removes_what_the_sync_made() -> None:
    inputs = rollback_inputs(
        Before(saved=SavedRuleset.parse(BEFORE)), ATTEMPTED, SavedRuleset.parse(NOW)
    )
    assert inputs == [
        # The deleted chain first, so the old rules that jump to it can be written.
        "*nat\n:KUBE-SEP-OLD - [0:0]\nCOMMIT\n",
        # Only what differs: KUBE-SERVICES and KUBE-SVC-SAME hold their old rules already.
        "*nat\n:KUBE-SVC-A - [0:0]\n-A KUBE-SVC-A -j KUBE-SEP-OLD\n:KUBE-SEP-OLD - [0:0]\n"
        "-A KUBE-SEP-OLD -p tcp -j DNAT --to-destination 10.0.0.1:80\nCOMMIT\n",
        # The jump the sync inserted, then the chains it created (flushed, deleted).
        "*nat\n:KUBE-SEP-NEW - [0:0]\n:KUBE-NEW - [0:0]\n-D PREROUTING -j KUBE-NEW\n"
        "-X KUBE-SEP-NEW\n-X KUBE-NEW\nCOMMIT\n",
    ]


def test_a_large_rollback_is_split(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(iptables, "BATCH_RULES", 1)
    inputs = rollback_inputs(
        Before(saved=SavedRuleset.parse(BEFORE)), ATTEMPTED, SavedRuleset.parse(NOW)
    )
    assert [t.count("\n-A ") for t in inputs] == [0, 1, 1, 0]


def test_a_partial_sync_rolls_back_to_what_was_applied() -> None:
    applied = {"nat": {"KUBE-SVC-A": ("-A KUBE-SVC-A -j KUBE-SEP-OLD",), "KUBE-SEP-OLD": ()}}
    now = SavedRuleset.parse(NOW.replace(":KUBE-SEP-NEW", ":KUBE-SEP-OLD - [0:0]\n:KUBE-SEP-NEW"))
    attempted = ["*nat\n:KUBE-SVC-A - [0:0]\n:KUBE-SEP-NEW - [0:0]\nCOMMIT\n"]
    assert rollback_inputs(Before(applied=applied), attempted, now) == [
        "*nat\n:KUBE-SVC-A - [0:0]\n-A KUBE-SVC-A -j KUBE-SEP-OLD\nCOMMIT\n",
        "*nat\n:KUBE-SEP-NEW - [0:0]\n-X KUBE-SEP-NEW\nCOMMIT\n",
    ]


def test_only_a_later_input_or_table_can_have_committed() -> None:
    one_table = "*nat\n:KUBE-SVC-A - [0:0]\nCOMMIT\n"
    two_tables = "*filter\n:KUBE-SERVICES - [0:0]\nCOMMIT\n" + one_table
    assert not may_have_committed([one_table], 0)
    assert may_have_committed([two_tables], 0)  # *filter may be in, *nat refused
    assert may_have_committed([one_table, one_table], 1)
