"""The ebpf mode's attached programs as /metrics shows them, read from the pinned links of a
start on a bpffs and a cgroup of the test's own: every program attached, then none after a
cleanup."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from kits.ebpf_kit import own_bpffs, own_cgroup, own_loader
from kits.render_kit import config

from kubeplex.backends.ebpf import EbpfBackend, metrics
from kubeplex.backends.ebpf.layout import PROGRAMS
from kubeplex.core.daemon.metrics import ProxyMetrics
from kubeplex.core.dataplane.backend import BackendContext

pytestmark = pytest.mark.kernel


@pytest.fixture
def backend() -> Iterator[EbpfBackend]:
    with own_bpffs() as bpffs, own_cgroup() as cgroup, own_loader(bpffs):
        options = {"bpffs": str(bpffs), "cgroup": str(cgroup)}
        made = EbpfBackend(BackendContext(config({}), "kind-worker"), options=options)
        try:
            yield made
        finally:
            made.cleanup()


def attached(m: ProxyMetrics) -> dict[str, float]:
    text = m.exposition().decode()
    found = re.findall(rf'^{metrics.PROGRAMS_ATTACHED}{{program="(\w+)"}} (\S+)$', text, re.M)
    return {program: float(value) for program, value in found}


def test_every_program_shows_attached_until_the_cleanup(backend: EbpfBackend) -> None:
    m = ProxyMetrics(backend, process_collectors=False)
    assert attached(m) == dict.fromkeys(PROGRAMS, 0.0)  # nothing pinned yet
    backend.prepare()
    assert attached(m) == dict.fromkeys(PROGRAMS, 1.0)
    # Pinned for another cgroup: not attached to this one.
    other = Path(backend.options.cgroup).parent
    assert backend.loader.attached(other) == []
    backend.cleanup()
    assert attached(m) == dict.fromkeys(PROGRAMS, 0.0)
