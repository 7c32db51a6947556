"""The conformance kit's kernel cases that IPv4 and IPv6 both run: one case each, given the
family, so the two halves cannot drift apart (no root: the cases are inspected, not run)."""

from __future__ import annotations

import functools

from kubeplex.core.model.types import IPFamily
from kubeplex.testing.conformance import KERNEL_CASES

V4, V6 = IPFamily.IPv4, IPFamily.IPv6
#: Twins that check more than the other family's case: the IPv6 one also refuses UDP and a
#: Service ready in IPv4 only, within the time a same-host ICMPv6 reject takes.
UNLIKE_TWINS = {"no-endpoints-refused"}


def test_each_ipv6_twin_of_an_ipv4_case_runs_the_same_case_in_ipv6() -> None:
    by_name = {c.name: c for c in KERNEL_CASES}
    twins = {c.name: by_name[f"ipv6-{c.name}"] for c in KERNEL_CASES if f"ipv6-{c.name}" in by_name}
    assert set(twins) >= UNLIKE_TWINS
    for name in UNLIKE_TWINS:
        del twins[name]
    assert set(twins) == {"clusterip-spread", "nodeport", "nodeport-local", "hairpin", "udp"}
    for name, v6 in twins.items():
        v4 = by_name[name]
        assert isinstance(v4.func, functools.partial), f"{name}: not a per-family case"
        assert isinstance(v6.func, functools.partial), f"ipv6-{name}: not a per-family case"
        assert v4.func.func is v6.func.func, f"{name} and ipv6-{name} run different cases"
        assert (v4.func.keywords, v6.func.keywords) == ({"family": V4}, {"family": V6})
        assert (v4.needs, v6.needs) == (frozenset(), frozenset({"ipv6"}))
