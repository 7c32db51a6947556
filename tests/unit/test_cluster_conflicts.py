"""What the API server allocates to one Service only (ClusterIPs, node ports) stays with the
older Service when a folder of manifests hands the same address to two."""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.errors import InvalidObject
from kubeplex.core.model.types import IPFamily
from kubeplex.core.sources.manifests import ManifestSource
from kubeplex.testing.dataplane import endpoint, endpoint_slice, service

NODE = "node-a"
V4 = IPFamily.IPv4
WEB_VIP = "10.96.88.59"


class Sink:
    """The ClusterState's invalid-object sink, as the API source's EventRecorder is."""

    def __init__(self) -> None:
        self.calls: list[tuple[InvalidObject, Any]] = []

    def __call__(self, err: InvalidObject, obj: Any) -> None:
        self.calls.append((err, obj))

    def names(self) -> list[str]:
        return [obj["metadata"]["name"] for _, obj in self.calls]


def programmed(cluster: ClusterState) -> dict[str, str]:
    """Service -> its ClusterIP, as the next sync would program them."""
    state = cluster.checkout()
    return {sp.name.namespaced_name: sp.cluster_ip for sp in state.graphs[V4]}


def node_ports(cluster: ClusterState) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for sp in cluster.checkout().graphs[V4]:
        out.setdefault(sp.name.namespaced_name, set()).add(sp.node_port)
    return out


def with_created(obj: dict[str, Any], stamp: str) -> dict[str, Any]:
    obj["metadata"]["creationTimestamp"] = stamp
    return obj


def two_port_service(name: str, vip: str, node_port: int, **ports: Any) -> dict[str, Any]:
    svc = service(name, vip, 53, type="NodePort", node_port=node_port, port_name="tcp")
    svc["spec"]["ports"].append(
        {"name": "udp", "port": 53, "protocol": "UDP", "nodePort": node_port, **ports}
    )
    return svc


# ------------------------------------------------------------------------------ ClusterIP


def test_a_second_service_with_the_same_cluster_ip_is_refused_naming_both() -> None:
    sink = Sink()
    cluster = ClusterState(NODE, (V4,), on_invalid=sink)
    cluster.set_service(service("web", WEB_VIP, 80))
    # another port, another namespace: a ClusterIP belongs to one Service, whatever the port
    newcomer = service("newcomer", WEB_VIP, 8443, namespace="other")
    del newcomer["spec"]["clusterIPs"]  # the error names the field as written
    cluster.set_service(newcomer)

    assert programmed(cluster) == {"default/web": WEB_VIP}
    err = cluster.invalid["Service other/newcomer"]
    assert err.where == "Service other/newcomer"
    assert [e.path for e in err.errors] == ["spec.clusterIP"]
    assert "Service default/web" in str(err) and WEB_VIP in str(err)
    assert sink.names() == ["newcomer"]  # reported once, as any invalid object (an Event)


class _Raw(dict[str, Any]):
    """A raw object that a weak reference can follow (a plain dict cannot)."""


def test_a_report_names_the_object_without_the_cluster_keeping_it() -> None:
    # An older Service takes the ClusterIP of one accepted before: the report about the one
    # displaced carries what an Event needs, and no raw Service object is kept for it.
    sink = Sink()
    cluster = ClusterState(NODE, (V4,), on_invalid=sink)
    web = _Raw(service("web", WEB_VIP, 80))
    web.update(kind="Service", apiVersion="v1")
    web["metadata"].update(uid="u-1", resourceVersion="7", labels={"big": "x" * 1000})
    cluster.set_service(web)
    alive = weakref.ref(web)
    del web
    assert alive() is None
    cluster.set_service(with_created(service("owner", WEB_VIP, 80), "2020-01-01T00:00:00Z"))

    assert programmed(cluster) == {"default/owner": WEB_VIP}
    [(err, ref)] = sink.calls
    assert "now belongs to Service default/owner" in str(err)
    assert ref == {
        "kind": "Service",
        "apiVersion": "v1",
        "metadata": {"name": "web", "namespace": "default", "uid": "u-1", "resourceVersion": "7"},
    }


def test_the_refused_service_is_programmed_once_the_owner_is_deleted() -> None:
    cluster = ClusterState(NODE, (V4,))
    cluster.set_service(service("web", WEB_VIP, 80))
    cluster.set_service(service("newcomer", WEB_VIP, 80))
    assert programmed(cluster) == {"default/web": WEB_VIP}

    cluster.delete_service("default", "web")
    assert cluster.changed.is_set()
    assert programmed(cluster) == {"default/newcomer": WEB_VIP}
    assert not cluster.invalid


def test_the_refused_service_is_programmed_once_the_owner_moves_away() -> None:
    cluster = ClusterState(NODE, (V4,))
    cluster.set_service(service("web", WEB_VIP, 80))
    cluster.set_service(service("newcomer", WEB_VIP, 80))
    cluster.set_service(service("web", "10.96.0.20", 80))
    assert programmed(cluster) == {"default/web": "10.96.0.20", "default/newcomer": WEB_VIP}
    assert not cluster.invalid


def test_an_update_that_takes_another_address_keeps_the_last_valid_version() -> None:
    cluster = ClusterState(NODE, (V4,))
    cluster.set_service(service("web", WEB_VIP, 80))
    cluster.set_service(service("api", "10.96.0.20", 80))
    cluster.set_service(service("api", WEB_VIP, 80))
    assert programmed(cluster) == {"default/web": WEB_VIP, "default/api": "10.96.0.20"}
    errors = cluster.invalid["Service default/api"].errors
    assert [e.path for e in errors] == ["spec.clusterIPs[0]"]
    # the same object again (a relist, a touched file) changes nothing
    cluster.set_service(service("web", WEB_VIP, 80))
    assert programmed(cluster) == {"default/web": WEB_VIP, "default/api": "10.96.0.20"}


def test_the_owner_updated_keeps_its_address() -> None:
    cluster = ClusterState(NODE, (V4,))
    cluster.set_service(service("web", WEB_VIP, 80))
    cluster.set_service(service("newcomer", WEB_VIP, 80))
    cluster.set_service(service("web", WEB_VIP, 81))  # still holding the address
    assert programmed(cluster) == {"default/web": WEB_VIP}
    assert "Service default/newcomer" in cluster.invalid


def test_the_second_family_address_is_checked_too() -> None:
    cluster = ClusterState(NODE)
    cluster.set_service(service("web", WEB_VIP, 80, secondary_cluster_ip="fd00:10:96::10"))
    cluster.set_service(service("six", "fd00:10:96::10", 80))
    err = cluster.invalid["Service default/six"]
    assert [e.path for e in err.errors] == ["spec.clusterIPs[0]"]
    assert "Service default/web" in str(err) and "fd00:10:96::10" in str(err)


def test_older_by_creation_timestamp_wins_whatever_the_arrival_order() -> None:
    old = with_created(service("web", WEB_VIP, 80), "2024-01-01T00:00:00Z")
    new = with_created(service("newcomer", WEB_VIP, 80), "2025-06-01T00:00:00Z")
    for order in ([old, new], [new, old]):
        sink = Sink()
        cluster = ClusterState(NODE, (V4,), on_invalid=sink)
        for obj in order:
            cluster.set_service(obj)
        assert programmed(cluster) == {"default/web": WEB_VIP}
        assert list(cluster.invalid) == ["Service default/newcomer"]
        assert "Service default/web" in str(cluster.invalid["Service default/newcomer"])
        assert sink.names()[-1] == "newcomer"


def test_external_and_load_balancer_ips_may_be_shared() -> None:
    cluster = ClusterState(NODE, (V4,))
    for name, vip in (("a", "10.96.0.10"), ("b", "10.96.0.11")):
        cluster.set_service(
            service(
                name,
                vip,
                80,
                type="LoadBalancer",
                external_ips=["192.0.2.10"],
                load_balancer_ips=["198.51.100.7"],
            )
        )
    assert not cluster.invalid
    assert set(programmed(cluster)) == {"default/a", "default/b"}


def test_headless_services_share_nothing() -> None:
    cluster = ClusterState(NODE, (V4,))
    cluster.set_service(service("a", "None", 80))
    cluster.set_service(service("b", "None", 80))
    assert not cluster.invalid


# ------------------------------------------------------------------------------ node ports


def test_a_node_port_of_another_service_is_refused() -> None:
    cluster = ClusterState(NODE, (V4,))
    cluster.set_service(service("web", WEB_VIP, 80, type="NodePort", node_port=30080))
    # another protocol does not help: one node port range, one Service per number
    cluster.set_service(
        service("dns", "10.96.0.10", 53, type="NodePort", node_port=30080, protocol="UDP")
    )
    err = cluster.invalid["Service default/dns"]
    assert [e.path for e in err.errors] == ["spec.ports[0].nodePort"]
    assert "30080" in str(err) and "Service default/web" in str(err)
    assert node_ports(cluster) == {"default/web": {30080}}

    cluster.delete_service("default", "web")
    assert node_ports(cluster) == {"default/dns": {30080}}


def test_tcp_and_udp_ports_of_one_service_may_share_a_node_port() -> None:
    cluster = ClusterState(NODE, (V4,))
    cluster.set_service(two_port_service("dns", "10.96.0.10", 30053))
    assert not cluster.invalid
    assert node_ports(cluster) == {"default/dns": {30053}}


def test_one_service_with_the_same_node_port_twice_in_one_protocol_is_refused() -> None:
    cluster = ClusterState(NODE, (V4,))
    svc = two_port_service("dns", "10.96.0.10", 30053, protocol="TCP", port=54)
    cluster.set_service(svc)
    err = cluster.invalid["Service default/dns"]
    assert [e.path for e in err.errors] == ["spec.ports[1].nodePort"]
    assert not programmed(cluster)


def test_a_health_check_node_port_collides_with_node_ports() -> None:
    cluster = ClusterState(NODE, (V4,))
    cluster.set_service(service("web", WEB_VIP, 80, type="NodePort", node_port=30080))
    lb = service(
        "lb",
        "10.96.0.30",
        80,
        type="LoadBalancer",
        node_port=30081,
        external_traffic_policy="Local",
        health_check_node_port=30080,
    )
    cluster.set_service(lb)
    err = cluster.invalid["Service default/lb"]
    assert [e.path for e in err.errors] == ["spec.healthCheckNodePort"]
    assert "Service default/web" in str(err)

    # and with its own node port
    lb["metadata"]["name"] = "lb2"
    lb["spec"]["clusterIP"] = lb["spec"]["clusterIPs"][0] = "10.96.0.31"
    lb["spec"]["healthCheckNodePort"] = 30081
    cluster.set_service(lb)
    err = cluster.invalid["Service default/lb2"]
    assert [e.path for e in err.errors] == ["spec.healthCheckNodePort"]
    assert "spec.ports[0].nodePort" in str(err)


def test_a_health_check_node_port_is_only_claimed_where_it_is_used() -> None:
    cluster = ClusterState(NODE, (V4,))
    cluster.set_service(service("web", WEB_VIP, 80, type="NodePort", node_port=30080))
    # Cluster policy: the API server does not allocate it, kube-proxy does not serve it
    lb = service(
        "lb", "10.96.0.30", 80, type="LoadBalancer", node_port=30081, health_check_node_port=30080
    )
    cluster.set_service(lb)
    assert not cluster.invalid


# ------------------------------------------------------------------------------ manifests


def write(path: Path, *objs: dict[str, Any]) -> None:
    path.write_text(yaml.safe_dump_all(objs))


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    write(
        tmp_path / "web.yaml",
        service("web", WEB_VIP, 80),
        endpoint_slice("web", [endpoint("10.244.1.2")]),
    )
    return tmp_path


def test_a_newcomer_in_a_manifests_folder_does_not_take_webs_address(folder: Path) -> None:
    cluster = ClusterState(NODE, (V4,))
    source = ManifestSource(folder, cluster)
    source.load()
    assert programmed(cluster) == {"default/web": WEB_VIP}

    # sorted before web.yaml: on a fresh load it would be seen first
    write(
        folder / "another.yaml",
        service("newcomer", WEB_VIP, 80),
        endpoint_slice("newcomer", [endpoint("10.244.2.9")]),
    )
    source.load()
    assert programmed(cluster) == {"default/web": WEB_VIP}  # web keeps its address
    err = cluster.invalid["Service default/newcomer"]
    assert str(folder / "another.yaml") in err.where
    assert "Service default/web" in str(err)

    # web edited: still the owner
    write(
        folder / "web.yaml",
        service("web", WEB_VIP, 81),
        endpoint_slice("web", [endpoint("10.244.1.2")]),
    )
    source.load()
    assert programmed(cluster) == {"default/web": WEB_VIP}
    assert "Service default/newcomer" in cluster.invalid

    (folder / "web.yaml").unlink()
    source.load()
    assert programmed(cluster) == {"default/newcomer": WEB_VIP}
    assert not cluster.invalid
