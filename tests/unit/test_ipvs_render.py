"""The IPVS mode's pure render, against upstream kube-proxy's IPVS mode (no root, no kernel).

Upstream reference: pkg/proxy/ipvs/proxier.go (syncProxyRules, syncEndpoint,
writeIptablesRules, acceptIPVSTraffic, the ipsetInfo and ipsetWithIptablesChain tables),
pkg/proxy/ipvs/ipset.go (set names and comments, ``KUBE-6-`` for IPv6) and
pkg/proxy/ipvs/ipset (``Entry.String``). Ported scenarios use upstream's fake proxier's node
("test-hostname", 192.168.0.2) and its Services (render_kit).

The desired state prints as ``FamilyState.lines()`` (``ip``/``ipset save``/``ipvsadm -S -n``
lines) followed by the iptables-restore input. Golden files live in tests/unit/golden/ipvs/;
``KUBEPLEX_UPDATE_GOLDEN=1 pytest tests/unit/test_ipvs_render.py`` rewrites them (review the
diff line by line before committing).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from kits import render_kit
from kits.render_kit import (
    LAB,
    NODE,
    NODE_IP,
    V4,
    V6,
    assert_golden_file,
    endpoint_slice,
    ep,
    etp_local_objects,
    lb_source_ranges_objects,
    overall_objects,
    port,
    service,
    svc1,
)

from kubeplex.backends.ipvs import ipsets as S
from kubeplex.backends.ipvs import rules
from kubeplex.backends.ipvs.desired import DesiredRenderer, DesiredUpdate, SetView
from kubeplex.backends.ipvs.plan import FamilyState, RealKey, VirtualKey
from kubeplex.backends.ipvs.settings import IpvsSettings, ipvs_settings
from kubeplex.backends.netfilter.iptables import SavedRuleset
from kubeplex.core.config.kubeproxy import KubeProxyConfiguration, load_config, with_overrides
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.types import IPFamily
from kubeplex.core.model.types import Protocol as L4
from kubeplex.core.sources.manifests import ManifestSource

GOLDEN = Path(__file__).parent / "golden" / "ipvs"
TCP, UDP, SCTP = L4.TCP, L4.UDP, L4.SCTP


def config(fields: Mapping[str, Any]) -> KubeProxyConfiguration:
    return render_kit.config({"mode": "ipvs", **fields})


def node_obj(addresses: Sequence[str] = (NODE_IP,)) -> dict[str, Any]:
    return render_kit.node_obj(addresses)


class Harness:
    """ClusterState + one DesiredRenderer per family, fed and rendered as a backend would."""

    def __init__(
        self,
        objects: Iterable[Mapping[str, Any]],
        cfg: Mapping[str, Any] | KubeProxyConfiguration = {},  # noqa: B006 - read only
        families: tuple[IPFamily, ...] = (V4,),
        node: str = NODE,
        addresses: tuple[str, ...] | None = None,
    ) -> None:
        self.cfg = cfg if isinstance(cfg, KubeProxyConfiguration) else config(cfg)
        self.cluster = ClusterState(node, families)
        self.renderers: dict[IPFamily, DesiredRenderer] = {}
        #: The node's interface addresses but kube-ipvs0's (None: the Node's).
        self.addresses = addresses
        self.feed(objects)

    def feed(self, objects: Iterable[Mapping[str, Any]]) -> None:
        for obj in objects:
            {
                "Service": self.cluster.set_service,
                "EndpointSlice": self.cluster.set_endpoint_slice,
                "Node": self.cluster.set_node,
                "ServiceCIDR": self.cluster.set_service_cidr,
            }[obj["kind"]](obj)

    def settings(self, family: IPFamily) -> IpvsSettings:
        return ipvs_settings(self.cfg, self.cluster.checkout().node, family, self.addresses)

    def render(self, full: bool = False) -> dict[IPFamily, DesiredUpdate]:
        state = self.cluster.checkout(full=full)
        out = {}
        for family, graph in state.graphs.items():
            s = ipvs_settings(self.cfg, state.node, family, self.addresses)
            r = self.renderers.get(family)
            if r is None:
                r = self.renderers[family] = DesiredRenderer(s)
            elif r.settings != s:
                r.settings, r.force_full = s, True
            out[family] = r.render(graph, state.changes[family])
        return out

    def one(self, full: bool = True, family: IPFamily = V4) -> DesiredUpdate:
        return self.render(full)[family]


def printed(updates: Mapping[IPFamily, DesiredUpdate]) -> str:
    out = []
    for family, u in updates.items():
        out.append(f"# desired state ({family.value})")
        out += u.state.lines()
        tool = "ip6tables-restore" if family is V6 else "iptables-restore"
        out.append(f"# {tool} --noflush input ({family.value})")
        out.append(u.iptables.rstrip("\n"))
    return "\n".join(out) + "\n"


def assert_golden(name: str, updates: Mapping[IPFamily, DesiredUpdate]) -> None:
    assert_golden_file(GOLDEN / f"{name}.txt", printed(updates), "rendered IPVS state differs")


def reals(state: FamilyState, proto: L4, ip: str, vport: int) -> set[str]:
    return {str(rk) for rk in state.real.get(VirtualKey(proto, ip, vport), {})}


def entries(state: FamilyState, name: str) -> set[str]:
    return set(state.entries.get(name, ()))


def nat_rules(u: DesiredUpdate) -> list[str]:
    return _table(u.iptables, "nat")


def filter_rules(u: DesiredUpdate) -> list[str]:
    return _table(u.iptables, "filter")


def _table(text: str, table: str) -> list[str]:
    saved = SavedRuleset.parse(text)
    return saved.rules.get(table, [])


# --- 1. the seed lab ------------------------------------------------------------------------


def lab_harness() -> Harness:
    base = load_config(LAB / "config.yaml")
    cfg = with_overrides(base, mode="ipvs")
    h = Harness([], cfg, families=(V4, V6), node=cfg.hostname_override)
    source = ManifestSource(LAB / "manifests", h.cluster)
    source.load()
    assert not source.problems and not h.cluster.invalid
    return h


def test_seed_lab_golden() -> None:
    assert_golden("seed-lab", lab_harness().render(full=True))


def test_seed_lab_is_what_the_issue_asks_for() -> None:
    """Both ClusterIPs with three masquerading real servers each, the NodePort on the node
    address, every Service IP on kube-ipvs0."""
    st = lab_harness().one()
    three = {"10.244.1.2:8080", "10.244.2.2:8080", "10.244.2.3:8080"}
    assert reals(st.state, TCP, "10.96.88.59", 80) == three
    assert reals(st.state, TCP, "10.96.223.155", 80) == three
    assert reals(st.state, TCP, "172.18.0.5", 30080) == three
    assert set(st.state.virtual) == {
        VirtualKey(TCP, "10.96.88.59", 80),
        VirtualKey(TCP, "10.96.223.155", 80),
        VirtualKey(TCP, "172.18.0.5", 30080),
    }
    assert set(st.state.addresses) == {"10.96.88.59", "10.96.223.155"}
    assert entries(st.state, "KUBE-IPVS-IPS") == {"10.96.88.59", "10.96.223.155"}
    assert entries(st.state, "KUBE-NODE-PORT-TCP") == {"30080"}
    # Hairpin: the one local endpoint, ip,proto:port,ip (Entry.String of hash:ip,port,ip).
    assert entries(st.state, "KUBE-LOOP-BACK") == {"10.244.1.2,tcp:8080,10.244.1.2"}
    lines = st.state.lines()
    assert "-a -t 10.96.88.59:80 -r 10.244.2.2:8080 -m -w 1" in lines
    assert "-A -t 10.96.88.59:80 -s rr" in lines


def test_the_render_reads_no_kernel_and_every_set_exists() -> None:
    st = lab_harness().one()
    # Upstream creates every set of ipsetInfo at every sync, empty or not.
    assert set(st.state.ipsets) == set(S.SETS)
    assert st.state.link and not st.state.connections


# --- 2. the fixed iptables rules ------------------------------------------------------------


def test_fixed_rules_mirror_write_iptables_rules() -> None:
    """writeIptablesRules: the chains of iptablesChains, KUBE-SERVICES starting with the
    localhost RETURN and ending with acceptIPVSTraffic, the postrouting masquerade."""
    u = lab_harness().one()
    text = u.iptables
    assert text.startswith("*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-POSTROUTING - [0:0]\n")
    assert ":KUBE-IPVS-OUT-FILTER - [0:0]\n" in text
    nat = nat_rules(u)
    services = [r for r in nat if r.startswith("-A KUBE-SERVICES ")]
    assert services[0] == "-A KUBE-SERVICES -s 127.0.0.0/8 -j RETURN"
    assert services[-1] == "-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT"
    # The local traffic detector (clusterCIDR): off-cluster sources of a VIP are masqueraded.
    assert (
        '-A KUBE-SERVICES -m comment --comment "Kubernetes service cluster ip + port for'
        ' masquerade purpose" -m set --match-set KUBE-CLUSTER-IP dst,dst ! -s 10.244.0.0/16'
        " -j KUBE-MARK-MASQ"
    ) in nat
    assert "-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT" in nat
    assert (
        '-A KUBE-POSTROUTING -m comment --comment "Kubernetes endpoints dst ip:port, source ip'
        ' for solving hairpin purpose" -m set --match-set KUBE-LOOP-BACK dst,dst,src'
        " -j MASQUERADE"
    ) in nat
    assert nat[-1] == "-A KUBE-MARK-MASQ -j MARK --or-mark 0x00004000"
    filt = filter_rules(u)
    assert filt[-1] == (
        "-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set KUBE-IPVS-IPS dst"
        " -j REJECT"
    )


def test_rules_for_empty_sets_are_left_out() -> None:
    """Upstream writes a set's rule only while the set has entries (isEmpty), except the
    health check and KUBE-IPVS-FILTER rules, written always."""
    u = Harness([node_obj()]).one()
    text = u.iptables
    for name in ("KUBE-CLUSTER-IP dst,dst ! -s", "KUBE-LOOP-BACK", "KUBE-NODE-PORT-TCP"):
        assert name not in text
    assert "-j ACCEPT\n" in text  # forwarding, health check
    assert "-m set --match-set KUBE-CLUSTER-IP dst,dst -j RETURN" in text  # IPVS-FILTER
    assert "KUBE-CLUSTER-IP dst,dst -j ACCEPT" not in text  # acceptIPVSTraffic
    h = Harness([node_obj(), svc1("NodePort"), endpoint_slice("ns1", "svc1", [ep("10.180.0.1")])])
    text = h.one().iptables
    assert "--match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ" in text
    assert "KUBE-NODE-PORT-LOCAL-TCP" not in text


def test_masquerade_all_and_no_local_detector() -> None:
    objects = [node_obj(), svc1(ports=[port()]), endpoint_slice("ns1", "svc1", [ep("10.180.0.1")])]
    rule = (
        '-A KUBE-SERVICES -m comment --comment "Kubernetes service cluster ip + port for'
        ' masquerade purpose" -m set --match-set KUBE-CLUSTER-IP'
    )
    u = Harness(objects, {"iptables": {"masqueradeAll": True}, "clusterCIDR": "10.0.0.0/8"}).one()
    assert f"{rule} dst,dst -j KUBE-MARK-MASQ" in nat_rules(u)
    # No clusterCIDR: upstream masquerades node traffic whose source is a VIP.
    u = Harness(objects, {}).one()
    assert f"{rule} src,dst -j KUBE-MARK-MASQ" in nat_rules(u)
    u = Harness(
        objects,
        {"detectLocalMode": "InterfaceNamePrefix", "detectLocal": {"interfaceNamePrefix": "veth"}},
    ).one()
    assert f"{rule} dst,dst ! -i veth+ -j KUBE-MARK-MASQ" in nat_rules(u)


def test_masquerade_bit() -> None:
    u = Harness([node_obj()], {"iptables": {"masqueradeBit": 1}}).one()
    assert "-A KUBE-MARK-MASQ -j MARK --or-mark 0x00000002" in nat_rules(u)


def test_jumps_from_builtin_chains() -> None:
    """createAndLinkKubeChain's EnsureRule(Prepend): a missing jump is inserted at position 1;
    one that exists is left alone."""
    saved = SavedRuleset.parse(
        "*nat\n:OUTPUT ACCEPT [0:0]\n"
        '-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES\nCOMMIT\n'
    )
    jumps = rules.jump_prelude(saved)
    assert jumps["nat"] == [
        '-I PREROUTING 1 -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
        '-I POSTROUTING 1 -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING',
    ]
    assert jumps["filter"][-1] == (
        '-I OUTPUT 1 -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-OUT-FILTER'
    )
    assert len(jumps["filter"]) == 6
    text = rules.with_jumps(lab_harness().one().iptables, jumps)
    nat, filt = text.split("*filter\n")
    assert nat.endswith(jumps["nat"][-1] + "\nCOMMIT\n")
    assert filt.endswith(jumps["filter"][-1] + "\nCOMMIT\n")


# --- 3. policies ----------------------------------------------------------------------------


def test_external_traffic_policy_local() -> None:
    """TestExternalTrafficPolicyLocal's Service: local endpoints for the external virtual
    services (NodePort, externalIP, LB IP), every endpoint for the ClusterIP; the LOCAL sets
    make the external traffic skip masquerading."""
    h = Harness(etp_local_objects(node_obj(), NODE))
    st = h.one().state
    both = {"10.180.0.1:80", "10.180.2.1:80"}
    assert reals(st, TCP, "172.30.0.41", 80) == both
    for ip, p in (("192.168.99.11", 80), ("1.2.3.4", 80), (NODE_IP, 3001)):
        assert reals(st, TCP, ip, p) == {"10.180.2.1:80"}, ip
    assert entries(st, "KUBE-EXTERNAL-IP-LOCAL") == {"192.168.99.11,tcp:80"}
    assert entries(st, "KUBE-EXTERNAL-IP") == set()
    assert entries(st, "KUBE-LOAD-BALANCER") == {"1.2.3.4,tcp:80"}
    assert entries(st, "KUBE-LOAD-BALANCER-LOCAL") == {"1.2.3.4,tcp:80"}
    assert entries(st, "KUBE-NODE-PORT-TCP") == entries(st, "KUBE-NODE-PORT-LOCAL-TCP") == {"3001"}
    assert entries(st, "KUBE-HEALTH-CHECK-NODE-PORT") == {"30000"}
    nat = nat_rules(h.one())
    local_first = [r for r in nat if r.startswith("-A KUBE-NODE-PORT ")]
    assert "KUBE-NODE-PORT-LOCAL-TCP dst -j RETURN" in local_first[0]
    assert "KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ" in local_first[1]
    assert (
        '-A KUBE-LOAD-BALANCER -m comment --comment "Kubernetes service load balancer ip + port'
        ' with externalTrafficPolicy=local" -m set --match-set KUBE-LOAD-BALANCER-LOCAL dst,dst'
        " -j RETURN"
    ) in nat


def test_external_traffic_policy_local_without_local_endpoints_uses_cluster_ones() -> None:
    """syncEndpoint (PR 97081): no local endpoint -> the cluster endpoints, so pods still reach
    the Service; the Service counts as having no local endpoints."""
    objects = [
        node_obj(),
        svc1("NodePort", externalTrafficPolicy="Local"),
        endpoint_slice("ns1", "svc1", [ep("10.180.0.1", "other-node")]),
    ]
    u = Harness(objects).one()
    assert reals(u.state, TCP, NODE_IP, 3001) == {"10.180.0.1:80"}
    assert u.no_local_endpoints.external == 1
    assert u.no_local_endpoints.internal == 0


def test_internal_traffic_policy_local() -> None:
    """ITP Local: the ClusterIP gets the local endpoints only; without any, none at all (the
    cluster endpoints are not used by a ClusterIP-only Service)."""

    def objs(eps: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            node_obj(),
            svc1(internalTrafficPolicy="Local", ports=[port()]),
            endpoint_slice("ns1", "svc1", eps),
        ]

    u = Harness(objs([ep("10.180.0.1", NODE), ep("10.180.0.2", "other")])).one()
    assert reals(u.state, TCP, "172.30.0.41", 80) == {"10.180.0.1:80"}
    u = Harness(objs([ep("10.180.0.2", "other")])).one()
    assert reals(u.state, TCP, "172.30.0.41", 80) == set()
    assert VirtualKey(TCP, "172.30.0.41", 80) in u.state.virtual
    assert u.no_local_endpoints.internal == 1


def test_no_endpoints_keeps_the_virtual_service_without_real_servers() -> None:
    """IPVS refuses a connection to a virtual service without real servers itself: upstream
    writes no REJECT rule for it."""
    u = Harness([node_obj(), svc1(ports=[port()])]).one()
    assert VirtualKey(TCP, "172.30.0.41", 80) in u.state.virtual
    assert reals(u.state, TCP, "172.30.0.41", 80) == set()
    assert "REJECT" not in u.iptables.replace("KUBE-IPVS-IPS dst -j REJECT", "")


def test_terminating_endpoints_are_used_when_none_is_ready() -> None:
    eps = [
        ep("10.0.1.1", NODE, ready=False, serving=True, terminating=True),
        ep("10.0.1.2", NODE, ready=False, serving=False, terminating=True),
    ]
    u = Harness([node_obj(), svc1(ports=[port()]), endpoint_slice("ns1", "svc1", eps)]).one()
    assert reals(u.state, TCP, "172.30.0.41", 80) == {"10.0.1.1:80"}
    # The hairpin set holds every local endpoint (upstream loops over the endpoints map).
    assert entries(u.state, "KUBE-LOOP-BACK") == {
        "10.0.1.1,tcp:80,10.0.1.1",
        "10.0.1.2,tcp:80,10.0.1.2",
    }


# --- 4. affinity and schedulers -------------------------------------------------------------


def test_session_affinity_is_persistence_with_the_timeout() -> None:
    objects = [
        node_obj(),
        svc1(
            "NodePort",
            sessionAffinity="ClientIP",
            sessionAffinityConfig={"clientIP": {"timeoutSeconds": 300}},
        ),
        endpoint_slice("ns1", "svc1", [ep("10.180.0.1")]),
    ]
    st = Harness(objects).one().state
    for key in st.virtual:
        assert st.virtual[key].persistence == 300
    assert "-A -t 172.30.0.41:80 -s rr -p 300" in st.lines()


@pytest.mark.parametrize(("scheduler", "flags"), [("", ()), ("lc", ()), ("mh", ("flag-2",))])
def test_scheduler_and_upstream_flags(scheduler: str, flags: tuple[str, ...]) -> None:
    objects = [node_obj(), svc1(ports=[port()]), endpoint_slice("ns1", "svc1", [ep("10.180.0.1")])]
    st = Harness(objects, {"ipvs": {"scheduler": scheduler}}).one().state
    vs = st.virtual[VirtualKey(TCP, "172.30.0.41", 80)]
    assert vs.scheduler == (scheduler or "rr")
    assert vs.flags == flags
    if flags:
        assert "-A -t 172.30.0.41:80 -s mh -b flag-2" in st.lines()


# --- 5. NodePorts and nodePortAddresses -----------------------------------------------------


def nodeport_objects() -> list[dict[str, Any]]:
    return [
        node_obj(),
        svc1("NodePort", ports=[port(node_port=3001)]),
        endpoint_slice("ns1", "svc1", [ep("10.180.0.1")]),
    ]


def test_nodeports_on_every_node_address_but_loopback() -> None:
    h = Harness(nodeport_objects(), addresses=("192.168.0.2", "10.0.0.9", "127.0.0.1", "::1"))
    keys = {k for k in h.one().state.virtual if k.port == 3001}
    assert keys == {VirtualKey(TCP, "192.168.0.2", 3001), VirtualKey(TCP, "10.0.0.9", 3001)}


def test_nodeports_only_on_node_port_addresses() -> None:
    h = Harness(
        nodeport_objects(),
        {"nodePortAddresses": ["10.0.0.0/8", "127.0.0.0/8"]},
        addresses=("192.168.0.2", "10.0.0.9", "127.0.0.1"),
    )
    keys = {k for k in h.one().state.virtual if k.port == 3001}
    assert keys == {VirtualKey(TCP, "10.0.0.9", 3001)}
    h = Harness(
        nodeport_objects(), {"nodePortAddresses": ["primary"]}, addresses=("10.0.0.9", NODE_IP)
    )
    keys = {k for k in h.one().state.virtual if k.port == 3001}
    assert keys == {VirtualKey(TCP, NODE_IP, 3001)}


def test_no_node_port_address_means_no_nodeport_and_no_health_check_entry() -> None:
    """Upstream `continue`s past the NodePort (and the health check port) when no node
    address serves NodePorts."""
    objects = [
        node_obj(),
        svc1("LoadBalancer", externalTrafficPolicy="Local", healthCheckNodePort=30000),
        endpoint_slice("ns1", "svc1", [ep("10.180.0.1", NODE)]),
    ]
    st = Harness(objects, {"nodePortAddresses": ["10.99.0.0/16"]}).one().state
    assert {k.port for k in st.virtual} == {80}
    assert entries(st, "KUBE-NODE-PORT-TCP") == set()
    assert entries(st, "KUBE-HEALTH-CHECK-NODE-PORT") == set()


def test_udp_and_sctp_nodeports() -> None:
    """UDP NodePorts go to a bitmap:port set; SCTP ones to a hash:ip,port set, one entry per
    node address, matched dst,dst."""
    objects = [
        node_obj(),
        svc1("NodePort", ports=[port(53, "dns", "UDP", 3053), port(9999, "sctp", "SCTP", 3099)]),
        endpoint_slice(
            "ns1", "svc1", [ep("10.180.0.1")], [port(53, "dns", "UDP"), port(9999, "sctp", "SCTP")]
        ),
    ]
    u = Harness(objects, addresses=(NODE_IP, "10.0.0.9")).one()
    st = u.state
    assert entries(st, "KUBE-NODE-PORT-UDP") == {"3053"}
    assert entries(st, "KUBE-NODE-PORT-SCTP-HASH") == {
        "192.168.0.2,sctp:3099",
        "10.0.0.9,sctp:3099",
    }
    assert entries(st, "KUBE-CLUSTER-IP") == {"172.30.0.41,udp:53", "172.30.0.41,sctp:9999"}
    assert reals(st, SCTP, "10.0.0.9", 3099) == {"10.180.0.1:9999"}
    assert reals(st, UDP, "172.30.0.41", 53) == {"10.180.0.1:53"}
    assert "--sctp-service 172.30.0.41:9999" in "\n".join(st.lines())
    nat = nat_rules(u)
    assert (
        '-A KUBE-NODE-PORT -p sctp -m comment --comment "Kubernetes nodeport SCTP port for'
        " masquerade purpose with type 'hash ip:port'\" -m set --match-set"
        " KUBE-NODE-PORT-SCTP-HASH dst,dst -j KUBE-MARK-MASQ"
    ) in nat
    assert any("-p udp" in r and "KUBE-NODE-PORT-UDP dst" in r for r in nat)


# --- 6. external IPs and load balancers -----------------------------------------------------


def test_external_ips_bound_unless_on_the_node() -> None:
    """An externalIP is bound to kube-ipvs0 unless the node has it on another interface
    (upstream's nodeAddressSet); traffic to it is masqueraded and accepted."""
    objects = [
        node_obj(),
        svc1(ports=[port()], externalIPs=["192.168.99.11", NODE_IP]),
        endpoint_slice("ns1", "svc1", [ep("10.180.0.1")]),
    ]
    u = Harness(objects).one()
    st = u.state
    assert VirtualKey(TCP, NODE_IP, 80) in st.virtual
    assert set(st.addresses) == {"172.30.0.41", "192.168.99.11"}
    assert entries(st, "KUBE-EXTERNAL-IP") == {"192.168.99.11,tcp:80", "192.168.0.2,tcp:80"}
    head = (
        '-A KUBE-SERVICES -m comment --comment "Kubernetes service external ip + port for'
        ' masquerade and filter purpose" -m set --match-set KUBE-EXTERNAL-IP dst,dst'
    )
    nat = nat_rules(u)
    i = nat.index(f"{head} -j KUBE-MARK-MASQ")
    assert (
        nat[i + 1]
        == f"{head} -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT"
    )
    assert nat[i + 2] == f"{head} -m addrtype --dst-type LOCAL -j ACCEPT"


def test_load_balancer_source_ranges() -> None:
    """TestLoadBalancer: one source range holds the node IP, so the node may reach the LB IPs
    (KUBE-LOAD-BALANCER-SOURCE-IP); the FW set sends LB traffic through the source ranges."""
    h = Harness(lb_source_ranges_objects(node_obj()))
    u = h.one()
    st = u.state
    assert entries(st, "KUBE-LOAD-BALANCER-FW") == {"1.2.3.4,tcp:80", "5.6.7.8,tcp:80"}
    assert entries(st, "KUBE-LOAD-BALANCER-SOURCE-CIDR") == {
        f"{ip},tcp:80,{net}"
        for ip in ("1.2.3.4", "5.6.7.8")
        for net in ("192.168.0.0/24", "203.0.113.0/25")
    }
    assert entries(st, "KUBE-LOAD-BALANCER-SOURCE-IP") == {
        "1.2.3.4,tcp:80,1.2.3.4",
        "5.6.7.8,tcp:80,5.6.7.8",
    }
    assert set(st.addresses) == {"172.30.0.41", "1.2.3.4", "5.6.7.8"}
    filt = filter_rules(u)
    assert (
        '-A KUBE-PROXY-FIREWALL -m comment --comment "Kubernetes service load balancer ip + port'
        ' for load balancer with sourceRange" -m set --match-set KUBE-LOAD-BALANCER-FW dst,dst'
        " -j KUBE-SOURCE-RANGES-FIREWALL"
    ) in filt
    assert filt.index("-A KUBE-SOURCE-RANGES-FIREWALL -j DROP") > max(
        i
        for i, r in enumerate(filt)
        if "KUBE-LOAD-BALANCER-SOURCE" in r and "RETURN" in r and "FILTER" not in r
    )
    assert not any(r.startswith("-A KUBE-IPVS-OUT-FILTER") for r in filt)
    nat = nat_rules(u)
    assert (
        '-A KUBE-SERVICES -m comment --comment "Kubernetes service lb portal" -m set'
        " --match-set KUBE-LOAD-BALANCER dst,dst -j KUBE-LOAD-BALANCER"
    ) in nat
    assert "-A KUBE-SERVICES -m set --match-set KUBE-LOAD-BALANCER dst,dst -j ACCEPT" in nat


def test_source_ranges_without_the_node_block_the_node() -> None:
    """Source ranges that leave the node out: KUBE-IPVS-OUT-FILTER drops the node's own
    traffic to the LB IP (PR 119791)."""
    objects = [
        node_obj(),
        svc1("LoadBalancer", loadBalancerSourceRanges=["203.0.113.0/25"], ingress=["1.2.3.4"]),
        endpoint_slice("ns1", "svc1", [ep("10.180.0.1")]),
    ]
    u = Harness(objects).one()
    assert entries(u.state, "KUBE-LOAD-BALANCER-SOURCE-IP") == set()
    assert (
        "-A KUBE-IPVS-OUT-FILTER -s 1.2.3.4 -m ipvs --vaddr 1.2.3.4 --vproto tcp --vport 80 -j DROP"
    ) in filter_rules(u)


def test_a_zero_source_range_is_written_as_two_halves() -> None:
    objects = [
        node_obj(),
        svc1("LoadBalancer", loadBalancerSourceRanges=["0.0.0.0/0"], ingress=["1.2.3.4"]),
        endpoint_slice("ns1", "svc1", [ep("10.180.0.1")]),
    ]
    st = Harness(objects).one().state
    assert entries(st, "KUBE-LOAD-BALANCER-SOURCE-CIDR") == {
        "1.2.3.4,tcp:80,0.0.0.0/1",
        "1.2.3.4,tcp:80,128.0.0.0/1",
    }
    assert entries(st, "KUBE-LOAD-BALANCER-SOURCE-IP") == {"1.2.3.4,tcp:80,1.2.3.4"}


def test_upstream_overall_golden() -> None:
    assert_golden("upstream-overall", Harness(overall_objects(node_obj(), NODE)).render(full=True))


# --- 7. IPv6 ---------------------------------------------------------------------------------


def test_ipv6_set_names_and_rules() -> None:
    """NewIPSet: KUBE-6- instead of KUBE-, cut to 31 characters; entries unbracketed."""
    assert S.set_name("KUBE-LOAD-BALANCER-SOURCE-CIDR", V6) == "KUBE-6-LOAD-BALANCER-SOURCE-CID"
    assert S.set_name("KUBE-NODE-PORT-LOCAL-SCTP-HASH", V6) == "KUBE-6-NODE-PORT-LOCAL-SCTP-HAS"
    assert all(len(n) <= 31 for n in S.specs(V6))
    objects = [
        node_obj((NODE_IP, "2001:db8::1")),
        service("ns1", "svc1", "fd00:10::1", [port(node_port=3001)], type="NodePort"),
        endpoint_slice("ns1", "svc1", [ep("fd00:20::5", NODE)], family="IPv6"),
    ]
    u = Harness(objects, {"clusterCIDR": "10.0.0.0/8,fd00:20::/64"}, families=(V4, V6)).one(
        family=V6
    )
    st = u.state
    assert entries(st, "KUBE-6-CLUSTER-IP") == {"fd00:10::1,tcp:80"}
    assert entries(st, "KUBE-6-LOOP-BACK") == {"fd00:20::5,tcp:80,fd00:20::5"}
    assert entries(st, "KUBE-6-NODE-PORT-TCP") == {"3001"}
    assert reals(st, TCP, "2001:db8::1", 3001) == {"[fd00:20::5]:80"}
    assert "-a -t [fd00:10::1]:80 -r [fd00:20::5]:80 -m -w 1" in st.lines()
    assert (
        "create KUBE-6-CLUSTER-IP hash:ip,port family inet6 hashsize 1024 maxelem 65536"
        in st.lines()
    )
    nat = nat_rules(u)
    assert nat[0] == "-A KUBE-SERVICES -s ::1/128 -j RETURN"
    assert any("KUBE-6-CLUSTER-IP dst,dst ! -s fd00:20::/64 -j KUBE-MARK-MASQ" in r for r in nat)


# --- 8. partial renders ---------------------------------------------------------------------


def two_services() -> list[dict[str, Any]]:
    return [
        node_obj(),
        service("ns1", "a", "172.30.0.41", [port(node_port=3001)], type="NodePort"),
        service("ns1", "b", "172.30.0.42", [port(node_port=3002)], type="NodePort"),
        endpoint_slice("ns1", "a", [ep("10.180.0.1", NODE), ep("10.180.0.2")]),
        endpoint_slice("ns1", "b", [ep("10.180.1.1")]),
    ]


def test_partial_render_touches_only_the_changed_service() -> None:
    h = Harness(two_services())
    h.one(full=True)
    h.feed([endpoint_slice("ns1", "a", [ep("10.180.0.2"), ep("10.180.0.3")])])
    u = h.one(full=False)
    assert not u.full and u.rendered == 1
    assert u.touched_virtual == {VirtualKey(TCP, "172.30.0.41", 80), VirtualKey(TCP, NODE_IP, 3001)}
    assert u.touched_addresses == {"172.30.0.41"}
    assert ("KUBE-LOOP-BACK", "10.180.0.1,tcp:80,10.180.0.1") in u.touched_entries
    assert not any("172.30.0.42" in e for _, e in u.touched_entries)
    assert reals(u.state, TCP, "172.30.0.41", 80) == {"10.180.0.2:80", "10.180.0.3:80"}
    assert entries(u.state, "KUBE-LOOP-BACK") == set()
    # The hairpin set emptied: its rule goes.
    assert u.iptables_changed and "KUBE-LOOP-BACK" not in u.iptables.replace("create", "")


def test_partial_render_equals_the_full_one() -> None:
    h = Harness(two_services())
    h.one(full=True)
    h.feed(
        [
            endpoint_slice("ns1", "b", [ep("10.180.1.1"), ep("10.180.1.2", NODE)]),
            service("ns1", "c", "172.30.0.43", [port()], externalIPs=["192.168.99.1"]),
        ]
    )
    h.cluster.delete_service("ns1", "a")
    partial = h.one(full=False)
    got = partial.state.lines(), partial.iptables
    full = Harness([])
    full.cluster = h.cluster
    want = full.one(full=True)
    assert got == (want.state.lines(), want.iptables)


def test_shared_addresses_and_entries_are_refcounted() -> None:
    """Two Services with the same external IP bind it once; it stays while one of them does."""
    objects = [
        node_obj(),
        service("ns1", "a", "172.30.0.41", [port()], externalIPs=["192.168.99.1"]),
        service("ns1", "b", "172.30.0.42", [port(81, "p81")], externalIPs=["192.168.99.1"]),
    ]
    h = Harness(objects)
    assert "192.168.99.1" in h.one(full=True).state.addresses
    h.cluster.delete_service("ns1", "a")
    u = h.one(full=False)
    assert "192.168.99.1" in u.state.addresses
    assert "192.168.99.1" in u.touched_addresses
    h.cluster.delete_service("ns1", "b")
    assert "192.168.99.1" not in h.one(full=False).state.addresses


def test_a_virtual_key_two_services_claim_goes_to_the_first() -> None:
    objects = [
        node_obj(),
        service("ns1", "a", "172.30.0.41", [port()]),
        service("ns1", "b", "172.30.0.42", [port()], externalIPs=["172.30.0.41"]),
        endpoint_slice("ns1", "a", [ep("10.180.0.1")]),
        endpoint_slice("ns1", "b", [ep("10.180.0.2")]),
    ]
    h = Harness(objects)
    assert reals(h.one(full=True).state, TCP, "172.30.0.41", 80) == {"10.180.0.1:80"}
    h.cluster.delete_service("ns1", "a")
    assert reals(h.one(full=False).state, TCP, "172.30.0.41", 80) == {"10.180.0.2:80"}


def test_the_state_is_a_live_view_and_snapshot_a_copy() -> None:
    h = Harness(two_services())
    first = h.one(full=True)
    snap = h.renderers[V4].snapshot()
    assert snap.lines() == first.state.lines()
    assert isinstance(first.state.addresses, SetView)
    h.cluster.delete_service("ns1", "b")
    second = h.one(full=False)
    assert second.state is first.state  # one view, read at each render
    assert "172.30.0.42" not in first.state.addresses
    assert "172.30.0.42" in snap.addresses
    view = first.state.addresses
    assert view == {"172.30.0.41"} and view | {"x"} == {"172.30.0.41", "x"}
    assert view - {"172.30.0.41"} == frozenset()


def test_settings_change_makes_the_next_render_full() -> None:
    h = Harness(nodeport_objects(), addresses=(NODE_IP,))
    h.one(full=True)
    h.addresses = (NODE_IP, "10.0.0.9")
    u = h.one(full=False)
    assert u.full
    assert VirtualKey(TCP, "10.0.0.9", 3001) in u.state.virtual


def test_a_failing_service_keeps_its_previous_part(monkeypatch: pytest.MonkeyPatch) -> None:
    from kubeplex.backends.ipvs import desired

    h = Harness(two_services())
    before = h.one(full=True).state.lines()
    real = desired.contribution

    def broken(svc: Any, *args: Any) -> Any:
        if svc.name.name == "a":
            raise RuntimeError("boom")
        return real(svc, *args)

    monkeypatch.setattr(desired, "contribution", broken)
    h.feed([endpoint_slice("ns1", "a", [ep("10.180.0.9")])])
    u = h.one(full=False)
    assert list(u.errors) == ["ns1/a:p80"]
    assert u.state.lines() == before
    assert not u.touched_virtual
    u = h.one(full=True)
    assert u.state.lines() == before


def test_real_keys_print_like_ipvsadm() -> None:
    assert str(RealKey("fd00::1", 80)) == "[fd00::1]:80"


def test_settings_per_family() -> None:
    """isValidForSet: IPv6 link-local and loopback addresses serve no NodePort; excludeCIDRs
    and the node IP are the family's own."""
    h = Harness(
        [node_obj((NODE_IP, "2001:db8::1"))],
        {"ipvs": {"excludeCIDRs": ["10.9.0.0/16", "fd00:9::/64"], "scheduler": "wrr"}},
        families=(V4, V6),
        addresses=(NODE_IP, "2001:db8::1", "fe80::1", "::1", "127.0.0.1"),
    )
    s6 = h.settings(V6)
    assert s6.node_port_ips == ("2001:db8::1",)
    assert s6.exclude_cidrs == ("fd00:9::/64",)
    assert s6.node_ip == "2001:db8::1" and s6.scheduler == "wrr"
    s4 = h.settings(V4)
    assert s4.node_port_ips == (NODE_IP,) and s4.exclude_cidrs == ("10.9.0.0/16",)
    assert s4.local_addresses == frozenset({NODE_IP})
