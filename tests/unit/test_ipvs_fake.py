"""FakeIpvs refuses what the kernel refuses, and keeps what it keeps."""

from __future__ import annotations

import pytest

from kubeplex.backends.ipvs.plan import (
    FamilyState,
    IpsetSpec,
    Op,
    RealKey,
    RealServer,
    VirtualKey,
    VirtualServer,
)
from kubeplex.core.model.errors import BackendError
from kubeplex.core.model.types import IPFamily
from kubeplex.core.model.types import Protocol as L4
from kubeplex.testing import fakes
from kubeplex.testing.fakes import FakeIpvs

V4, V6 = IPFamily.IPv4, IPFamily.IPv6
KEY = VirtualKey(L4.TCP, "10.96.0.10", 80)
VS = VirtualServer(KEY)
REAL = RealServer(RealKey("10.244.1.5", 8080))
SET = IpsetSpec("KUBE-CLUSTER-IP", "hash:ip,port", V4)


def _refused(kernel: FakeIpvs, ops: list[Op], message: str, family: IPFamily = V4) -> None:
    with pytest.raises(BackendError, match=message):
        kernel.send(family, ops)


def test_for_mode_gives_a_fresh_one() -> None:
    one, two = fakes.for_mode("ipvs"), fakes.for_mode("ipvs")
    assert isinstance(one, FakeIpvs) and one is not two


def test_ipvs_refusals() -> None:
    k = FakeIpvs()
    k.send(V4, [Op("add-service", V4, service=VS), Op("add-real", V4, key=KEY, real=REAL)])
    _refused(k, [Op("add-service", V4, service=VS)], "Service already exists")
    _refused(k, [Op("add-real", V4, key=KEY, real=REAL)], "Destination already exists")
    other = VirtualKey(L4.TCP, "10.96.0.11", 80)
    _refused(k, [Op("del-service", V4, key=other)], "No such service")
    _refused(k, [Op("add-real", V4, key=other, real=REAL)], "No such service")
    gone = RealServer(RealKey("10.244.1.6", 8080))
    _refused(k, [Op("del-real", V4, key=KEY, real=gone)], "No such destination")
    _refused(k, [Op("add-service", V4, service=VirtualServer(other, "nope"))], "Scheduler")
    six = VirtualKey(L4.TCP, "fd00::10", 80)
    _refused(k, [Op("add-service", V4, service=VirtualServer(six))], "family")


def test_send_stops_at_the_first_refusal_and_keeps_what_came_before() -> None:
    k = FakeIpvs()
    ops = [
        Op("add-service", V4, service=VS),
        Op("add-service", V4, service=VS),
        Op("add-real", V4, key=KEY, real=REAL),
    ]
    _refused(k, ops, r"ipvsadm -A -t 10.96.0.10:80 -s rr: Service already exists \(1 of 3")
    assert set(k.dump(V4).virtual) == {KEY}
    assert k.dump(V4).real[KEY] == {}
    assert k.sent[-1].startswith("! ")


def test_link_and_addresses() -> None:
    k = FakeIpvs()
    _refused(k, [Op("add-address", V4, address="10.96.0.10")], "Cannot find device")
    k.send(V4, [Op("add-link", V4), Op("add-address", V4, address="10.96.0.10")])
    k.send(V6, [Op("add-link", V6)])  # both families ensure the one link
    assert k.dump(V6).link
    _refused(k, [Op("add-address", V4, address="10.96.0.10")], "File exists")
    _refused(k, [Op("del-address", V4, address="10.96.0.11")], "Cannot assign")
    _refused(k, [Op("add-address", V4, address="fd00::1")], "family")
    k.send(V6, [Op("add-address", V6, address="fd00::1")])
    assert k.dump(V4).addresses == {"10.96.0.10"} and k.dump(V6).addresses == {"fd00::1"}
    assert k.delete_link() and not k.dump(V4).link and not k.dump(V6).addresses


@pytest.mark.parametrize(
    ("kind", "good", "bad"),
    [
        ("hash:ip,port", "10.96.0.10,tcp:80", "10.96.0.10:80"),
        ("hash:ip,port,ip", "10.244.1.2,tcp:80,10.244.1.2", "10.244.1.2,tcp:80"),
        ("hash:ip,port,net", "1.2.3.4,tcp:80,10.0.0.0/8", "1.2.3.4,tcp:80,10.0.0.1"),
        ("hash:ip", "10.96.0.10", "10.96.0.10,tcp:80"),
        ("bitmap:port", "30080", "70000"),
    ],
)
def test_entries_are_checked_against_the_set_type(kind: str, good: str, bad: str) -> None:
    k = FakeIpvs()
    spec = IpsetSpec("KUBE-X", kind, V4)
    k.send(V4, [Op("create-set", V4, ipset=spec), Op("add-entry", V4, ipset=spec, entry=good)])
    _refused(k, [Op("add-entry", V4, ipset=spec, entry=bad)], "Syntax error")
    _refused(k, [Op("add-entry", V4, ipset=spec, entry=good)], "already added")
    assert k.dump(V4).entries["KUBE-X"] == {good}


def test_set_refusals() -> None:
    k = FakeIpvs()
    _refused(k, [Op("add-entry", V4, ipset=SET, entry="10.96.0.10,tcp:80")], "does not exist")
    k.send(V4, [Op("create-set", V4, ipset=SET)])
    _refused(k, [Op("create-set", V4, ipset=SET)], "same name already exists")
    _refused(k, [Op("add-entry", V4, ipset=SET, entry="fd00::1,tcp:80")], "family")
    _refused(k, [Op("del-entry", V4, ipset=SET, entry="10.96.0.10,tcp:80")], "not added")
    k.restore(
        V4, "*nat\n-A PREROUTING -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT\nCOMMIT\n"
    )
    _refused(k, [Op("destroy-set", V4, ipset=SET)], "in use by a kernel component")
    k.restore(V4, "*nat\n-F PREROUTING\nCOMMIT\n")
    k.send(V4, [Op("destroy-set", V4, ipset=SET)])
    assert k.dump(V4).ipsets == {}


def test_connection_counts_and_the_dump() -> None:
    k = FakeIpvs()
    k.send(V4, [Op("add-service", V4, service=VS), Op("add-real", V4, key=KEY, real=REAL)])
    k.set_connections(V4, "-t 10.96.0.10:80", "10.244.1.5:8080", active=2, inactive=1)
    conns = k.connections(V4, [(KEY, REAL.key)])
    assert (conns[(KEY, REAL.key)].active, conns[(KEY, REAL.key)].inactive) == (2, 1)
    state = k.dump(V4, connections=True)
    assert isinstance(state, FamilyState)
    assert state.lines() == [
        "link kube-ipvs0 (absent)",
        "-A -t 10.96.0.10:80 -s rr",
        "-a -t 10.96.0.10:80 -r 10.244.1.5:8080 -m -w 1",
    ]
    k.send(V4, [Op("del-real", V4, key=KEY, real=REAL)])
    assert k.connections(V4, [(KEY, REAL.key)]) == {}


def test_timeouts_missing_and_writes() -> None:
    k = FakeIpvs(lacking=["kernel module 'ip_vs' is missing"], schedulers=frozenset({"rr"}))
    k.set_timeouts(0, 30, 0)
    assert k.timeouts == (900, 30, 300)
    assert k.missing("rr") == ["kernel module 'ip_vs' is missing"]
    assert "ip_vs_mh" in k.missing("mh")[-1]
    assert FakeIpvs.writes == ("send", "restore")
