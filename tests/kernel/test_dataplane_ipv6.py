"""IPv6 dataplane behaviour in the dual-stack namespace cluster, once per installed mode.

Services are dual-stack (an IPv4 and an IPv6 ClusterIP, ``ipFamilies`` of both) and have one
EndpointSlice per family; the cases drive the IPv6 side: load spreading, reject without
endpoints, NodePorts from the external host (with the client address kept under
externalTrafficPolicy Local), hairpin, UDP. Outcomes are traffic; only the chain-name case looks
at the kernel (``ip6tables-save``, iptables mode).

One dual-stack lab per mode and module, reset (agents cleaned up, rulesets and conntrack
flushed, fresh agents) before every test.
"""

from __future__ import annotations

import base64
import hashlib
import shlex
from collections.abc import Iterator
from typing import Any

import pytest
from dataplane_kit import shared_dataplane

from kubeplex.core.dataplane import plugins
from kubeplex.core.model.types import IPFamily
from kubeplex.testing.dataplane import (
    DataplaneCluster,
    endpoint_slice,
    service,
)
from kubeplex.testing.netlab import (
    CLIENT_POD,
    EXTERNAL,
    NODE1,
    NODE2,
    UDP_PORT,
    WEB_A,
    WEB_B,
    WEB_C,
    ProbeResult,
    tally,
)

pytestmark = pytest.mark.kernel

#: The modes this suite covers, as far as their backend is installed here.
MODES = [m for m in ("iptables", "nftables") if m in plugins.available()]

V6 = IPFamily.IPv6
WEB = "web"
WEB_VIP = "10.96.88.59"
WEB_VIP6 = "fd00:96::59"
NODEPORT = 30080
CLIENT_IP = "10.244.1.3"
CLIENT_IP6 = "fd00:10:244:1::3"
EXTERNAL_IP6 = "fd00:18::10"
WEBS = (WEB_A, WEB_B, WEB_C)
#: chi-square critical value at p = 0.001 with 2 degrees of freedom (three endpoints).
CHI2_CRIT_2DOF_0001 = 13.82


# ------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module", params=MODES)
def shared(request: pytest.FixtureRequest) -> Iterator[DataplaneCluster]:
    """One dual-stack lab per mode for the module."""
    yield from shared_dataplane(request.param, ipv6=True)


# -------------------------------------------------------------------------------------- helpers


def ip6_of(dp: DataplaneCluster, name: str) -> str:
    return dp.lab.spec.ip_of(name, ipv6=True)


def web(
    dp: DataplaneCluster,
    pods: tuple[str, ...] = WEBS,
    *,
    name: str = WEB,
    vip: str = WEB_VIP,
    vip6: str = WEB_VIP6,
    port: int = 80,
    target_port: int = 8080,
    protocol: str = "TCP",
    **svc: Any,
) -> list[dict[str, Any]]:
    """Dual-stack Service ``name`` and one EndpointSlice per family of ``pods``."""
    return [
        service(
            name,
            vip,
            port,
            target_port=target_port,
            protocol=protocol,
            secondary_cluster_ip=vip6,
            **svc,
        ),
        endpoint_slice(
            name, dp.endpoints(*pods), port=target_port, protocol=protocol, name=f"{name}-v4"
        ),
        endpoint_slice(
            name,
            dp.endpoints(*pods, family=V6),
            port=target_port,
            protocol=protocol,
            name=f"{name}-v6",
            address_type="IPv6",
        ),
    ]


def synced(dp: DataplaneCluster, *objects: dict[str, Any]) -> None:
    dp.set(*objects)
    dp.sync_or_raise()


def hosts(results: list[ProbeResult]) -> set[str]:
    """The client addresses pods reported (``ip:port`` / ``[ip]:port``, without the port)."""
    out = set()
    for r in results:
        host = (r.body or "").rsplit(":", 1)[0]
        out.add(host[1:-1] if host.startswith("[") else host)
    return out


def all_ok(results: list[ProbeResult]) -> bool:
    return all(r.ok for r in results)


def upstream_hash(text: str) -> str:
    """upstream kube-proxy's chain suffix: base32(sha256(text)), first 16 characters."""
    return base64.b32encode(hashlib.sha256(text.encode()).digest()).decode()[:16]


# ---------------------------------------------------------------------------------------- cases


def test_ipv6_clusterip_spreads_evenly_over_endpoints(dp: DataplaneCluster) -> None:
    synced(dp, *web(dp))
    results = dp.lab.http(CLIENT_POD, WEB_VIP6, 80, count=150)
    counts = tally(results)
    assert sum(counts[w] for w in WEBS) == 150, counts
    chi2 = sum((counts[w] - 50) ** 2 / 50 for w in WEBS)
    assert chi2 < CHI2_CRIT_2DOF_0001, (chi2, counts)


def test_dual_stack_service_answers_on_both_families_without_snat(dp: DataplaneCluster) -> None:
    synced(dp, *web(dp))
    seen6 = dp.lab.http(CLIENT_POD, WEB_VIP6, 80, "/clientip", count=6)
    assert all_ok(seen6) and hosts(seen6) == {CLIENT_IP6}, seen6
    seen4 = dp.lab.http(CLIENT_POD, WEB_VIP, 80, "/clientip", count=6)
    assert all_ok(seen4) and hosts(seen4) == {CLIENT_IP}, seen4
    # The IPv6 ClusterIP reaches the IPv6 endpoints from the other node too.
    counts = tally(dp.lab.http(WEB_B, WEB_VIP6, 80, count=30))
    assert set(counts) <= set(WEBS) and sum(counts.values()) == 30, counts


def test_ipv6_service_without_endpoints_is_refused_at_once(dp: DataplaneCluster) -> None:
    synced(
        dp,
        service("empty", "10.96.0.30", 80, target_port=8080, secondary_cluster_ip="fd00:96::30"),
        # Ready in IPv4, but its only IPv6 endpoint is neither ready nor serving.
        service("notready", "10.96.0.31", 80, target_port=8080, secondary_cluster_ip="fd00:96::31"),
        endpoint_slice("notready", dp.endpoints(WEB_A), port=8080, name="notready-v4"),
        endpoint_slice(
            "notready",
            dp.endpoints(WEB_A, family=V6, ready=False),
            port=8080,
            name="notready-v6",
            address_type="IPv6",
        ),
        service(
            "empty-udp",
            "10.96.0.32",
            53,
            target_port=UDP_PORT,
            protocol="UDP",
            secondary_cluster_ip="fd00:96::32",
        ),
    )
    for vip in ("fd00:96::30", "fd00:96::31"):
        [r] = dp.lab.http(CLIENT_POD, vip, 80, timeout=3.0)
        assert r.outcome == "refused", (vip, r)
        # Rejected, not dropped: refused well before the 3 s timeout. Not within 500 ms as in
        # IPv4: the ICMPv6 error for the first SYN arrives while connect() still holds the
        # socket (it is generated in the same softirq run on this one host), TCPv6 keeps it as
        # a soft error only (TcpExtLockDroppedIcmps), and the SYN retransmit 1 s later is what
        # fails. A kernel property of same-host rejects, not of the rules.
        assert r.ms < 1500, (vip, r)
    # UDP has no such lock: the port-unreachable is reported at once.
    [r] = dp.lab.udp(CLIENT_POD, "fd00:96::32", 53, timeout=3.0)
    assert r.outcome == "refused" and r.ms < 500, r
    # The families are independent: the IPv4 side of "notready" has its endpoint.
    assert tally(dp.lab.http(CLIENT_POD, "10.96.0.31", 80, count=2)) == {WEB_A: 2}


def test_ipv6_nodeport_cluster_policy_from_external_host(dp: DataplaneCluster) -> None:
    synced(dp, *web(dp, type="NodePort", node_port=NODEPORT))
    node1_ip6, node2_ip6 = ip6_of(dp, NODE1), ip6_of(dp, NODE2)

    from_external = dp.lab.http(EXTERNAL, node1_ip6, NODEPORT, count=12)
    assert all_ok(from_external), tally(from_external)
    assert {WEB_B, WEB_C} & set(tally(from_external))  # forwarded to the other node too
    assert all_ok(dp.lab.http(EXTERNAL, node2_ip6, NODEPORT, count=6))
    # Cluster policy masquerades: the pods never see the external client's address.
    seen = dp.lab.http(EXTERNAL, node1_ip6, NODEPORT, "/clientip", count=6)
    assert all_ok(seen) and EXTERNAL_IP6 not in hosts(seen), seen


def test_ipv6_nodeport_from_nodes_and_pods_but_not_on_loopback(dp: DataplaneCluster) -> None:
    synced(dp, *web(dp, type="NodePort", node_port=NODEPORT))
    node1_ip6, node2_ip6 = ip6_of(dp, NODE1), ip6_of(dp, NODE2)
    for src, dst in ((NODE1, node1_ip6), (NODE2, node1_ip6), (CLIENT_POD, node2_ip6)):
        results = dp.lab.http(src, dst, NODEPORT, count=6)
        assert all_ok(results) and set(tally(results)) <= set(WEBS), (src, dst, results)
    # Like upstream, NodePorts are never served on IPv6 loopback (the jump to KUBE-NODEPORTS
    # excludes ::1): nothing listens there, so the node itself refuses.
    [r] = dp.lab.http(NODE1, "::1", NODEPORT, timeout=1.0)
    assert r.outcome == "refused", r


def test_ipv6_nodeport_local_policy_keeps_client_ip(dp: DataplaneCluster) -> None:
    # The only endpoint is web-a on kind-worker: kind-worker2 has no local endpoint.
    synced(
        dp,
        *web(dp, (WEB_A,), type="NodePort", node_port=NODEPORT, external_traffic_policy="Local"),
    )
    node1_ip6, node2_ip6 = ip6_of(dp, NODE1), ip6_of(dp, NODE2)
    seen = dp.lab.http(EXTERNAL, node1_ip6, NODEPORT, "/clientip", count=3)
    assert all_ok(seen) and hosts(seen) == {EXTERNAL_IP6}, seen
    [dropped] = dp.lab.http(EXTERNAL, node2_ip6, NODEPORT, timeout=1.0)
    assert dropped.outcome == "timeout", dropped  # dropped, not refused
    assert tally(dp.lab.http(EXTERNAL, node1_ip6, NODEPORT, count=2)) == {WEB_A: 2}


def test_ipv6_hairpin_pod_reaches_itself_through_its_service(dp: DataplaneCluster) -> None:
    synced(dp, *web(dp, (WEB_A,), name="self", vip="10.96.0.20", vip6="fd00:96::20"))
    assert tally(dp.lab.http(WEB_A, "fd00:96::20", 80, count=3)) == {WEB_A: 3}
    seen = dp.lab.http(WEB_A, "fd00:96::20", 80, "/clientip", count=3)
    # Masqueraded: with its own address as source, the reply would never be un-NATed.
    assert all_ok(seen) and ip6_of(dp, WEB_A) not in hosts(seen), seen


def test_ipv6_udp_service_echoes_and_keeps_client_ip(dp: DataplaneCluster) -> None:
    synced(
        dp,
        *web(
            dp,
            name="dns",
            vip="10.96.0.10",
            vip6="fd00:96::10",
            port=53,
            target_port=UDP_PORT,
            protocol="UDP",
        ),
    )
    counts = tally(dp.lab.udp(CLIENT_POD, "fd00:96::10", 53, count=9))
    assert set(counts) <= set(WEBS) and sum(counts.values()) == 9, counts
    seen = dp.lab.udp(CLIENT_POD, "fd00:96::10", 53, payload="clientip", count=3)
    assert all_ok(seen) and hosts(seen) == {CLIENT_IP6}, seen


def test_ip6tables_chains_use_upstreams_hashed_names(dp: DataplaneCluster) -> None:
    if dp.mode != "iptables":
        pytest.skip(f"mode {dp.mode} has no ip6tables chains")
    synced(dp, *web(dp))
    svc_chain = "KUBE-SVC-" + upstream_hash("default/webtcp")
    save6 = dp.lab.exec(NODE1, ["ip6tables-save", "-t", "nat"]).stdout
    save4 = dp.lab.exec(NODE1, ["iptables-save", "-t", "nat"]).stdout
    rules6 = [shlex.split(ln) for ln in save6.splitlines() if ln.startswith("-A ")]

    def jumps_of(rules: list[list[str]], chain: str) -> list[list[str]]:
        return [r for r in rules if r[1] == chain and "-j" in r]

    [capture] = [r for r in jumps_of(rules6, "KUBE-SERVICES") if "default/web cluster IP" in r]
    assert capture[capture.index("-d") + 1] == f"{WEB_VIP6}/128", capture
    assert capture[capture.index("-j") + 1] == svc_chain, (capture, save6)
    assert f":{svc_chain} " in save6
    # The same name in both families: it hashes the service port, not an address.
    assert f"-d {WEB_VIP}/32" in save4 and f"-j {svc_chain}" in save4, save4

    # Endpoint chains hash "[ip]:port" for IPv6 (upstream's net.JoinHostPort).
    seps = {
        r[r.index("--comment") + 1].rsplit(" -> ", 1)[-1]: r[r.index("-j") + 1]
        for r in jumps_of(rules6, svc_chain)
        if r[r.index("-j") + 1].startswith("KUBE-SEP-")
    }
    expected = {
        f"[{ip6_of(dp, w)}]:8080": "KUBE-SEP-"
        + upstream_hash(f"default/webtcp[{ip6_of(dp, w)}]:8080")
        for w in WEBS
    }
    assert seps == expected, save6
    for address, chain in expected.items():
        [dnat] = [r for r in jumps_of(rules6, chain) if "DNAT" in r]
        assert dnat[dnat.index("--to-destination") + 1] == address, dnat
