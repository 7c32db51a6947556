"""The IPVS render's partial syncs: after any sequence of changes, the state a partial render
keeps equals a full render of the same cluster, and what it says it touched covers every
virtual service, address and set entry that changed."""

from __future__ import annotations

from typing import Any

from fuzz_profiles import scaled
from hypothesis import given
from hypothesis import strategies as st

from kubeplex.backends.ipvs.desired import DesiredRenderer, DesiredUpdate
from kubeplex.backends.ipvs.plan import FamilyState
from kubeplex.backends.ipvs.settings import ipvs_settings
from kubeplex.core.config.kubeproxy import parse_config
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.types import IPFamily

NODE = "node-a"
V4, V6 = IPFamily.IPv4, IPFamily.IPv6
FAMILIES = (V4, V6)
CFG = parse_config(
    "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: ipvs\n"
    "clusterCIDR: 10.244.0.0/16,fd00:244::/64\n",
    "fuzz config",
)
NAMES = ("a", "b", "c", "d")
#: Each Service's protocol, fixed so its slices' ports match it.
PROTOCOLS = {"a": "TCP", "b": "UDP", "c": "SCTP", "d": "TCP"}
#: A small pool of addresses, so Services share external IPs and endpoints share hairpin
#: entries (the refcounted paths).
EXTERNAL = ("192.168.99.1", "192.168.99.2", "192.168.0.2", "fd00:99::1")
LB = ("1.2.3.4", "5.6.7.8", "fd00:1b::1")
POD_V4 = ("10.244.1.2", "10.244.1.3", "10.244.2.2")
POD_V6 = ("fd00:244::2", "fd00:244::3")


def node() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE},
        "spec": {"podCIDRs": ["10.244.1.0/24", "fd00:244::/64"]},
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": "192.168.0.2"},
                {"type": "InternalIP", "address": "2001:db8::2"},
            ]
        },
    }


@st.composite
def services(draw: st.DrawFn, name: str) -> dict[str, Any]:
    i = NAMES.index(name)
    kind = draw(st.sampled_from(("ClusterIP", "NodePort", "LoadBalancer")))
    proto = PROTOCOLS[name]
    ports: list[dict[str, Any]] = [
        {"name": "p", "port": draw(st.sampled_from((80, 81))), "protocol": proto}
    ]
    if kind != "ClusterIP":
        ports[0]["nodePort"] = 30000 + i
    spec: dict[str, Any] = {
        "type": kind,
        "clusterIPs": [f"172.30.0.{i + 1}", f"fd00:30::{i + 1}"],
        "ipFamilyPolicy": "PreferDualStack",
        "ports": ports,
        "externalIPs": draw(st.lists(st.sampled_from(EXTERNAL), max_size=2, unique=True)),
    }
    if draw(st.booleans()):
        spec["sessionAffinity"] = "ClientIP"
        spec["sessionAffinityConfig"] = {
            "clientIP": {"timeoutSeconds": draw(st.sampled_from((60, 300)))}
        }
    if kind != "ClusterIP" and draw(st.booleans()):
        spec["externalTrafficPolicy"] = "Local"
        if kind == "LoadBalancer":
            spec["healthCheckNodePort"] = 32000 + i % 2
    if draw(st.booleans()):
        spec["internalTrafficPolicy"] = "Local"
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"namespace": "ns", "name": name},
        "spec": spec,
    }
    if kind == "LoadBalancer":
        ranges = draw(
            st.lists(
                st.sampled_from(("192.168.0.0/24", "203.0.113.0/25", "fd00::/8")),
                max_size=2,
                unique=True,
            )
        )
        if ranges:
            spec["loadBalancerSourceRanges"] = ranges
        ips = draw(st.lists(st.sampled_from(LB), max_size=2, unique=True))
        obj["status"] = {"loadBalancer": {"ingress": [{"ip": ip} for ip in ips]}}
    return obj


@st.composite
def slices(draw: st.DrawFn, name: str, family: IPFamily) -> dict[str, Any]:
    pool = POD_V4 if family is V4 else POD_V6
    eps = []
    for ip in draw(st.lists(st.sampled_from(pool), max_size=3, unique=True)):
        ep: dict[str, Any] = {
            "addresses": [ip],
            "nodeName": draw(st.sampled_from((NODE, "node-b"))),
            "conditions": {
                "ready": draw(st.booleans()),
                "serving": True,
                "terminating": draw(st.booleans()),
            },
        }
        eps.append(ep)
    proto = PROTOCOLS[name]
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "namespace": "ns",
            "name": f"{name}-{family.value.lower()}",
            "labels": {"kubernetes.io/service-name": name},
        },
        "addressType": family.value,
        "ports": [{"name": "p", "port": draw(st.sampled_from((8080, 8081))), "protocol": proto}],
        "endpoints": eps,
    }


@st.composite
def steps(draw: st.DrawFn) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for _ in range(draw(st.integers(1, 8))):
        name = draw(st.sampled_from(NAMES))
        what = draw(st.sampled_from(("service", "slice", "delete-service", "delete-slice")))
        if what == "service":
            out.append((what, draw(services(name))))
        elif what == "slice":
            out.append((what, draw(slices(name, draw(st.sampled_from(FAMILIES))))))
        elif what == "delete-service":
            out.append((what, name))
        else:
            out.append((what, (name, draw(st.sampled_from(FAMILIES)))))
    return out


@st.composite
def base(draw: st.DrawFn) -> list[tuple[str, Any]]:
    """Every Service with a slice per family: a cluster the steps then change."""
    out: list[tuple[str, Any]] = []
    for name in NAMES:
        out.append(("service", draw(services(name))))
        out += [("slice", draw(slices(name, f))) for f in FAMILIES]
    return out


def apply(cluster: ClusterState, step: tuple[str, Any]) -> None:
    what, arg = step
    if what == "service":
        cluster.set_service(arg)
    elif what == "slice":
        cluster.set_endpoint_slice(arg)
    elif what == "delete-service":
        cluster.delete_service("ns", arg)
    else:
        name, family = arg
        cluster.delete_endpoint_slice("ns", f"{name}-{family.value.lower()}")


def full_render(cluster: ClusterState, family: IPFamily) -> DesiredUpdate:
    """A fresh renderer's full render of what ``cluster`` holds now (without consuming its
    pending changes: a second ClusterState replays its objects)."""
    state = cluster.checkout(full=True)
    r = DesiredRenderer(ipvs_settings(CFG, state.node, family))
    return r.render(state.graphs[family], state.changes[family])


def changed_keys(
    before: FamilyState, after: FamilyState
) -> tuple[set[Any], set[str], set[tuple[str, str]]]:
    virtual = {
        k
        for k in set(before.virtual) | set(after.virtual)
        if before.virtual.get(k) != after.virtual.get(k)
        or dict(before.real.get(k, {})) != dict(after.real.get(k, {}))
    }
    addresses = set(before.addresses) ^ set(after.addresses)
    entries = {
        (n, e)
        for n in set(before.entries) | set(after.entries)
        for e in set(before.entries.get(n, ())) ^ set(after.entries.get(n, ()))
    }
    return virtual, addresses, entries


@scaled(0.5)
@given(base(), steps())
def test_partial_renders_equal_full_ones_and_touch_what_changed(
    first: list[tuple[str, Any]], then: list[tuple[str, Any]]
) -> None:
    live = ClusterState(NODE, FAMILIES)
    replay = ClusterState(NODE, FAMILIES)
    for c in (live, replay):
        c.set_node(node())
    for step in first:
        apply(live, step)
        apply(replay, step)
    state = live.checkout(full=True)
    renderers = {f: DesiredRenderer(ipvs_settings(CFG, state.node, f)) for f in FAMILIES}
    for f in FAMILIES:
        renderers[f].render(state.graphs[f], state.changes[f])
    replay.checkout()
    for step in then:
        before = {f: renderers[f].snapshot() for f in FAMILIES}
        apply(live, step)
        apply(replay, step)
        state = live.checkout()
        for f in FAMILIES:
            got = renderers[f].render(state.graphs[f], state.changes[f])
            assert not got.full
            want = full_render(replay, f)
            assert got.state.lines() == want.state.lines()
            assert got.iptables == want.iptables
            assert got.no_local_endpoints == want.no_local_endpoints
            virtual, addresses, entries = changed_keys(before[f], got.state)
            assert virtual <= got.touched_virtual
            assert addresses <= got.touched_addresses
            assert entries <= got.touched_entries
