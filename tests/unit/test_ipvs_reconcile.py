"""The ipvs mode's reconcile through the backend and FakeIpvs: full against partial syncs, the
constant cost of a one-endpoint change, graceful termination, excludeCIDRs, foreign objects,
and a refused apply making the next sync full."""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Callable
from typing import Any

import pytest

from kubeplex.backends.ipvs import IpvsBackend
from kubeplex.backends.ipvs.plan import (
    FamilyState,
    IpsetSpec,
    Op,
    RealKey,
    RealServer,
    VirtualKey,
    VirtualServer,
)
from kubeplex.backends.ipvs.reconcile import AFTER, BEFORE, Held, Ownership, reconcile
from kubeplex.core.config.kubeproxy import KubeProxyConfiguration, with_overrides
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import BackendContext
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.errors import BackendError
from kubeplex.core.model.types import IPFamily
from kubeplex.core.model.types import Protocol as L4
from kubeplex.testing.dataplane import endpoint, endpoint_slice, lab_config, node_object, service
from kubeplex.testing.fakes import FakeIpvs

NODE, OTHER, NODE_IP = "kind-worker", "kind-worker2", "172.18.0.2"
V4 = IPFamily.IPv4


def _vip(i: int) -> str:
    return f"10.96.{i // 250}.{i % 250 + 1}"


def _config(**ipvs: Any) -> KubeProxyConfiguration:
    cfg = with_overrides(
        lab_config("ipvs"), mode="ipvs", hostname_override=NODE, known_modes=plugins.known_modes()
    )
    return dataclasses.replace(cfg, ipvs=dataclasses.replace(cfg.ipvs, **ipvs)) if ipvs else cfg


class Cluster:
    """A node and ``n`` Services with two endpoints each; a backend on a FakeIpvs."""

    def __init__(self, n: int, *, protocol: str = "TCP", **ipvs: Any) -> None:
        self.kernel = FakeIpvs(addresses=(NODE_IP,))
        self.backend = IpvsBackend(BackendContext(_config(**ipvs), NODE, (V4,), kernel=self.kernel))
        self.state = ClusterState(NODE, (V4,))
        self.state.set_node(node_object(NODE, NODE_IP, "10.244.1.0/24"))
        self.protocol = protocol
        for i in range(n):
            self.state.set_service(service(f"svc-{i}", _vip(i), 80, protocol=protocol))
            self.slice(i, [f"10.244.1.{i % 250 + 1}", f"10.244.2.{i % 250 + 1}"])

    def slice(self, i: int, ips: list[str]) -> None:
        eps = [endpoint(ip, NODE if ".1." in ip else OTHER) for ip in ips]
        self.state.set_endpoint_slice(
            endpoint_slice(f"svc-{i}", eps, port=8080, protocol=self.protocol)
        )

    def sync(self, full: bool = False) -> Any:
        before = self.kernel.requests
        rendered = self.backend.render(
            ps := self.state.checkout(full=full), self.backend.observe(ps)
        )
        self.backend.apply(rendered)
        self.last_requests = self.kernel.requests - before
        return rendered

    def held(self) -> FamilyState:
        return self.kernel.dump(V4)


def _key(i: int, protocol: L4 = L4.TCP) -> VirtualKey:
    return VirtualKey(protocol, _vip(i), 80)


@pytest.mark.parametrize("n", [100, 2000])
def test_a_one_endpoint_change_costs_the_same_few_requests_at_any_size(n: int) -> None:
    c = Cluster(n)
    full = c.sync(full=True)
    assert full.full
    assert len(c.held().virtual) == n
    c.slice(1, ["10.244.1.2", "10.244.2.2", "10.244.2.99"])
    partial = c.sync()
    assert not partial.full
    ops = [str(op) for p in partial.plans for op in p.ops()]
    assert "ipvsadm -a -t 10.96.0.2:80 -r 10.244.2.99:8080 -m -w 1" in ops
    assert c.last_requests <= 5, ops
    assert c.last_requests == len(ops)
    assert RealKey("10.244.2.99", 8080) in c.held().real[_key(1)]


def test_the_one_endpoint_plan_is_the_same_at_100_and_2000_services() -> None:
    plans = []
    for n in (100, 2000):
        c = Cluster(n)
        c.sync(full=True)
        c.slice(1, ["10.244.1.2", "10.244.2.2", "10.244.2.99"])
        plans.append(str(c.sync()))
    assert plans[0] == plans[1]


def test_a_full_sync_of_an_unchanged_kernel_sends_nothing_but_the_rules() -> None:
    c = Cluster(20)
    c.sync(full=True)
    again = c.sync(full=True)
    assert [op for p in again.plans for op in p.ops()] == []
    assert all(p.iptables is not None for p in again.plans)  # the rules, rewritten
    quiet = c.sync()
    assert [op for p in quiet.plans for op in p.ops()] == []
    assert all(p.iptables is None for p in quiet.plans)


def test_a_full_sync_repairs_what_changed_behind_its_back() -> None:
    c = Cluster(5)
    c.sync(full=True)
    k = _key(2)
    c.kernel.send(V4, [Op("del-real", V4, key=k, real=RealServer(RealKey("10.244.1.3", 8080)))])
    c.kernel.send(V4, [Op("del-address", V4, address=_vip(3))])
    repaired = c.sync(full=True)
    ops = {str(op) for p in repaired.plans for op in p.ops()}
    assert ops == {
        f"ipvsadm -a -t {_vip(2)}:80 -r 10.244.1.3:8080 -m -w 1",
        f"ip addr add {_vip(3)}/32 dev kube-ipvs0",
    }


def _terminate(c: Cluster) -> tuple[VirtualKey, RealKey]:
    c.sync(full=True)
    c.slice(1, ["10.244.1.2"])  # 10.244.2.2 goes
    return _key(1, L4[c.protocol]), RealKey("10.244.2.2", 8080)


def test_a_removed_real_server_first_gets_weight_0_then_goes_when_idle() -> None:
    c = Cluster(3)
    key, gone = _terminate(c)
    first = c.sync()
    assert [str(op) for p in first.plans for op in p.ops()] == [
        f"ipvsadm -e -t {_vip(1)}:80 -r 10.244.2.2:8080 -m -w 0"
    ]
    assert c.held().real[key][gone].weight == 0
    c.kernel.set_connections(V4, str(key), str(gone), active=1)
    c.sync()
    assert gone in c.held().real[key], "a server with an open connection stays"
    c.kernel.set_connections(V4, str(key), str(gone), active=0, inactive=0)
    done = c.sync()
    assert [str(op) for p in done.plans for op in p.ops()] == [
        f"ipvsadm -d -t {_vip(1)}:80 -r 10.244.2.2:8080"
    ]
    assert gone not in c.held().real[key]
    assert c.sync().plans[0].ops() == ()  # nothing is left to check


def test_inactive_connections_keep_it_too_and_a_bound_ends_the_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr("kubeplex.backends.ipvs.time.monotonic", lambda: clock[0])
    c = Cluster(3)
    key, gone = _terminate(c)
    c.sync()
    c.kernel.set_connections(V4, str(key), str(gone), inactive=2)
    clock[0] += 60
    c.sync()
    assert gone in c.held().real[key]
    clock[0] += 900
    c.sync()
    assert gone not in c.held().real[key]


def test_a_server_that_comes_back_while_terminating_gets_its_weight_back() -> None:
    c = Cluster(3)
    key, gone = _terminate(c)
    c.sync()
    c.kernel.set_connections(V4, str(key), str(gone), active=3)
    c.slice(1, ["10.244.1.2", "10.244.2.2"])
    back = c.sync()
    assert [str(op) for p in back.plans for op in p.ops()] == [
        f"ipvsadm -e -t {_vip(1)}:80 -r 10.244.2.2:8080 -m -w 1"
    ]
    assert c.held().real[key][gone].weight == 1
    assert len(c.backend._terminating[V4]) == 0


def test_udp_real_servers_go_at_once() -> None:
    c = Cluster(3, protocol="UDP")
    _terminate(c)
    ops = [str(op) for p in c.sync().plans for op in p.ops()]
    assert ops == [f"ipvsadm -d -u {_vip(1)}:80 -r 10.244.2.2:8080"]


def test_a_full_sync_deletes_an_idle_removed_server_at_once() -> None:
    c = Cluster(3)
    c.sync(full=True)
    c.slice(1, ["10.244.1.2"])
    ops = [str(op) for p in c.sync(full=True).plans for op in p.ops()]
    assert ops == [f"ipvsadm -d -t {_vip(1)}:80 -r 10.244.2.2:8080"]


def _stale(c: Cluster, address: str) -> VirtualKey:
    """A virtual service of ours left by an earlier run: its address on kube-ipvs0."""
    key = VirtualKey(L4.TCP, address, 80)
    c.kernel.send(
        V4,
        [Op("add-service", V4, service=VirtualServer(key)), Op("add-address", V4, address=address)],
    )
    return key


def test_stale_services_go_but_those_in_exclude_cidrs_stay() -> None:
    c = Cluster(3, exclude_cidrs=(ipaddress.ip_network("10.100.0.0/16"),))
    c.sync(full=True)
    stale = _stale(c, "10.99.0.1")
    kept = _stale(c, "10.100.0.1")
    c.sync(full=True)
    virtual = c.held().virtual
    assert stale not in virtual
    assert kept in virtual
    assert "10.100.0.1" not in c.held().addresses  # the address is ours: it goes


def test_foreign_services_and_sets_are_never_touched() -> None:
    c = Cluster(3)
    foreign = VirtualKey(L4.TCP, "192.0.2.1", 443)
    mine = IpsetSpec("mine", "hash:ip", V4)
    c.kernel.send(
        V4,
        [
            Op("add-service", V4, service=VirtualServer(foreign, "wlc")),
            Op("add-real", V4, key=foreign, real=RealServer(RealKey("192.0.2.10", 443), 5)),
            Op("create-set", V4, ipset=mine),
            Op("add-entry", V4, ipset=mine, entry="192.0.2.10"),
        ],
    )
    c.sync(full=True)
    c.sync(full=True)
    held = c.held()
    assert held.virtual[foreign] == VirtualServer(foreign, "wlc")
    assert held.real[foreign][RealKey("192.0.2.10", 443)].weight == 5
    c.backend.cleanup()
    after = c.kernel.dump(V4)
    assert set(after.virtual) == {foreign}
    assert "mine" in c.kernel.sets and c.kernel.entries["mine"] == {"192.0.2.10"}
    assert not after.link and c.backend.leftovers() == []


def _failing_once(kernel: FakeIpvs) -> Callable[[], None]:
    real = kernel.send
    armed = [True]

    def send(family: IPFamily, ops: Any) -> int:
        if armed[0]:
            armed[0] = False
            raise BackendError("simulated refusal")
        return real(family, ops)

    kernel.send = send  # type: ignore[method-assign]
    return lambda: None


def test_a_refused_apply_makes_the_next_sync_full_and_it_reconciles() -> None:
    c = Cluster(5)
    c.sync(full=True)
    c.slice(2, ["10.244.1.3", "10.244.2.3", "10.244.2.77"])
    _failing_once(c.kernel)
    with pytest.raises(BackendError, match="simulated refusal"):
        c.sync()
    again = c.sync()
    assert again.full, "after a refusal the next sync reads the kernel back in full"
    assert RealKey("10.244.2.77", 8080) in c.held().real[_key(2)]


def test_plans_send_creations_before_the_rules_and_removals_after() -> None:
    c = Cluster(3)
    full = c.sync(full=True)
    kinds = [op.kind for op in full.plans[0].before]
    assert kinds == sorted(kinds, key=BEFORE.index)
    assert kinds[0] == "add-link"
    c.state.delete_service("default", "svc-2")
    c.state.delete_endpoint_slice("default", "svc-2-slice")
    gone = c.sync()
    p = gone.plans[0]
    assert {op.kind for op in p.after} >= {"del-service", "del-address"}
    assert [op.kind for op in p.after] == sorted((op.kind for op in p.after), key=AFTER.index)
    assert not any(op.kind.startswith("del") for op in p.before)


def test_reconcile_alone_diffs_only_the_touched_keys() -> None:
    k1, k2 = VirtualKey(L4.TCP, "10.96.0.1", 80), VirtualKey(L4.TCP, "10.96.0.2", 80)
    held = Held(V4, link=True)
    held.apply(
        [
            Op("add-service", V4, service=VirtualServer(k1)),
            Op("add-service", V4, service=VirtualServer(k2)),
        ]
    )
    # The desired state lacks k2, but only k1 was touched: k2 stays for this partial sync.
    want = FamilyState(V4, virtual={k1: VirtualServer(k1, "lc")})

    @dataclasses.dataclass
    class Update:
        full: bool
        state: FamilyState
        touched_virtual: frozenset[VirtualKey]
        touched_addresses: frozenset[str] = frozenset()
        touched_entries: frozenset[tuple[str, str]] = frozenset()
        iptables: str = ""

    done = reconcile(Update(False, want, frozenset({k1})), held, ownership=Ownership())
    assert [str(o) for o in done.plan.ops()] == ["ipvsadm -E -t 10.96.0.1:80 -s lc"]
    full = reconcile(Update(True, want, frozenset()), held, ownership=Ownership())
    assert [str(o) for o in full.plan.ops()] == ["ipvsadm -E -t 10.96.0.1:80 -s lc"]
    # On a node address only NodePorts are the mode's: a foreign service on port 80 stays.
    k3 = VirtualKey(L4.TCP, "10.96.0.2", 30080)
    held.apply([Op("add-service", V4, service=VirtualServer(k3))])
    mine = Ownership(node_addresses=frozenset({"10.96.0.2"}))
    owned = [
        str(o) for o in reconcile(Update(True, want, frozenset()), held, ownership=mine).plan.ops()
    ]
    assert "ipvsadm -D -t 10.96.0.2:30080" in owned
    assert "ipvsadm -D -t 10.96.0.2:80" not in owned
