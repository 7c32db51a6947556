"""The kernelspace (Windows HNS) backend's rendered policies, against upstream winkernel.

Upstream reference: pkg/proxy/winkernel/proxier.go (syncProxyRules), loadbalancer.go and hns.go
(getLoadBalancer), and hcsshim's hcn.HostComputeLoadBalancer / HostComputeEndpoint schema. The
backend is render-only: ``run`` and ``cleanup`` must refuse on a node without HNS.

Golden files live in tests/unit/golden/kernelspace/; ``KUBEPLEX_UPDATE_GOLDEN=1 pytest
tests/unit/test_kernelspace_render.py`` rewrites them (review the diff before committing).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from kits import cli_kit, render_kit
from kits.render_kit import (
    LAB,
    NODE,
    NODE_IP,
    V4,
    V6,
    RenderHarness,
    assert_golden_file,
    node_obj,
    port,
)

from kubeplex.backends.kernelspace import KernelspaceBackend
from kubeplex.backends.kernelspace.policies import (
    FamilySettings,
    KernelspaceRendered,
    LoadBalancerFlags,
    conjure_mac,
    service_policies,
)
from kubeplex.core.config.kubeproxy import KubeProxyConfiguration, load_config
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import BackendContext
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.errors import BackendError
from kubeplex.core.model.types import Endpoint, IPFamily, ServicePort, ServicePortName
from kubeplex.core.sources.manifests import ManifestSource

OTHER = "other-node"
GOLDEN = Path(__file__).parent / "golden" / "kernelspace"
ROOT = Path(__file__).resolve().parents[2]
BASE = {"clusterCIDR": "10.0.0.0/8", "hostnameOverride": NODE}


@pytest.fixture(autouse=True)
def _no_kube_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Upstream's fallback for networkName must not leak in from the environment."""
    monkeypatch.delenv("KUBE_NETWORK", raising=False)


# --- objects ------------------------------------------------------------------------------------


def config(fields: Mapping[str, Any] = BASE) -> KubeProxyConfiguration:
    return render_kit.config({"mode": "kernelspace", **fields})


def service(
    name: str,
    cluster_ip: str,
    ports: Sequence[dict[str, Any]] = (port(),),
    *,
    ns: str = "ns1",
    **fields: Any,
) -> dict[str, Any]:
    return render_kit.service(ns, name, cluster_ip, ports, **fields)


def ep(
    ip: str,
    node: str = OTHER,
    *,
    ready: bool = True,
    serving: bool = True,
    terminating: bool = False,
) -> dict[str, Any]:
    """An endpoint with every condition written (winkernel reads all three)."""
    return render_kit.ep(ip, node, ready=ready, serving=serving, terminating=terminating)


def endpoint_slice(
    svc: str,
    endpoints: Sequence[dict[str, Any]],
    ports: Sequence[dict[str, Any]] = (port(8080),),
    *,
    ns: str = "ns1",
    family: str = "IPv4",
) -> dict[str, Any]:
    return render_kit.endpoint_slice(ns, svc, endpoints, ports, family=family)


class Harness(RenderHarness[KernelspaceBackend, KernelspaceRendered]):
    """ClusterState + KernelspaceBackend.render, on any OS."""

    def __init__(
        self,
        objects: Iterable[Mapping[str, Any]] = (),
        cfg: Mapping[str, Any] | KubeProxyConfiguration = BASE,
        families: tuple[IPFamily, ...] = (V4,),
    ) -> None:
        super().__init__(KernelspaceBackend, [node_obj(), *objects], cfg, families, NODE, config)

    def rendered(self, full: bool = False) -> KernelspaceRendered:
        return self.render(full)

    def family(self, full: bool = False, family: IPFamily = V4) -> dict[str, Any]:
        doc = json.loads(str(self.rendered(full)))
        (fam,) = [f for f in doc["families"] if f["family"] == family.value]
        return dict(fam)


def render(
    objects: Iterable[Mapping[str, Any]],
    cfg: Mapping[str, Any] = BASE,
    family: IPFamily = V4,
) -> dict[str, Any]:
    return Harness(objects, cfg, (family,)).family(full=True, family=family)


def lbs(fam: Mapping[str, Any], kind: str | None = None) -> list[dict[str, Any]]:
    return [lb for lb in fam["loadBalancers"] if kind is None or lb["type"] == kind]


def hlb(fam: Mapping[str, Any], kind: str, vip: str | None = None) -> dict[str, Any]:
    """The one HostComputeLoadBalancer of that type (and frontend VIP)."""
    found = [
        lb["HostComputeLoadBalancer"]
        for lb in lbs(fam, kind)
        if vip is None or lb["HostComputeLoadBalancer"].get("FrontendVIPs") == [vip]
    ]
    assert len(found) == 1, f"{kind} {vip}: {found}"
    return dict(found[0])


def mapping(lb: Mapping[str, Any]) -> dict[str, Any]:
    (pm,) = lb["PortMappings"]
    return dict(pm)


def kinds(fam: Mapping[str, Any]) -> list[tuple[str, str]]:
    return [(lb["service"], lb["type"]) for lb in fam["loadBalancers"]]


def assert_golden(name: str, text: str) -> None:
    assert_golden_file(GOLDEN / f"{name}.json", text, "rendered policies differ", lineterm="\n")


# --- the seed lab ------------------------------------------------------------------------------


def lab_render() -> str:
    cfg = load_config(LAB / "config.yaml", known_modes=plugins.known_modes())
    backend = KernelspaceBackend(BackendContext(cfg, "kind-worker"))
    cluster = ClusterState("kind-worker")
    ManifestSource(LAB / "manifests", cluster).load()
    return str(backend.render(cluster.checkout(full=True)))


def test_seed_lab_load_balancers() -> None:
    text = lab_render()
    doc = json.loads(text)
    v4 = doc["families"][0]
    assert v4["family"] == "IPv4" and v4["sync"] == "full"
    assert kinds(v4) == [
        ("default/web", "ClusterIP"),
        ("default/web-nodeport", "ClusterIP"),
        ("default/web-nodeport", "NodePort"),
    ]
    three = ["local:10.244.1.2", "remote:10.244.2.2", "remote:10.244.2.3"]
    web = lbs(v4)[0]["HostComputeLoadBalancer"]
    assert web == {
        "FrontendVIPs": ["10.96.88.59"],
        "HostComputeEndpoints": three,
        "PortMappings": [{"ExternalPort": 80, "InternalPort": 8080, "Protocol": 6}],
        "SchemaVersion": {"Major": 2, "Minor": 0},
    }
    assert hlb(v4, "ClusterIP", "10.96.223.155")["HostComputeEndpoints"] == three
    node_port = hlb(v4, "NodePort")
    # No frontend VIP: every address of the node; LocalRoutedVIP (2) | VipExternalIP (16).
    assert "FrontendVIPs" not in node_port
    assert mapping(node_port) == {
        "ExternalPort": 30080,
        "InternalPort": 8080,
        "Protocol": 6,
        "Flags": 18,
    }
    assert node_port["HostComputeEndpoints"] == three
    # The two pods on kind-worker2 become remote HNS endpoints, shared by both Services.
    assert [(r["ip"], r["usedBy"]) for r in v4["remoteEndpoints"]] == [
        ("10.244.2.2", ["default/web", "default/web-nodeport"]),
        ("10.244.2.3", ["default/web", "default/web-nodeport"]),
    ]
    assert v4["remoteEndpoints"][0]["HostComputeEndpoint"] == {
        "Flags": 1,
        "IpConfigurations": [{"IpAddress": "10.244.2.2"}],
        "MacAddress": "02-11-0a-f4-02-02",
        "SchemaVersion": {"Major": 2, "Minor": 0},
    }
    assert doc["families"][1] == {**doc["families"][1], "family": "IPv6", "loadBalancers": []}
    assert_golden("seed-lab", text)


def test_render_is_deterministic_sorted_json() -> None:
    text = lab_render()
    assert text == lab_render()
    assert text.endswith("}\n")
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"
    assert text.isascii()


# --- flags --------------------------------------------------------------------------------------


def test_flag_bits_match_hcn() -> None:
    assert LoadBalancerFlags(is_ilb=True).port_mapping_flags == 1
    assert LoadBalancerFlags(local_routed_vip=True).port_mapping_flags == 2
    assert LoadBalancerFlags(use_mux=True).port_mapping_flags == 4
    assert LoadBalancerFlags(preserve_dip=True).port_mapping_flags == 8
    assert LoadBalancerFlags(is_vip_external_ip=True).port_mapping_flags == 16
    assert LoadBalancerFlags(is_dsr=True, is_ipv6=True).load_balancer_flags == 3
    assert LoadBalancerFlags(session_affinity=True).distribution_type == 2
    assert LoadBalancerFlags().port_mapping_flags == LoadBalancerFlags().load_balancer_flags == 0


def test_conjured_mac_addresses() -> None:
    assert conjure_mac("10.244.2.3") == "02-11-0a-f4-02-03"
    # IPv6: the last four bytes, last first (upstream's ip6[15], ip6[14], ip6[13], ip6[12]).
    assert conjure_mac("fd00::1:2:304") == "02-11-04-03-02-00"


@pytest.mark.parametrize(("protocol", "number"), [("TCP", 6), ("UDP", 17), ("SCTP", 132)])
def test_protocol_numbers(protocol: str, number: int) -> None:
    fam = render(
        [
            service("svc1", "10.20.30.41", [port(53, "dns", protocol)]),
            endpoint_slice("svc1", [ep("10.180.0.1")], [port(5353, "dns", protocol)]),
        ]
    )
    lb = hlb(fam, "ClusterIP")
    assert mapping(lb) == {"Protocol": number, "InternalPort": 5353, "ExternalPort": 53}
    assert lbs(fam)[0]["service"] == "ns1/svc1:dns"


def test_session_affinity_client_ip_is_source_ip_distribution() -> None:
    fam = render(
        [
            service(
                "svc1",
                "10.20.30.41",
                [port(80, node_port=3001)],
                type="NodePort",
                sessionAffinity="ClientIP",
                externalIPs=["50.60.70.81"],
            ),
            endpoint_slice("svc1", [ep("10.180.0.1")]),
        ]
    )
    assert [lb["type"] for lb in lbs(fam)] == ["ClusterIP", "NodePort", "ExternalIP"]
    for lb in lbs(fam):
        assert mapping(lb["HostComputeLoadBalancer"])["DistributionType"] == 2
        assert "sessionAffinity" in lb["flags"]


def test_enable_dsr_marks_the_cluster_ip_load_balancer() -> None:
    objects = [
        service("svc1", "10.20.30.41", [port(80, node_port=3001)], type="NodePort"),
        endpoint_slice("svc1", [ep("10.180.0.1")]),
    ]
    plain = render(objects)
    assert "Flags" not in hlb(plain, "ClusterIP")
    dsr = render(objects, {**BASE, "winkernel": {"enableDSR": True}})
    assert dsr["enableDSR"] is True
    assert hlb(dsr, "ClusterIP")["Flags"] == 1
    # NodePort DSR follows externalTrafficPolicy, not enableDSR.
    assert "Flags" not in hlb(dsr, "NodePort")


def lb_service(**spec: Any) -> dict[str, Any]:
    return service(
        "svc1",
        "10.20.30.41",
        [port(80, node_port=3001)],
        type="LoadBalancer",
        externalIPs=["50.60.70.81"],
        ingress=["11.21.31.41"],
        healthCheckNodePort=30000,
        **spec,
    )


def test_external_traffic_policy_local_is_dsr_to_local_endpoints() -> None:
    fam = render(
        [
            lb_service(externalTrafficPolicy="Local"),
            endpoint_slice("svc1", [ep("10.180.0.1", NODE), ep("10.180.0.2")]),
        ]
    )
    both = ["local:10.180.0.1", "remote:10.180.0.2"]
    local = ["local:10.180.0.1"]
    cluster = hlb(fam, "ClusterIP")
    assert cluster["HostComputeEndpoints"] == both and "Flags" not in cluster
    node_port = hlb(fam, "NodePort")
    assert node_port["HostComputeEndpoints"] == local
    assert node_port["Flags"] == 1 and mapping(node_port)["Flags"] == 18
    external = hlb(fam, "ExternalIP", "50.60.70.81")
    assert external["HostComputeEndpoints"] == local
    assert external["Flags"] == 1 and mapping(external)["Flags"] == 16
    ingress = hlb(fam, "IngressIP", "11.21.31.41")
    assert ingress["HostComputeEndpoints"] == local
    assert ingress["Flags"] == 1 and mapping(ingress)["Flags"] == 16
    assert [r["ip"] for r in fam["remoteEndpoints"]] == ["10.180.0.2"]


def test_external_traffic_policy_local_without_local_endpoints_only_cluster_ip() -> None:
    # Upstream TestClusterIPLBInCreateDsrLoadBalancer: remote endpoints only, so no NodePort,
    # external IP or ingress load balancer; the cluster IP one still serves pods.
    fam = render(
        [
            lb_service(externalTrafficPolicy="Local"),
            endpoint_slice("svc1", [ep("10.180.0.2")]),
        ]
    )
    assert [lb["type"] for lb in lbs(fam)] == ["ClusterIP"]
    assert hlb(fam, "ClusterIP")["HostComputeEndpoints"] == ["remote:10.180.0.2"]


def test_external_traffic_policy_cluster_uses_every_endpoint() -> None:
    fam = render([lb_service(), endpoint_slice("svc1", [ep("10.180.0.1", NODE), ep("10.180.0.2")])])
    assert [lb["type"] for lb in lbs(fam)] == ["ClusterIP", "NodePort", "ExternalIP", "IngressIP"]
    for lb in lbs(fam):
        assert lb["HostComputeLoadBalancer"]["HostComputeEndpoints"] == [
            "local:10.180.0.1",
            "remote:10.180.0.2",
        ]
        assert "Flags" not in lb["HostComputeLoadBalancer"]


def test_internal_traffic_policy_local() -> None:
    objects = [
        service(
            "svc1",
            "10.20.30.41",
            [port(80, node_port=3001)],
            type="NodePort",
            internalTrafficPolicy="Local",
        ),
        endpoint_slice("svc1", [ep("10.180.0.1", NODE), ep("10.180.0.2")]),
    ]
    fam = render(objects)
    assert hlb(fam, "ClusterIP")["HostComputeEndpoints"] == ["local:10.180.0.1"]
    # externalTrafficPolicy Cluster: the NodePort still reaches every endpoint.
    assert hlb(fam, "NodePort")["HostComputeEndpoints"] == ["local:10.180.0.1", "remote:10.180.0.2"]


def test_internal_traffic_policy_local_without_local_endpoints() -> None:
    fam = render(
        [
            service("svc1", "10.20.30.41", internalTrafficPolicy="Local"),
            endpoint_slice("svc1", [ep("10.180.0.2")]),
        ]
    )
    assert lbs(fam) == []
    assert fam["servicesWithoutLoadBalancers"] == {"ns1/svc1:p80": "no endpoints for any frontend"}
    # Upstream makes the remote endpoint before it finds no load balancer needs it.
    assert [r["ip"] for r in fam["remoteEndpoints"]] == ["10.180.0.2"]


def test_both_traffic_policies_local_skip_remote_endpoints() -> None:
    fam = render(
        [
            lb_service(externalTrafficPolicy="Local", internalTrafficPolicy="Local"),
            endpoint_slice("svc1", [ep("10.180.0.1", NODE), ep("10.180.0.2")]),
        ]
    )
    assert fam["remoteEndpoints"] == []
    for lb in lbs(fam):
        assert lb["HostComputeLoadBalancer"]["HostComputeEndpoints"] == ["local:10.180.0.1"]


def test_preserve_destination_sets_mux_and_preserve_dip() -> None:
    # The preserve-destination annotation is not in the graph: the pure function takes it.
    spn = ServicePortName("ns1", "svc1", "p80")
    svc = ServicePort(
        spn, V4, "10.20.30.41", 80, node_port=3001, load_balancer_vips=("11.21.31.41",)
    )
    eps = (Endpoint("10.180.0.1", 8080, is_local=True), Endpoint("10.180.0.2", 8080))
    settings = FamilySettings(V4, "cbr0", False, "", NODE_IP, (NODE_IP,), False, False, "", 10256)
    out = {lb["type"]: lb for lb in service_policies(svc, eps, settings, True).load_balancers}
    ingress = out["IngressIP"]["HostComputeLoadBalancer"]
    assert ingress["Flags"] == 1  # DSR
    assert ingress["PortMappings"][0]["Flags"] == 4 | 8 | 16
    assert ingress["HostComputeEndpoints"] == ["local:10.180.0.1"]
    assert out["NodePort"]["HostComputeLoadBalancer"]["HostComputeEndpoints"] == [
        "local:10.180.0.1"
    ]
    assert out["IngressIP"]["flags"] == ["isDSR", "isVipExternalIP", "useMUX", "preserveDIP"]


def test_ipv6() -> None:
    fam = render(
        [
            service(
                "svc1",
                "fd00:10:96::1",
                [port(80, node_port=3001)],
                type="NodePort",
                ipFamilies=["IPv6"],
            ),
            endpoint_slice("svc1", [ep("fd00:10:244::2")], family="IPv6"),
        ],
        {"hostnameOverride": NODE},
        family=V6,
    )
    assert fam["family"] == "IPv6"
    cluster = hlb(fam, "ClusterIP", "fd00:10:96::1")
    assert cluster["Flags"] == 2
    assert hlb(fam, "NodePort")["Flags"] == 2
    assert "isIPv6" in lbs(fam)[0]["flags"]
    (remote,) = fam["remoteEndpoints"]
    assert remote["HostComputeEndpoint"]["IpConfigurations"] == [{"IpAddress": "fd00:10:244::2"}]
    assert remote["HostComputeEndpoint"]["MacAddress"] == "02-11-02-00-00-00"


# --- endpoint selection -------------------------------------------------------------------------


def test_only_ready_endpoints_are_used() -> None:
    fam = render(
        [
            service("svc1", "10.20.30.41"),
            endpoint_slice(
                "svc1",
                [
                    ep("10.180.0.1"),
                    ep("10.180.0.2", ready=False, serving=True, terminating=True),
                    ep("10.180.0.3", ready=False, serving=False, terminating=False),
                ],
            ),
        ]
    )
    assert hlb(fam, "ClusterIP")["HostComputeEndpoints"] == ["remote:10.180.0.1"]


def test_terminating_fallback_for_load_balancer_services() -> None:
    terminating = [
        ep("10.180.0.1", NODE, ready=False, serving=True, terminating=True),
        ep("10.180.0.2", ready=False, serving=True, terminating=True),
        ep("10.180.0.3", ready=False, serving=False, terminating=True),
    ]
    fam = render([lb_service(), endpoint_slice("svc1", terminating)])
    # Every endpoint terminating: the serving ones keep the cluster IP working, while the
    # node-facing load balancers go away so the cloud load balancer drains the node.
    assert [lb["type"] for lb in lbs(fam)] == ["ClusterIP"]
    assert hlb(fam, "ClusterIP")["HostComputeEndpoints"] == [
        "local:10.180.0.1",
        "remote:10.180.0.2",
    ]
    # Without ingress IPs upstream has no fallback: only ready endpoints, so nothing at all.
    plain = render([service("svc1", "10.20.30.41"), endpoint_slice("svc1", terminating)])
    assert lbs(plain) == []
    assert plain["servicesWithoutLoadBalancers"] == {"ns1/svc1:p80": "no usable endpoints"}


def test_no_endpoints_no_load_balancer() -> None:
    fam = render(
        [
            service("svc1", "10.20.30.41"),
            service("svc2", "10.20.30.42"),
            endpoint_slice("svc2", [ep("10.180.0.1")]),
        ]
    )
    assert kinds(fam) == [("ns1/svc2:p80", "ClusterIP")]
    assert fam["services"] == ["ns1/svc1:p80", "ns1/svc2:p80"]
    assert fam["servicesWithoutLoadBalancers"] == {"ns1/svc1:p80": "no usable endpoints"}


def test_host_network_endpoint_of_this_node_has_no_hns_endpoint() -> None:
    fam = render(
        [
            service("svc1", "10.20.30.41"),
            endpoint_slice("svc1", [ep(NODE_IP, NODE), ep("10.180.0.2")]),
        ]
    )
    assert hlb(fam, "ClusterIP")["HostComputeEndpoints"] == ["remote:10.180.0.2"]


# --- winkernel configuration --------------------------------------------------------------------


def test_winkernel_network_name_and_source_vip() -> None:
    cfg = {**BASE, "winkernel": {"networkName": "vxlan0", "sourceVip": "10.244.1.250"}}
    fam = render(
        [
            service("svc1", "10.20.30.41"),
            endpoint_slice("svc1", [ep("10.180.0.1", NODE), ep("10.180.0.2")]),
            service("svc2", "10.20.30.42"),
            endpoint_slice("svc2", [ep("172.16.5.5")]),  # outside clusterCIDR
        ],
        cfg,
    )
    assert fam["networkName"] == "vxlan0"
    assert fam["networkType"] == "Overlay"
    assert fam["sourceVip"] == "10.244.1.250"
    assert hlb(fam, "ClusterIP", "10.20.30.41")["SourceVIP"] == "10.244.1.250"
    # A backend outside the pod network is reached with the node IP as the source.
    assert hlb(fam, "ClusterIP", "10.20.30.42")["SourceVIP"] == NODE_IP
    # Overlay: the cluster IPs are remote endpoints on this node's provider address.
    by_ip = {r["ip"]: r for r in fam["remoteEndpoints"]}
    assert list(by_ip) == ["10.20.30.41", "10.20.30.42", "10.180.0.2", "172.16.5.5"]
    assert by_ip["10.20.30.41"]["role"] == "service-vip"
    assert by_ip["10.20.30.41"]["HostComputeEndpoint"]["Policies"] == [
        {"Settings": {"ProviderAddress": NODE_IP}, "Type": "ProviderAddress"}
    ]
    assert fam["sourceVipEndpoint"]["HostComputeEndpoint"]["IpConfigurations"] == [
        {"IpAddress": "10.244.1.250"}
    ]


def test_l2bridge_has_no_source_vip() -> None:
    fam = render([service("svc1", "10.20.30.41"), endpoint_slice("svc1", [ep("10.180.0.1")])])
    assert fam["networkType"] == "L2Bridge"
    assert "SourceVIP" not in hlb(fam, "ClusterIP")
    assert "sourceVipEndpoint" not in fam


def test_network_name_from_kube_network(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBE_NETWORK", "cbr0")
    assert render([])["networkName"] == "cbr0"
    fam = render([], {**BASE, "winkernel": {"networkName": "flannel"}})
    assert fam["networkName"] == "flannel"


def test_forward_health_check_vip() -> None:
    cfg = {
        **BASE,
        "winkernel": {"forwardHealthCheckVip": True, "rootHnsEndpointName": "cbr0"},
    }
    eps = endpoint_slice("svc1", [ep("10.180.0.1", NODE)])
    fam = render([lb_service(externalTrafficPolicy="Local"), eps], cfg)
    check = hlb(fam, "HealthCheck", "11.21.31.41")
    assert check["HostComputeEndpoints"] == ["name:cbr0"]
    assert mapping(check) == {"Protocol": 6, "InternalPort": 30000, "ExternalPort": 30000}
    assert "Flags" not in check
    # externalTrafficPolicy Cluster has no health check node port: kube-proxy's healthz port.
    fam = render([lb_service(), eps], cfg)
    assert mapping(hlb(fam, "HealthCheck"))["ExternalPort"] == 10256
    # No root endpoint name: upstream finds no gateway endpoint and makes none.
    fam = render([lb_service(), eps], {**BASE, "winkernel": {"forwardHealthCheckVip": True}})
    assert lbs(fam, "HealthCheck") == []
    assert lbs(render([lb_service(), eps]), "HealthCheck") == []


def test_values_are_escaped_json_data() -> None:
    weird = 'net"},{"FrontendVIPs":["6.6.6.6"]}\n\\ \u00e9\u2028'
    cfg = {
        **BASE,
        "winkernel": {
            "networkName": weird,
            "forwardHealthCheckVip": True,
            "rootHnsEndpointName": weird,
        },
    }
    h = Harness([lb_service(), endpoint_slice("svc1", [ep("10.180.0.1")])], cfg)
    text = str(h.rendered(full=True))
    assert text.isascii()
    assert '6.6.6.6"]}\n' not in text and '"FrontendVIPs":["6.6.6.6"]' not in text
    fam = json.loads(text)["families"][0]
    assert fam["networkName"] == weird
    assert hlb(fam, "HealthCheck")["HostComputeEndpoints"] == [f"name:{weird}"]
    assert len(lbs(fam)) == 5  # nothing was added by the value


def test_bad_source_vip_is_refused() -> None:
    h = Harness([], {**BASE, "winkernel": {"sourceVip": "10.0.0.1; rm -rf /"}})
    with pytest.raises(BackendError, match=r"winkernel.sourceVip: .* is not an IP address"):
        h.rendered(full=True)


# --- partial renders ------------------------------------------------------------------------------


def two_services() -> list[dict[str, Any]]:
    return [
        service("svc1", "10.20.30.41"),
        endpoint_slice("svc1", [ep("10.180.0.1"), ep("10.180.0.2")]),
        service("svc2", "10.20.30.42"),
        endpoint_slice("svc2", [ep("10.180.0.1"), ep("10.180.0.2")]),
    ]


def test_one_endpoint_change_rerenders_only_that_service() -> None:
    h = Harness(two_services())
    first = h.family(full=True)
    assert first["sync"] == "full" and len(lbs(first)) == 2
    h.feed([endpoint_slice("svc1", [ep("10.180.0.1")])])
    part = h.family()
    assert part["sync"] == "partial"
    assert part["services"] == ["ns1/svc1:p80"]
    assert kinds(part) == [("ns1/svc1:p80", "ClusterIP")]
    assert hlb(part, "ClusterIP")["HostComputeEndpoints"] == ["remote:10.180.0.1"]
    # 10.180.0.2 is still used by svc2: neither created nor deleted.
    assert part["remoteEndpoints"] == [] and part["remoteEndpointsDeleted"] == []
    # svc2's policies are exactly what they were.
    assert (
        h.backend.renderers[V4].fragments[ServicePortName("ns1", "svc2", "p80")].load_balancers[0]
        == lbs(first)[1]
    )
    # Nothing changed: nothing to write.
    assert h.family()["services"] == []


def test_partial_renders_track_remote_endpoints() -> None:
    h = Harness(two_services())
    h.family(full=True)
    h.feed([endpoint_slice("svc1", [ep("10.180.0.1"), ep("10.180.0.3")])])
    part = h.family()
    assert [r["ip"] for r in part["remoteEndpoints"]] == ["10.180.0.3"]
    assert part["remoteEndpointsDeleted"] == []
    h.cluster.delete_service("ns1", "svc2")
    part = h.family()
    assert part["services"] == ["ns1/svc2:p80"] and lbs(part) == []
    assert part["remoteEndpointsDeleted"] == ["10.180.0.2"]
    # The cached state is what a fresh full render of the same cluster gives.
    again = Harness(
        [
            service("svc1", "10.20.30.41"),
            endpoint_slice("svc1", [ep("10.180.0.1"), ep("10.180.0.3")]),
        ]
    ).family(full=True)
    full = h.family(full=True)
    assert full == again


def test_config_change_forces_a_full_render() -> None:
    h = Harness(two_services())
    h.family(full=True)
    h.backend.ctx = BackendContext(config({**BASE, "winkernel": {"enableDSR": True}}), NODE, (V4,))
    fam = h.family()
    assert fam["sync"] == "full" and len(lbs(fam)) == 2
    assert all(lb["HostComputeLoadBalancer"]["Flags"] == 1 for lb in lbs(fam))


# --- the node: HNS only -------------------------------------------------------------------------


def test_apply_and_cleanup_refuse_without_hns() -> None:
    h = Harness(two_services())
    rendered = h.rendered(full=True)
    with pytest.raises(BackendError, match="requires Windows HNS"):
        h.backend.apply(rendered)
    with pytest.raises(BackendError, match="requires Windows HNS"):
        h.backend.cleanup()
    assert any("requires Windows HNS" in m for m in h.backend.missing_requirements())


def test_render_only_hooks() -> None:
    """No kernel seam, no conntrack, nothing to read back or left behind on this node."""
    backend = Harness(two_services()).backend
    assert backend.kernel is None and not backend.uses_conntrack
    assert backend.inspect(ServicePortName("ns1", "svc1", "p80")) is None
    assert backend.leftovers() == [] and backend.metric_families() == ()


def test_on_windows_it_says_render_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "win32")
    (why,) = Harness().backend.missing_requirements()
    assert "render-only" in why and "not implemented" in why


LAB_ARGS = ("--config", str(ROOT / "testing/lab/config.yaml"), "--proxy-mode", "kernelspace")


def test_cli_render_prints_the_policies() -> None:
    proc = cli_kit.kubeplex("render", *LAB_ARGS, "--manifests", str(ROOT / "testing/lab/manifests"))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["mode"] == "kernelspace"
    assert len(doc["families"][0]["loadBalancers"]) == 3


def test_cli_run_refuses_without_hns() -> None:
    proc = cli_kit.kubeplex(
        "run", *LAB_ARGS, "--manifests", str(ROOT / "testing/lab/manifests"), "--once"
    )
    assert proc.returncode == 4, proc.stderr
    assert "mode kernelspace: this node lacks what it needs" in proc.stderr
    assert "requires Windows HNS" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_cli_cleanup_of_the_windows_mode_is_refused_on_linux() -> None:
    # `kubeplex cleanup` cleans every mode of this platform (as kube-proxy --cleanup); the
    # configured kernelspace mode is not one of Linux's, and asked for by name it is refused.
    proc = cli_kit.kubeplex("cleanup", *LAB_ARGS[:2], "--mode", "kernelspace")
    assert proc.returncode == 4
    assert "'kernelspace' is not a mode of this platform" in proc.stderr
    assert "Traceback" not in proc.stderr
