"""ServiceCIDR objects in ClusterState: what a checkout carries, and when it must be full."""

from __future__ import annotations

from typing import Any

from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.errors import InvalidObject
from kubeplex.core.model.types import IPFamily

NODE = "node-a"
V4, V6 = IPFamily.IPv4, IPFamily.IPv6


def service_cidr(*cidrs: str, name: str = "kubernetes") -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "ServiceCIDR",
        "metadata": {"name": name},
        "spec": {"cidrs": list(cidrs)},
    }


def service() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web", "namespace": "prod"},
        "spec": {"clusterIP": "10.96.0.10", "ports": [{"name": "http", "port": 80}]},
    }


class Sink:
    def __init__(self) -> None:
        self.errors: list[str] = []

    def __call__(self, err: InvalidObject, obj: Any) -> None:
        self.errors.append(str(err))


def settled(cluster: ClusterState) -> ClusterState:
    """After a first (full) checkout: nothing pending."""
    cluster.checkout(full=True)
    assert not cluster.changed.is_set()
    return cluster


def test_a_service_cidr_makes_the_next_checkout_full_and_carries_its_cidrs() -> None:
    cluster = settled(ClusterState(NODE))
    cluster.set_service(service())
    assert not cluster.checkout().is_full()  # a Service change alone is partial

    cluster.set_service_cidr(service_cidr("10.96.0.0/16", "fd00:10:96::/112"))
    assert cluster.changed.is_set()
    state = cluster.checkout()
    assert state.is_full() and all(c.full for c in state.changes.values())
    assert state.service_cidrs == ("10.96.0.0/16", "fd00:10:96::/112")
    assert cluster.service_cidrs == state.service_cidrs
    # consumed: the next checkout is empty, and still carries the CIDRs
    again = cluster.checkout()
    assert again.empty and not again.is_full()
    assert again.service_cidrs == ("10.96.0.0/16", "fd00:10:96::/112")


def test_the_same_cidrs_again_change_nothing() -> None:
    cluster = ClusterState(NODE)
    cluster.set_service_cidr(service_cidr("10.96.0.0/16"))
    settled(cluster)
    cluster.set_service_cidr(service_cidr("10.96.0.0/16"))  # a relist, a touched file
    cluster.set_service_cidr(service_cidr("10.96.0.1/16", name="same-range"))  # host bits
    assert not cluster.changed.is_set()
    assert cluster.checkout().empty


def test_all_objects_together_deduplicated_and_sorted() -> None:
    cluster = ClusterState(NODE, families=(V4,))
    cluster.set_service_cidr(service_cidr("fd00:10:96::/112", "10.96.0.0/16"))
    cluster.set_service_cidr(service_cidr("10.100.0.0/24", name="extra"))
    cluster.set_service_cidr(service_cidr("9.0.0.0/24", "fd00:10:96::/112", name="more"))
    # Both families, whatever the node serves (the backend picks its family's).
    assert cluster.checkout().service_cidrs == (
        "9.0.0.0/24",
        "10.96.0.0/16",
        "10.100.0.0/24",
        "fd00:10:96::/112",
    )
    # A CIDR two objects share stays until the last of them goes.
    cluster.delete_service_cidr("more")
    state = cluster.checkout()
    assert state.is_full()
    assert state.service_cidrs == ("10.96.0.0/16", "10.100.0.0/24", "fd00:10:96::/112")
    cluster.delete_service_cidr("kubernetes")
    cluster.delete_service_cidr("extra")
    state = cluster.checkout()
    assert state.is_full() and state.service_cidrs == ()
    cluster.delete_service_cidr("never-seen")
    assert not cluster.changed.is_set()


def test_a_bad_service_cidr_is_reported_and_the_last_valid_version_stays() -> None:
    sink = Sink()
    cluster = ClusterState(NODE, on_invalid=sink)
    cluster.set_service_cidr(service_cidr("10.96.0.0/16"))
    settled(cluster)
    cluster.set_service_cidr(service_cidr("10.96.0.0/16", "10.97.0.0/16"), origin="cidr.yaml")
    assert sink.errors == [
        "cidr.yaml: ServiceCIDR kubernetes: spec.cidrs: may hold at most one CIDR per IP family,"
        " got two IPv4 CIDRs"
    ]
    assert list(cluster.invalid) == ["ServiceCIDR kubernetes"]
    assert not cluster.changed.is_set()
    assert cluster.checkout().service_cidrs == ("10.96.0.0/16",)
    # fixed: the invalid entry goes, the new CIDRs apply
    cluster.set_service_cidr(service_cidr("10.96.0.0/16", "fd00::/112"))
    assert cluster.invalid == {}
    assert cluster.checkout().service_cidrs == ("10.96.0.0/16", "fd00::/112")
    # broken, then deleted: nothing stays reported
    cluster.set_service_cidr(service_cidr("nope"))
    assert list(cluster.invalid) == ["ServiceCIDR kubernetes"]
    cluster.delete_service_cidr("kubernetes")
    assert cluster.invalid == {}
    assert cluster.checkout().service_cidrs == ()
