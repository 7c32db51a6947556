"""The ebpf mode's own metrics: what its maps hold, what the last sync sent them, the programs
attached to the cgroup, and failed syncs (upstream has no such mode: the names follow its
``kubeproxy_sync_proxy_rules_<mode>_*`` pattern)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kubeplex.backends.ebpf.plan import OBSERVED_MAPS, RENDERED_MAPS, MapOp
from kubeplex.core.dataplane.backend import MetricEvent, MetricFamily, Sample

MAP_ENTRIES = "kubeproxy_sync_proxy_rules_ebpf_map_entries"
MAP_OPERATIONS_LAST = "kubeproxy_sync_proxy_rules_ebpf_map_operations_last"
SYNC_FAILURES = "kubeproxy_sync_proxy_rules_ebpf_sync_failures_total"
PROGRAMS_ATTACHED = "kubeproxy_ebpf_programs_attached"

OPERATIONS = ("update", "delete")

FAMILIES = (
    MetricFamily(
        SYNC_FAILURES,
        "Cumulative proxy ebpf sync failures (map writes the kernel refused)",
        "counter",
        on=MetricEvent.SYNC_FAILED,
    ),
    MetricFamily(
        MAP_ENTRIES,
        "Number of entries kube-proxy wrote in each of its ebpf maps",
        "gauge",
        labels=("map",),
    ),
    MetricFamily(
        MAP_OPERATIONS_LAST,
        "Number of ebpf map operations (update, delete) sent by the last sync",
        "gauge",
        labels=("map", "operation"),
    ),
    MetricFamily(
        PROGRAMS_ATTACHED,
        "Whether each of the mode's programs is attached to its cgroup (1) or not (0)",
        "gauge",
        labels=("program",),
        scraped=True,
    ),
)


def sync_samples(held: Mapping[str, Mapping[bytes, bytes]], ops: Sequence[MapOp]) -> list[Sample]:
    """The entries of every rendered map after a sync (``held``) and the operations it sent
    (to those and, in a full sync, to the affinity map), every map and operation named, so
    that a gauge of an earlier sync never lingers."""
    sent = {(name, op): 0 for name in OBSERVED_MAPS for op in OPERATIONS}
    for op in ops:
        sent[op.map, "update" if op.value is not None else "delete"] += 1
    out = [Sample(MAP_ENTRIES, (name,), len(held.get(name, {}))) for name in RENDERED_MAPS]
    out += [Sample(MAP_OPERATIONS_LAST, key, count) for key, count in sent.items()]
    return out


def attached_samples(programs: Sequence[str], attached: Sequence[str]) -> list[Sample]:
    return [Sample(PROGRAMS_ATTACHED, (p,), 1 if p in attached else 0) for p in programs]
