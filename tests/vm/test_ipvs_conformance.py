"""The conformance kit's packet-flow cases for the ipvs mode, on the VM's real IPVS kernel.

The same cases the host runs for every other mode (tests/kernel/test_conformance.py, where
ipvs skips: the host has no IPVS); here only the issue's small set, since Python runs many
times slower in the guest. One lab for all of them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kubeplex.core.dataplane import plugins
from kubeplex.testing.conformance import ModeKit, params
from kubeplex.testing.conformance.common import Case
from kubeplex.testing.conformance.harness import run_or_skip
from kubeplex.testing.conformance.runner import KERNEL_CASES

#: ClusterIP spread, NodePort from another node and from outside, Local policy keeps the
#: client IP, affinity, no endpoints refused, UDP, cleanup leaves nothing.
GUEST_CASES = (
    "clusterip-spread",
    "nodeport",
    "nodeport-local",
    "session-affinity",
    "no-endpoints-refused",
    "udp",
    "cleanup",
)


def _cases() -> list[Case]:
    by_name = {c.name: c for c in KERNEL_CASES}
    return [by_name[n] for n in GUEST_CASES]


@pytest.fixture(scope="module")
def kit() -> Iterator[ModeKit]:
    if "ipvs" not in plugins.available():
        pytest.skip("mode ipvs: no backend installed")
    with ModeKit("ipvs", plugins.packaged_trust_file()) as kit:
        yield kit


@pytest.mark.parametrize("case", params(_cases()))
def test_ipvs_conformance(kit: ModeKit, case: Case) -> None:
    run_or_skip(kit, case)
