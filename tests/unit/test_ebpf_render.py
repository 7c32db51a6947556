"""The ebpf mode's render: the map contents it wants for the seed lab and upstream-like
scenarios (goldens under golden/ebpf/), its svc_ids, partial syncs that touch one Service's
entries only, and full syncs that delete what the maps hold and nobody wants. Each plan is
sent to the in-memory maps (FakeEbpfMaps), which must then hold exactly the desired contents.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
from kits.render_kit import (
    LAB,
    NODE,
    NODE_IP,
    V4,
    V6,
    assert_golden_file,
    dual_stack_svc1,
    endpoint_slice,
    ep,
    node_obj,
    port,
    service,
)

from kubeplex.backends.ebpf import layout
from kubeplex.backends.ebpf.plan import (
    OBSERVED_MAPS,
    RENDERED_MAPS,
    EbpfPlan,
    MapOp,
    describe_value,
)
from kubeplex.backends.ebpf.render import EbpfRenderer, RenderSettings, SvcIds, hashed_id
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.types import IPFamily
from kubeplex.core.sources.manifests import ManifestSource
from kubeplex.testing.fakes import FakeEbpfMaps

GOLDEN = Path(__file__).resolve().parent / "golden" / "ebpf"


class Lab:
    """A ClusterState, an EbpfRenderer and the in-memory maps it programs."""

    def __init__(
        self,
        objects: Iterable[Mapping[str, Any]] = (),
        families: tuple[IPFamily, ...] = (V4,),
        node: str = NODE,
        nodeports: tuple[str, ...] = (NODE_IP,),
    ) -> None:
        self.cluster = ClusterState(node, families)
        self.renderer = EbpfRenderer(RenderSettings(nodeport_addresses=nodeports))
        self.maps = FakeEbpfMaps()
        self.feed(objects)

    def feed(self, objects: Iterable[Mapping[str, Any]]) -> None:
        for obj in objects:
            setter = {
                "Service": self.cluster.set_service,
                "EndpointSlice": self.cluster.set_endpoint_slice,
                "Node": self.cluster.set_node,
            }[obj["kind"]]
            setter(obj)

    def render(self, full: bool = False) -> EbpfPlan:
        state = self.cluster.checkout(full=full)
        dump = {name: self.maps.dump(name) for name in OBSERVED_MAPS}
        return self.renderer.render(state, dump if full else None)

    def sync(self, full: bool = False) -> EbpfPlan:
        plan = self.render(full)
        sent = len(self.maps.sent)
        plan.send(self.maps)
        assert self.maps.sent[sent:] == plan.kernel_inputs()  # the bytes it says it sends
        self.assert_maps_hold_the_desired()
        return plan

    def assert_maps_hold_the_desired(self) -> None:
        for name in RENDERED_MAPS:
            assert self.maps.dump(name) == self.renderer.desired[name], name


def golden(name: str, plan: EbpfPlan) -> None:
    assert_golden_file(GOLDEN / f"{name}.txt", str(plan), "rendered map operations differ")


def web(ns: str = "ns1", name: str = "svc1", ip: str = "172.30.0.41", **spec: Any) -> Any:
    return service(ns, name, ip, [spec.pop("ports", port())], **spec)


# --- goldens ------------------------------------------------------------------------------------


def test_seed_lab_golden() -> None:
    lab = Lab(families=(V4, V6), node="kind-worker", nodeports=("172.18.0.5",))
    source = ManifestSource(LAB / "manifests", lab.cluster)
    source.load()
    assert not source.problems
    plan = lab.sync(full=True)
    golden("seed-lab", plan)
    text = str(plan)
    # Both ClusterIPs and the NodePort on the node's address, over the three web pods.
    assert "update kpx_svc4 10.96.88.59:80/tcp -> svc " in text
    assert "update kpx_svc4 172.18.0.5:30080/tcp -> svc " in text
    backends = lab.maps.dump("kpx_backends")
    assert sorted({layout.BACKEND_VALUE.unpack(v)[0][:4] for v in backends.values()}) == [
        bytes([10, 244, 1, 2]),
        bytes([10, 244, 2, 2]),
        bytes([10, 244, 2, 3]),
    ]


def test_affinity_and_no_endpoints_golden() -> None:
    lab = Lab(
        [
            node_obj(),
            web(
                sessionAffinity="ClientIP",
                sessionAffinityConfig={"clientIP": {"timeoutSeconds": 300}},
            ),
            endpoint_slice("ns1", "svc1", [ep("10.180.0.1"), ep("10.180.0.2")]),
            web(name="svc2", ip="172.30.0.42", ports=port(53, "dns", "UDP")),
        ]
    )
    plan = lab.sync(full=True)
    golden("affinity-and-no-endpoints", plan)
    assert "flags affinity timeout 300" in str(plan)
    # No endpoints: an entry with count 0 (the program refuses), and no slot.
    assert "update kpx_svc4 172.30.0.42:53/udp -> svc " in str(plan)
    assert str(plan).count(" count 0") == 1


def test_nodeport_on_two_node_addresses_and_external_entry_points_golden() -> None:
    lab = Lab(
        [
            node_obj(("192.168.0.2", "10.0.0.2")),
            web(
                type="LoadBalancer",
                ports=port(node_port=3001),
                externalIPs=["192.168.99.11"],
                ingress=["1.2.3.4"],
            ),
            endpoint_slice("ns1", "svc1", [ep("10.180.0.1")]),
        ],
        nodeports=("192.168.0.2", "10.0.0.2", "fd00::2"),
    )
    plan = lab.sync(full=True)
    golden("nodeport-two-addresses", plan)
    entries = [str(op).split(" -> ")[0] for op in plan.ops if op.map == "kpx_svc4"]
    assert entries == [
        "update kpx_svc4 172.30.0.41:80/tcp",
        "update kpx_svc4 192.168.99.11:80/tcp",
        "update kpx_svc4 1.2.3.4:80/tcp",
        "update kpx_svc4 192.168.0.2:3001/tcp",
        "update kpx_svc4 10.0.0.2:3001/tcp",
    ]


def test_ipv6_golden() -> None:
    lab = Lab(
        [
            node_obj(("fd00::2",)),
            service(
                "ns1",
                "svc1",
                "fd00:10:96::41",
                [port(node_port=3001)],
                type="NodePort",
                ipFamilies=["IPv6"],
            ),
            endpoint_slice(
                "ns1", "svc1", [ep("fd00:10:180::1"), ep("fd00:10:180::2")], family="IPv6"
            ),
        ],
        families=(V4, V6),
        nodeports=("192.168.0.2", "fd00::2"),
    )
    plan = lab.sync(full=True)
    golden("ipv6", plan)
    assert "update kpx_svc6 [fd00:10:96::41]:80/tcp -> svc " in str(plan)
    assert "update kpx_svc6 [fd00::2]:3001/tcp -> svc " in str(plan)
    assert not lab.maps.dump("kpx_svc4")
    assert any(op.map == "kpx_backends" and "[fd00:10:180::2]:80" in str(op) for op in plan.ops)


def test_local_traffic_policies_golden() -> None:
    """Internal policy Local: the ClusterIP takes the local endpoint only; the external entry
    points (node-started traffic to them short-circuits to the cluster's endpoints, as
    upstream) take all, under a second svc_id. External policy Local alone changes nothing
    for node-started connections."""
    lab = Lab(
        [
            node_obj(),
            web(
                type="NodePort",
                ports=port(node_port=3001),
                internalTrafficPolicy="Local",
                externalIPs=["192.168.99.11"],
            ),
            endpoint_slice("ns1", "svc1", [ep("10.180.0.1"), ep("10.180.2.1", NODE)]),
            web(name="svc2", ip="172.30.0.42", internalTrafficPolicy="Local"),
            endpoint_slice("ns1", "svc2", [ep("10.180.0.9")]),
            web(
                name="svc3",
                ip="172.30.0.43",
                type="NodePort",
                ports=port(node_port=3003),
                externalTrafficPolicy="Local",
            ),
            endpoint_slice("ns1", "svc3", [ep("10.180.0.3"), ep("10.180.2.3", NODE)]),
        ]
    )
    plan = lab.sync(full=True)
    golden("local-policies", plan)
    value = {str(op).split(" -> ")[0]: str(op).split(" -> ")[1] for op in plan.ops}
    assert value["update kpx_svc4 172.30.0.41:80/tcp"].endswith(" count 1")
    assert value["update kpx_svc4 192.168.99.11:80/tcp"].endswith(" count 2")
    assert value["update kpx_svc4 192.168.0.2:3001/tcp"].endswith(" count 2")
    cluster_id = value["update kpx_svc4 172.30.0.41:80/tcp"].split()[1]
    assert value["update kpx_svc4 192.168.99.11:80/tcp"].split()[1] != cluster_id
    # No local endpoint for a Local internal policy: refused.
    assert value["update kpx_svc4 172.30.0.42:80/tcp"].endswith(" count 0")
    assert value["update kpx_svc4 172.30.0.43:80/tcp"].endswith(" count 2")
    assert value["update kpx_svc4 192.168.0.2:3003/tcp"].endswith(" count 2")


def test_terminating_fallback_and_topology_hints_as_the_graph_decides() -> None:
    lab = Lab(
        [
            node_obj(),
            web(),
            endpoint_slice(
                "ns1",
                "svc1",
                [
                    ep("10.180.0.1", ready=False, serving=True, terminating=True),
                    ep("10.180.0.2", ready=False, serving=False, terminating=True),
                ],
            ),
        ]
    )
    plan = lab.sync(full=True)
    # No ready endpoint: the serving, terminating one; never the one that stopped serving.
    assert [str(op).split(" -> ")[1] for op in plan.ops if op.map == "kpx_backends"] == [
        "10.180.0.1:80"
    ]
    hinted = endpoint_slice("ns1", "svc1", [ep("10.180.0.3"), ep("10.180.0.4")])
    hinted["endpoints"][0]["hints"] = {"forZones": [{"name": "zone-a"}]}
    hinted["endpoints"][1]["hints"] = {"forZones": [{"name": "zone-b"}]}
    node = node_obj()
    node["metadata"]["labels"] = {"topology.kubernetes.io/zone": "zone-a"}
    lab.feed([node, hinted])
    lab.sync(full=True)
    assert [str(op) for op in lab.render(full=True).ops] == []
    assert [describe_value("kpx_backends", v) for v in lab.maps.dump("kpx_backends").values()] == [
        "10.180.0.3:80"
    ]


def test_a_dual_stack_service_has_a_svc_id_per_family() -> None:
    lab = Lab(dual_stack_objects(), families=(V4, V6))
    lab.sync(full=True)
    (v4,) = lab.maps.dump("kpx_svc4").values()
    (v6,) = lab.maps.dump("kpx_svc6").values()
    v4_id, v6_id = layout.SVC_VALUE.unpack(v4)[0], layout.SVC_VALUE.unpack(v6)[0]
    assert (v4_id, v6_id) == (
        hashed_id("ns1/svc1:p80/tcp/ipv4"),
        hashed_id("ns1/svc1:p80/tcp/ipv6"),
    )
    assert {describe_value("kpx_backends", v) for v in lab.maps.dump("kpx_backends").values()} == {
        "10.180.0.1:80",
        "[fd00:10:180::1]:80",
    }


def test_sctp_is_left_out_and_said() -> None:
    lab = Lab([node_obj(), web(ports=port(protocol="SCTP")), endpoint_slice("ns1", "svc1", [])])
    plan = lab.sync(full=True)
    assert plan.ops == ()
    assert plan.left_out == {"ns1/svc1:p80 (IPv4)": "SCTP is not supported by the ebpf mode"}
    assert "# left out: ns1/svc1:p80 (IPv4): SCTP is not supported" in str(plan)


def test_an_entry_point_two_services_list_goes_to_the_first_by_name() -> None:
    lab = Lab(
        [
            node_obj(),
            web(externalIPs=["192.168.99.11"]),
            web(name="svc0", ip="172.30.0.40", externalIPs=["192.168.99.11"]),
            endpoint_slice("ns1", "svc0", [ep("10.180.0.1")]),
        ]
    )
    plan = lab.sync(full=True)
    assert plan.left_out == {
        "ns1/svc1:p80 (IPv4)": "192.168.99.11:80/tcp is ns1/svc0:p80's, whose name sorts first"
    }
    first = next(str(op) for op in plan.ops if "192.168.99.11:80/tcp" in str(op))
    assert first.endswith(" count 1")
    # svc0 goes: the entry point is svc1's (no endpoints) in the next partial sync.
    lab.cluster.delete_service("ns1", "svc0")
    plan = lab.sync()
    assert "update kpx_svc4 192.168.99.11:80/tcp -> svc " in str(plan)
    assert plan.left_out == {}


# --- bytes --------------------------------------------------------------------------------------


def test_kernel_inputs_are_the_layout_packing() -> None:
    lab = Lab(
        [
            node_obj(),
            web(sessionAffinity="ClientIP"),
            endpoint_slice("ns1", "svc1", [ep("10.180.0.1")]),
        ]
    )
    plan = lab.render(full=True)
    svc_id = hashed_id("ns1/svc1:p80/tcp/ipv4")
    slot = layout.backend_key(svc_id, 0).hex()
    endpoint = f"{bytes([10, 180, 0, 1]).hex()}{'00' * 12}"
    assert plan.kernel_inputs() == [
        f"update kpx_backends {slot} {endpoint}00500400",
        f"update kpx_slots {svc_id.to_bytes(4, 'little').hex()}00500000{endpoint} 00000000",
        "update kpx_svc4 ac1e00290050" + "0600 " + layout.svc_value(svc_id, 1, 1, 10800).hex(),
    ]
    assert str(plan).splitlines()[2] == (
        f"update kpx_svc4 172.30.0.41:80/tcp -> svc {svc_id:#010x} count 1"
        " flags affinity timeout 10800"
    )


# --- svc_id -------------------------------------------------------------------------------------


def _colliding_texts() -> tuple[str, str]:
    seen: dict[bytes, str] = {}
    i = 0
    while True:
        text = f"ns{i}/web:http/tcp/ipv4"
        head = hashlib.sha256(text.encode()).digest()[:4]
        if head in seen:
            return seen[head], text
        seen[head] = text
        i += 1


def test_svc_id_is_the_sha256_head_and_a_collision_takes_the_next_free() -> None:
    assert hashed_id("default/web/tcp/ipv4") == int.from_bytes(
        hashlib.sha256(b"default/web/tcp/ipv4").digest()[:4], "big"
    )
    one, two = _colliding_texts()
    h = hashed_id(one)
    ids = SvcIds()
    assert ids.take(two) == h
    assert ids.take(one) == (h + 1) % (1 << 32)
    assert ids.take(two) == h  # kept while in use
    ids.release(two)
    assert ids.take(one) == (h + 1) % (1 << 32)  # kept: no renumbering of another
    assert ids.take(two) == h


# --- partial and full syncs ---------------------------------------------------------------------


def three_services() -> list[dict[str, Any]]:
    return [
        node_obj(),
        web(),
        endpoint_slice("ns1", "svc1", [ep("10.180.0.1"), ep("10.180.0.2")]),
        web(name="svc2", ip="172.30.0.42", type="NodePort", ports=port(node_port=3002)),
        endpoint_slice("ns1", "svc2", [ep("10.180.1.1"), ep("10.180.1.2"), ep("10.180.1.3")]),
        web(name="svc3", ip="172.30.0.43"),
        endpoint_slice("ns1", "svc3", [ep("10.180.2.1")]),
    ]


def test_partial_sync_touches_only_the_changed_service() -> None:
    lab = Lab(three_services())
    lab.sync(full=True)
    svc2 = hashed_id("ns1/svc2:p80/tcp/ipv4")
    # svc2 loses an endpoint and gains another, which takes its slot; svc1 and svc3 are not
    # looked at.
    lab.feed(
        [endpoint_slice("ns1", "svc2", [ep("10.180.1.1"), ep("10.180.1.3"), ep("10.180.1.4")])]
    )
    plan = lab.sync()
    assert not plan.full
    golden("partial-endpoint-change", plan)
    assert plan.ops == (
        MapOp(
            "kpx_backends",
            layout.backend_key(svc2, 1),
            layout.backend_value(*_v4("10.180.1.4", 80)),
        ),
    )
    # Down to one endpoint: the entries' count first, then the slots.
    lab.feed([endpoint_slice("ns1", "svc2", [ep("10.180.1.1")])])
    plan = lab.sync()
    assert [str(op) for op in plan.ops] == [
        f"update kpx_svc4 172.30.0.42:80/tcp -> svc {svc2:#010x} count 1",
        f"update kpx_svc4 192.168.0.2:3002/tcp -> svc {svc2:#010x} count 1",
        f"delete kpx_backends svc {svc2:#010x} slot 1",
        f"delete kpx_backends svc {svc2:#010x} slot 2",
    ]
    # Deleted: its entries and slots go, nothing else.
    lab.cluster.delete_service("ns1", "svc2")
    plan = lab.sync()
    assert [str(op) for op in plan.ops] == [
        "delete kpx_svc4 172.30.0.42:80/tcp",
        "delete kpx_svc4 192.168.0.2:3002/tcp",
        f"delete kpx_backends svc {svc2:#010x} slot 0",
    ]
    # What the partial syncs left is what a full render of the same state wants.
    fresh = Lab(lab_objects_after_deleting_svc2())
    fresh.render(full=True)
    assert fresh.renderer.desired == lab.renderer.desired


def lab_objects_after_deleting_svc2() -> list[dict[str, Any]]:
    return [o for o in three_services() if o["metadata"]["name"] not in ("svc2", "svc2-1")]


def _v4(ip: str, port_number: int) -> tuple[ipaddress.IPv4Address, int]:
    return ipaddress.IPv4Address(ip), port_number


def test_full_sync_deletes_strays_and_rewrites_changed_values() -> None:
    lab = Lab(three_services())
    lab.sync(full=True)
    svc1 = hashed_id("ns1/svc1:p80/tcp/ipv4")
    # Another writer (or an earlier run) left entries nobody wants and changed one.
    stray_entry = layout.svc_key(*_v4("172.30.9.9", 80), layout.PROTO_UDP)
    stray_slot = layout.backend_key(0x0BADF00D, 0)
    lab.maps.update("kpx_svc4", stray_entry, layout.svc_value(0x0BADF00D, 1))
    lab.maps.update("kpx_backends", stray_slot, layout.backend_value(*_v4("10.9.9.9", 9)))
    lab.maps.update(
        "kpx_backends", layout.backend_key(svc1, 1), layout.backend_value(*_v4("10.1.1.1", 1))
    )
    plan = lab.sync(full=True)
    assert plan.full
    assert [str(op) for op in plan.ops] == [
        f"update kpx_backends svc {svc1:#010x} slot 1 -> 10.180.0.2:80",
        "delete kpx_svc4 172.30.9.9:80/udp",
        "delete kpx_backends svc 0x0badf00d slot 0",
    ]
    # Nothing left to do.
    assert lab.render(full=True).ops == ()


def test_full_render_without_a_dump_writes_everything_and_after_invalidate_too() -> None:
    lab = Lab(three_services())
    first = lab.sync(full=True)
    assert all(op.value is not None for op in first.ops)
    lab.renderer.invalidate()
    plan = lab.render()  # a partial checkout, made full by invalidate, against empty maps
    assert plan.full and [str(op) for op in plan.ops] == [str(op) for op in first.ops]


def test_what_does_not_fit_the_layout_prints_as_raw_bytes() -> None:
    value = layout.BACKEND_VALUE.pack(bytes(16), b"\0\x50", 9)  # family 9: neither
    assert describe_value("kpx_backends", value) == "0x" + value.hex()
    op = MapOp("kpx_svc4", b"\x01\x02")
    assert str(op) == "delete kpx_svc4 0x0102"


# --- slots, affinity entries and families -------------------------------------------------------


def many_endpoints(count: int, **spec: Any) -> list[dict[str, Any]]:
    eps = [ep(f"10.180.{i // 250}.{i % 250 + 1}") for i in range(count)]
    return [node_obj(), web(**spec), endpoint_slice("ns1", "svc1", eps)]


def without(objects: list[dict[str, Any]], value: bytes) -> dict[str, Any]:
    """svc1's slice without the endpoint of a kpx_backends value."""
    ip = describe_value("kpx_backends", value).rsplit(":", 1)[0]
    eps = [e for e in objects[2]["endpoints"] if e["addresses"] != [ip]]
    return endpoint_slice("ns1", "svc1", eps)


def test_removing_a_middle_endpoint_moves_the_last_into_its_slot() -> None:
    """One endpoint of 10 (or of 100) goes: its slot takes the last endpoint, the count
    shrinks, the last slot goes; no other slot is written."""
    svc1 = hashed_id("ns1/svc1:p80/tcp/ipv4")
    for count in (10, 100):
        objects = many_endpoints(count)
        lab = Lab(objects)
        lab.sync(full=True)
        slots = lab.maps.dump("kpx_backends")
        middle = count // 2
        last = slots[layout.backend_key(svc1, count - 1)]
        lab.feed([without(objects, slots[layout.backend_key(svc1, middle)])])
        plan = lab.sync()
        assert [str(op) for op in plan.ops] == [
            f"update kpx_backends svc {svc1:#010x} slot {middle} -> "
            + describe_value("kpx_backends", last),
            f"update kpx_svc4 172.30.0.41:80/tcp -> svc {svc1:#010x} count {count - 1}",
            f"delete kpx_backends svc {svc1:#010x} slot {count - 1}",
        ]
        # Every other endpoint is where it was.
        moved = (layout.backend_key(svc1, middle), layout.backend_key(svc1, count - 1))
        after = lab.maps.dump("kpx_backends")
        assert {k: v for k, v in after.items() if k not in moved} == {
            k: v for k, v in slots.items() if k not in moved
        }


def test_with_affinity_a_moved_endpoint_is_found_in_its_new_slot() -> None:
    svc1 = hashed_id("ns1/svc1:p80/tcp/ipv4")
    objects = many_endpoints(10, sessionAffinity="ClientIP")
    lab = Lab(objects)
    lab.sync(full=True)
    last = lab.maps.dump("kpx_backends")[layout.backend_key(svc1, 9)]
    gone = lab.maps.dump("kpx_backends")[layout.backend_key(svc1, 4)]
    lab.feed([without(objects, gone)])
    plan = lab.sync()
    moved, removed = layout.slot_key(svc1, last), layout.slot_key(svc1, gone)
    assert plan.ops == (
        MapOp("kpx_backends", layout.backend_key(svc1, 4), last),
        MapOp("kpx_slots", moved, layout.slot_value(4)),
        MapOp("kpx_svc4", *next(iter(lab.maps.dump("kpx_svc4").items()))),
        MapOp("kpx_backends", layout.backend_key(svc1, 9)),
        MapOp("kpx_slots", removed),
    )
    # Each endpoint's kpx_slots entry names the slot it is in.
    index = lab.maps.dump("kpx_slots")
    for key, value in lab.maps.dump("kpx_backends").items():
        assert index[layout.slot_key(svc1, value)] == layout.slot_value(key[4])
    assert len(index) == 9


def test_a_full_sync_after_a_restart_keeps_the_endpoints_in_their_slots() -> None:
    objects = many_endpoints(10, sessionAffinity="ClientIP")
    lab = Lab(objects)
    lab.sync(full=True)
    changed = endpoint_slice("ns1", "svc1", [*objects[2]["endpoints"][1:], ep("10.180.9.9")])
    lab.feed([changed])
    # The new endpoint takes the slot of the one gone: its slot and the two kpx_slots entries.
    assert [op.map for op in lab.sync().ops] == ["kpx_backends", "kpx_slots", "kpx_slots"]
    # A new renderer (a restart) adopts the slots the maps hold: nothing to write.
    again = Lab([*objects[:2], changed])
    again.maps = lab.maps
    assert again.render(full=True).ops == ()


def _affinity_key(netns: int, svc_id: int) -> bytes:
    return layout.AFFINITY_KEY.pack(netns, svc_id)


def test_a_full_sync_deletes_the_affinity_entries_of_services_without_affinity() -> None:
    lab = Lab(
        [
            node_obj(),
            web(sessionAffinity="ClientIP"),
            endpoint_slice("ns1", "svc1", [ep("10.180.0.1")]),
            web(name="svc2", ip="172.30.0.42", sessionAffinity="ClientIP"),
            endpoint_slice("ns1", "svc2", [ep("10.180.0.2")]),
        ]
    )
    lab.sync(full=True)
    svc1, svc2 = hashed_id("ns1/svc1:p80/tcp/ipv4"), hashed_id("ns1/svc2:p80/tcp/ipv4")
    backend = layout.backend_value(*_v4("10.180.0.1", 80))
    entries = [_affinity_key(n, s) for n in (1, 2) for s in (svc1, svc2, 0x0BADF00D)]
    for key in entries:  # as the programs write them
        lab.maps.update("kpx_affinity", key, layout.affinity_value(backend, 1))
    # svc2 goes; a partial sync leaves its entries to the full sync.
    lab.cluster.delete_service("ns1", "svc2")
    assert not any(op.map == "kpx_affinity" for op in lab.sync().ops)
    plan = lab.sync(full=True)
    assert [str(op) for op in plan.ops if op.map == "kpx_affinity"] == [
        f"delete kpx_affinity svc {s:#010x} netns {n:#x}"
        for n in (1, 2)
        for s in (svc2, 0x0BADF00D)
    ]
    assert list(lab.maps.dump("kpx_affinity")) == [_affinity_key(n, svc1) for n in (1, 2)]
    # svc1's affinity is turned off: its entries go too.
    lab.feed([web()])
    lab.sync()
    lab.sync(full=True)
    assert lab.maps.dump("kpx_affinity") == {}


def test_an_affinity_entry_evicted_before_its_delete_is_no_error() -> None:
    lab = Lab([node_obj(), web(), endpoint_slice("ns1", "svc1", [ep("10.180.0.1")])])
    key = _affinity_key(1, 0x0BADF00D)
    lab.maps.update("kpx_affinity", key, layout.affinity_value(bytes(20), 1))
    plan = lab.render(full=True)
    assert MapOp("kpx_affinity", key) in plan.ops
    lab.maps.delete("kpx_affinity", key)  # the LRU map evicted it meanwhile
    plan.send(lab.maps)
    assert lab.maps.dump("kpx_svc4")
    with pytest.raises(OSError):  # elsewhere a delete of what is not there stays an error
        MapOp("kpx_backends", layout.backend_key(1, 0)).send(lab.maps)


def dual_stack_objects() -> list[dict[str, Any]]:
    return [node_obj(("192.168.0.2", "fd00::2")), *dual_stack_svc1()]


@pytest.mark.parametrize("family", [V4, V6])
def test_a_node_of_one_family_writes_no_entry_of_the_other(family: IPFamily) -> None:
    lab = Lab(dual_stack_objects(), families=(V4, V6), nodeports=("192.168.0.2", "fd00::2"))
    lab.renderer.settings = RenderSettings(lab.renderer.settings.nodeport_addresses, (family,))
    plan = lab.sync(full=True)
    shown = {"kpx_svc4" if family is V4 else "kpx_svc6"}
    assert {op.map for op in plan.ops if op.map.startswith("kpx_svc")} == shown
    other = "[fd00:10:180::1]:80" if family is V4 else "10.180.0.1:80"
    assert other not in str(plan)
    # A partial sync of the Service keeps to the node's family too.
    lab.feed([endpoint_slice("ns1", "svc1", [ep("fd00:10:180::2")], family="IPv6", name="v6")])
    lab.feed([endpoint_slice("ns1", "svc1", [ep("10.180.0.2")])])
    assert {op.map for op in lab.sync().ops} - {"kpx_backends"} <= shown | {"kpx_slots"}
    assert "fd00" not in str(lab.render()) or family is V6


def test_a_full_sync_deletes_the_entries_of_a_family_the_node_no_longer_runs() -> None:
    lab = Lab(dual_stack_objects(), families=(V4, V6))
    lab.sync(full=True)
    assert lab.maps.dump("kpx_svc6")
    lab.renderer.settings = RenderSettings((), (V4,))
    lab.renderer.invalidate()
    plan = lab.sync(full=True)
    assert {op.map for op in plan.ops if op.value is None} == {"kpx_svc6", "kpx_backends"}
    assert lab.maps.dump("kpx_svc6") == {} and lab.maps.dump("kpx_svc4")
