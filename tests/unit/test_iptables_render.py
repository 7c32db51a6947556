"""The iptables backend's rendered restore input, against upstream kube-proxy (pure, no root).

Upstream reference: pkg/proxy/iptables/proxier.go (syncProxyRules, writeServiceToEndpointRules)
and the expected iptables-restore inputs in its proxier_test.go (TestOverallIPTablesRules,
TestLoadBalancer, TestExternalTrafficPolicyLocal, TestTerminatingEndpoints*, ...). Scenarios
ported from there use the same Services, EndpointSlices, node ("test-hostname", 192.168.0.2)
and local-traffic detector (clusterCIDR 10.0.0.0/8) as upstream's fake proxier.

kubeplex writes the same chains and, within every chain, the same rules in the same order; it
groups the rules by chain (upstream interleaves them in one buffer, iptables-restore does not
care) and orders services by name (upstream's order is Go map order). Two more differences are
deliberate: the masquerade mark is spelled as real kube-proxy spells it (``0x00004000``;
upstream's tests inject ``0x4000``), and MASQUERADE gets ``--random-fully``, which real
kube-proxy adds whenever iptables supports it (the seed cluster shows it).

Golden files live in tests/unit/golden/iptables/; ``KUBEPLEX_UPDATE_GOLDEN=1 pytest
tests/unit/test_iptables_render.py`` rewrites them (review the diff line by line before committing).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from kits import render_kit
from kits.iptables_kit import UPSTREAM, Harness, all_lines
from kits.render_kit import (
    LAB,
    NODE,
    NODE_IP,
    V4,
    V6,
    assert_golden_file,
    endpoint_slice,
    ep,
    node_obj,
    port,
    service,
    svc1,
)

from kubeplex.backends.iptables import names
from kubeplex.backends.iptables.prelude import prelude
from kubeplex.backends.iptables.render import FamilyPlan, FamilyRenderer, IptablesRendered
from kubeplex.backends.iptables.rules import (
    KUBELET_FIREWALL,
    FamilySettings,
    bare_comment,
    comment,
    go_hex_mark,
    probability,
    service_rules,
)
from kubeplex.backends.netfilter.iptables import SavedRuleset
from kubeplex.core.config.kubeproxy import load_config
from kubeplex.core.model.errors import BackendError
from kubeplex.core.model.graph import ChangeSet, ServiceGraph
from kubeplex.core.model.types import (
    Endpoint,
    IPFamily,
    NodeInfo,
    Protocol,
    ServicePort,
    ServicePortName,
)
from kubeplex.core.sources.manifests import ManifestSource

GOLDEN = Path(__file__).parent / "golden" / "iptables"

#: the no-op detector of upstream's NoClusterCIDR / localhost-NodePort tests.
NO_DETECTOR: dict[str, Any] = {}


def render(
    objects: Iterable[Mapping[str, Any]],
    cfg: Mapping[str, Any] = UPSTREAM,
    families: tuple[IPFamily, ...] = (V4,),
    nfacct: bool = False,
) -> IptablesRendered:
    return Harness(objects, cfg, families, nfacct).render(full=True)


def plan_of(rendered: IptablesRendered, family: IPFamily = V4) -> FamilyPlan:
    (plan,) = [p for p in rendered.plans if p.family is family]
    return plan


def rules_of(
    rendered: IptablesRendered, table: str, chain: str, family: IPFamily = V4
) -> list[str]:
    plan = plan_of(rendered, family)
    chains = plan.filter if table == "filter" else plan.nat
    return list(chains.get(chain, ()))


def assert_golden(name: str, rendered: IptablesRendered | str) -> None:
    assert_golden_file(GOLDEN / f"{name}.txt", str(rendered), "rendered rules differ")


# --- iptables-save form -------------------------------------------------------------------------

_FRONT = ("-s", "-d", "-i", "-o", "-p")
# xtables_save_string() prints these bare and quotes anything else.
_SAVE_BARE = frozenset("_-0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def _save_string(value: str) -> str:
    return value if value and set(value) <= _SAVE_BARE else f'"{value}"'


def _hex(value: str) -> str:
    return f"{int(value, 16):#x}"


def save_form(rule: str) -> str:
    """How iptables-save prints a rule of the kinds kube-proxy writes (restore form in).

    Addresses, interfaces and protocol move to the front with a prefix length; module options
    stay with their module; the statistic module keeps probability as a 31-bit fraction printed
    with 11 decimals; MARK's --or/--xor-mark print as --set-xmark; REJECT shows its default.
    (Checked once by hand against iptables v1.8.9: seed-lab.txt restored into a scratch
    namespace and read back with iptables-save gives exactly these lines.)
    """
    tokens = shlex.split(rule)
    assert tokens[0] in ("-A", "-I"), rule
    chain = tokens[1]
    i = 3 if tokens[0] == "-I" else 2
    front: dict[str, list[str]] = {}
    modules: list[list[str]] = []
    negate = False
    while i < len(tokens):
        tok = tokens[i]
        if tok == "!":
            negate = True
            i += 1
        elif tok in _FRONT:
            value = tokens[i + 1]
            if tok in ("-s", "-d") and "/" not in value:
                value += "/128" if ":" in value else "/32"
            front[tok] = (["!"] if negate else []) + [tok, value]
            negate = False
            i += 2
        elif tok == "-m":
            modules.append(["-m", tokens[i + 1]])
            i += 2
        elif tok == "-j":
            break
        else:
            values: list[str] = []
            i += 1
            while i < len(tokens) and not tokens[i].startswith("-") and tokens[i] != "!":
                values.append(tokens[i])
                i += 1
            opt = (["!"] if negate else []) + [tok]
            negate = False
            if tok == "--comment":
                opt.append(_save_string(values[0]))
            elif tok == "--nfacct-name":
                opt.append(" " + _save_string(values[0]))  # libxt_nfacct prints two spaces
            elif tok == "--probability":
                fraction = int(float(values[0]) * 0x80000000 + 0.5)
                opt.append(f"{fraction / 0x80000000:.11f}")
            elif tok == "--mark":
                opt.append("/".join(_hex(v) for v in values[0].split("/")))
            else:
                opt += values
            modules[-1] += opt
    target = tokens[i:]
    if target[:2] == ["-j", "MARK"]:
        mark = _hex(target[3])
        mask = mark if target[2] == "--or-mark" else "0x0"
        target = ["-j", "MARK", "--set-xmark", f"{mark}/{mask}"]
    elif target == ["-j", "REJECT"]:
        target += ["--reject-with", "icmp-port-unreachable"]
    parts = ["-A", chain]
    for key in _FRONT:
        parts += front.get(key, [])
    for module in modules:
        parts += module
    return " ".join(parts + target)


def test_save_form_of_known_rules() -> None:
    # The conversion itself, on rules whose iptables-save form upstream users have published.
    assert save_form(
        '-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections"'
        " -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT"
        " -j DROP"
    ) == (
        '-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming'
        ' localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP'
    )
    assert save_form(
        "-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct"
        " --nfacct-name ct_state_invalid_dropped_pkts -j DROP"
    ) == (
        "-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct"
        " --nfacct-name  ct_state_invalid_dropped_pkts -j DROP"
    )


# --- 1. the seed lab ------------------------------------------------------------------------------


def lab_render() -> IptablesRendered:
    cfg = load_config(LAB / "config.yaml")
    h = Harness(cfg=cfg, families=(V4, V6), nfacct=True, node=cfg.hostname_override)
    source = ManifestSource(LAB / "manifests", h.cluster)
    source.load()
    assert not source.problems and not h.cluster.invalid
    return h.render(full=True)


def test_seed_lab_golden() -> None:
    assert_golden("seed-lab", lab_render())


#: The seed article's rules, exactly as it prints them (iptables-save on the kind worker).
SEED_SAVED = [
    '-A KUBE-SERVICES -d 10.96.88.59/32 -p tcp -m comment --comment "default/web cluster IP"'
    " -m tcp --dport 80 -j KUBE-SVC-LOLE4ISW44XBNF3G",
    "-A KUBE-SERVICES -d 10.96.223.155/32 -p tcp -m comment --comment"
    ' "default/web-nodeport cluster IP" -m tcp --dport 80 -j KUBE-SVC-GCYSPZR5VVR6P7RM',
    '-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be'
    ' the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS',
    "-A KUBE-SVC-LOLE4ISW44XBNF3G ! -s 10.244.0.0/16 -d 10.96.88.59/32 -p tcp -m comment"
    ' --comment "default/web cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ',
    '-A KUBE-SVC-LOLE4ISW44XBNF3G -m comment --comment "default/web -> 10.244.1.2:8080"'
    " -m statistic --mode random --probability 0.33333333349 -j KUBE-SEP-PXJ2U7QYT2QW5545",
    '-A KUBE-SVC-LOLE4ISW44XBNF3G -m comment --comment "default/web -> 10.244.2.2:8080"'
    " -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-5Q3P56IRA2PP7VYF",
    '-A KUBE-SVC-LOLE4ISW44XBNF3G -m comment --comment "default/web -> 10.244.2.3:8080"'
    " -j KUBE-SEP-G2TK3RG32KUOAWKQ",
    '-A KUBE-SEP-PXJ2U7QYT2QW5545 -s 10.244.1.2/32 -m comment --comment "default/web"'
    " -j KUBE-MARK-MASQ",
    '-A KUBE-SEP-PXJ2U7QYT2QW5545 -p tcp -m comment --comment "default/web" -m tcp'
    " -j DNAT --to-destination 10.244.1.2:8080",
    "-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000",
    "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN",
    "-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0",
    '-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT"'
    " -j MASQUERADE --random-fully",
    '-A KUBE-NODEPORTS -d 127.0.0.0/8 -p tcp -m comment --comment "default/web-nodeport"'
    " -m tcp --dport 30080 -m nfacct --nfacct-name  localhost_nps_accepted_pkts"
    " -j KUBE-EXT-GCYSPZR5VVR6P7RM",
    '-A KUBE-NODEPORTS -p tcp -m comment --comment "default/web-nodeport" -m tcp --dport 30080'
    " -j KUBE-EXT-GCYSPZR5VVR6P7RM",
    '-A KUBE-EXT-GCYSPZR5VVR6P7RM -m comment --comment "masquerade traffic for'
    ' default/web-nodeport external destinations" -j KUBE-MARK-MASQ',
    "-A KUBE-EXT-GCYSPZR5VVR6P7RM -j KUBE-SVC-GCYSPZR5VVR6P7RM",
]

#: The same rules as kube-proxy hands them to iptables-restore.
SEED_RESTORE = [
    '-A KUBE-SERVICES -m comment --comment "default/web cluster IP" -m tcp -p tcp'
    " -d 10.96.88.59 --dport 80 -j KUBE-SVC-LOLE4ISW44XBNF3G",
    '-A KUBE-SERVICES -m comment --comment "default/web-nodeport cluster IP" -m tcp -p tcp'
    " -d 10.96.223.155 --dport 80 -j KUBE-SVC-GCYSPZR5VVR6P7RM",
    '-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be'
    ' the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS',
    '-A KUBE-SVC-LOLE4ISW44XBNF3G -m comment --comment "default/web cluster IP" -m tcp -p tcp'
    " -d 10.96.88.59 --dport 80 ! -s 10.244.0.0/16 -j KUBE-MARK-MASQ",
    '-A KUBE-SVC-LOLE4ISW44XBNF3G -m comment --comment "default/web -> 10.244.1.2:8080"'
    " -m statistic --mode random --probability 0.3333333333 -j KUBE-SEP-PXJ2U7QYT2QW5545",
    '-A KUBE-SVC-LOLE4ISW44XBNF3G -m comment --comment "default/web -> 10.244.2.2:8080"'
    " -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-5Q3P56IRA2PP7VYF",
    '-A KUBE-SVC-LOLE4ISW44XBNF3G -m comment --comment "default/web -> 10.244.2.3:8080"'
    " -j KUBE-SEP-G2TK3RG32KUOAWKQ",
    "-A KUBE-SEP-PXJ2U7QYT2QW5545 -m comment --comment default/web -s 10.244.1.2 -j KUBE-MARK-MASQ",
    "-A KUBE-SEP-PXJ2U7QYT2QW5545 -m comment --comment default/web -m tcp -p tcp"
    " -j DNAT --to-destination 10.244.1.2:8080",
    "-A KUBE-SEP-5Q3P56IRA2PP7VYF -m comment --comment default/web -m tcp -p tcp"
    " -j DNAT --to-destination 10.244.2.2:8080",
    "-A KUBE-SEP-G2TK3RG32KUOAWKQ -m comment --comment default/web -m tcp -p tcp"
    " -j DNAT --to-destination 10.244.2.3:8080",
    "-A KUBE-MARK-MASQ -j MARK --or-mark 0x00004000",
    "-A KUBE-POSTROUTING -m mark ! --mark 0x00004000/0x00004000 -j RETURN",
    "-A KUBE-POSTROUTING -j MARK --xor-mark 0x00004000",
    '-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT"'
    " -j MASQUERADE --random-fully",
    "-A KUBE-NODEPORTS -m comment --comment default/web-nodeport -m tcp -p tcp -d 127.0.0.0/8"
    " --dport 30080 -m nfacct --nfacct-name localhost_nps_accepted_pkts"
    " -j KUBE-EXT-GCYSPZR5VVR6P7RM",
    "-A KUBE-NODEPORTS -m comment --comment default/web-nodeport -m tcp -p tcp --dport 30080"
    " -j KUBE-EXT-GCYSPZR5VVR6P7RM",
    "-A KUBE-EXT-GCYSPZR5VVR6P7RM -m comment --comment"
    ' "masquerade traffic for default/web-nodeport external destinations" -j KUBE-MARK-MASQ',
    "-A KUBE-EXT-GCYSPZR5VVR6P7RM -j KUBE-SVC-GCYSPZR5VVR6P7RM",
    # The seed describes this one in words: INVALID, the ct_state_invalid_dropped_pkts
    # counter, DROP.
    "-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct"
    " --nfacct-name ct_state_invalid_dropped_pkts -j DROP",
]


@pytest.mark.parametrize("line", SEED_RESTORE)
def test_seed_lines_in_restore_form(line: str) -> None:
    assert line in all_lines(lab_render())


def test_seed_lines_as_iptables_save_prints_them() -> None:
    rendered = [save_form(line) for line in all_lines(lab_render()) if line.startswith("-A ")]
    missing = [line for line in SEED_SAVED if line not in rendered]
    assert not missing, "\n".join(missing)


def test_seed_chain_declarations() -> None:
    nat = plan_of(lab_render()).nat
    for chain in (
        "KUBE-SVC-LOLE4ISW44XBNF3G",
        "KUBE-SEP-PXJ2U7QYT2QW5545",
        "KUBE-SEP-5Q3P56IRA2PP7VYF",
        "KUBE-SEP-G2TK3RG32KUOAWKQ",
        "KUBE-SVC-GCYSPZR5VVR6P7RM",
        "KUBE-EXT-GCYSPZR5VVR6P7RM",
    ):
        assert chain in nat
    # The ClusterIP-only Service has no external chain.
    assert "KUBE-EXT-LOLE4ISW44XBNF3G" not in nat


def test_seed_jumps_from_builtin_chains() -> None:
    # PREROUTING/OUTPUT/POSTROUTING jumps come from the kernel step's prelude (an empty node).
    plan = plan_of(lab_render())
    pre = prelude(SavedRuleset(), {"filter": set(plan.filter), "nat": set(plan.nat)})
    saved = {save_form(line) for line in pre["nat"] if line.startswith("-I ")}
    for line in (
        '-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
        '-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
        '-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING',
    ):
        assert line in saved


def test_seed_local_policy_on_node_without_local_pods() -> None:
    # The seed patches web-nodeport to externalTrafficPolicy Local and looks at the
    # control-plane node, which runs no web pod: "default/web-nodeport has no local endpoints".
    docs = [d for f in sorted((LAB / "manifests").glob("*.yaml")) for d in _yaml_docs(f)]
    for d in docs:
        if d["kind"] == "Service" and d["metadata"]["name"] == "web-nodeport":
            d["spec"]["externalTrafficPolicy"] = "Local"
    cfg = load_config(LAB / "config.yaml")
    worker = Harness(docs, cfg, nfacct=True, node="kind-worker").render(full=True)
    plane = Harness(docs, cfg, nfacct=True, node="kind-control-plane").render(full=True)
    assert rules_of(plane, "filter", names.EXTERNAL_SERVICES) == [
        "-A KUBE-EXTERNAL-SERVICES -m comment --comment"
        ' "default/web-nodeport has no local endpoints" -m addrtype --dst-type LOCAL'
        " -m tcp -p tcp --dport 30080 -j DROP"
    ]
    assert "KUBE-SVL-GCYSPZR5VVR6P7RM" not in plan_of(plane).nat
    assert rules_of(worker, "filter", names.EXTERNAL_SERVICES) == []
    assert rules_of(worker, "nat", "KUBE-SVL-GCYSPZR5VVR6P7RM") == [
        '-A KUBE-SVL-GCYSPZR5VVR6P7RM -m comment --comment "default/web-nodeport ->'
        ' 10.244.1.2:8080" -j KUBE-SEP-HRJE3WXYHVOYWUBC'
    ]
    assert rules_of(worker, "nat", "KUBE-EXT-GCYSPZR5VVR6P7RM")[-1] == (
        "-A KUBE-EXT-GCYSPZR5VVR6P7RM -j KUBE-SVL-GCYSPZR5VVR6P7RM"
    )


def _yaml_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


# --- 2. scenarios ported from upstream's proxier_test.go ----------------------------------------


def overall_objects() -> list[dict[str, Any]]:
    """TestOverallIPTablesRules: ClusterIP, LB (Local), NodePort, ExternalIP, LB with source
    ranges, and a Service without endpoints."""
    return render_kit.overall_objects(node_obj(), NODE)


def test_upstream_overall() -> None:
    rendered = render(overall_objects())
    assert_golden("upstream-overall", rendered)
    # The Cluster-policy LB's healthCheckNodePort is not opened (upstream: NeedsHealthCheck).
    assert rules_of(rendered, "filter", names.NODEPORTS) == [
        '-A KUBE-NODEPORTS -m comment --comment "ns2/svc2:p80 health check node port"'
        " -m tcp -p tcp --dport 30000 -j ACCEPT"
    ]


def lb_source_ranges_objects() -> list[dict[str, Any]]:
    return render_kit.lb_source_ranges_objects(node_obj())


def test_upstream_load_balancer_source_ranges() -> None:
    rendered = render(lb_source_ranges_objects())
    assert_golden("upstream-loadbalancer", rendered)
    fw = rules_of(rendered, "nat", "KUBE-FW-XPGD46QRK7WJZT7O")
    head = '-A KUBE-FW-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 loadbalancer IP"'
    assert fw == [
        f"{head} -s 192.168.0.0/24 -j KUBE-EXT-XPGD46QRK7WJZT7O",
        f"{head} -s 203.0.113.0/25 -j KUBE-EXT-XPGD46QRK7WJZT7O",
        # allowFromNode: 192.168.0.0/24 holds the node IP, so the VIPs may be sources too.
        f"{head} -s 1.2.3.4 -j KUBE-EXT-XPGD46QRK7WJZT7O",
        f"{head} -s 5.6.7.8 -j KUBE-EXT-XPGD46QRK7WJZT7O",
        "-A KUBE-FW-XPGD46QRK7WJZT7O -m comment --comment"
        ' "other traffic to ns1/svc1:p80 will be dropped by KUBE-PROXY-FIREWALL"',
    ]
    assert rules_of(rendered, "filter", names.PROXY_FIREWALL) == [
        '-A KUBE-PROXY-FIREWALL -m comment --comment "ns1/svc1:p80 traffic not accepted by'
        f' KUBE-FW-XPGD46QRK7WJZT7O" -m tcp -p tcp -d {vip} --dport 80 -j DROP'
        for vip in ("1.2.3.4", "5.6.7.8")
    ]


def test_source_ranges_without_node_ip_do_not_allow_vips() -> None:
    objects = lb_source_ranges_objects()
    objects[1]["spec"]["loadBalancerSourceRanges"] = ["203.0.113.0/25"]
    fw = rules_of(render(objects), "nat", "KUBE-FW-XPGD46QRK7WJZT7O")
    assert [line.split(" -s ")[1].split()[0] for line in fw if " -s " in line] == ["203.0.113.0/25"]


def test_allow_from_node_checks_the_primary_node_ip_only() -> None:
    # Upstream compares the ranges with its one node IP of the family (the first address).
    objects = lb_source_ranges_objects()
    objects[0] = node_obj(addresses=("172.18.0.9", NODE_IP))
    fw = rules_of(render(objects), "nat", "KUBE-FW-XPGD46QRK7WJZT7O")
    assert not any(" -s 1.2.3.4 " in line for line in fw)


def etp_local_objects() -> list[dict[str, Any]]:
    return render_kit.etp_local_objects(node_obj(), NODE)


def test_upstream_external_traffic_policy_local() -> None:
    rendered = render(etp_local_objects())
    assert_golden("upstream-etp-local", rendered)
    assert rules_of(rendered, "nat", "KUBE-EXT-XPGD46QRK7WJZT7O") == [
        '-A KUBE-EXT-XPGD46QRK7WJZT7O -m comment --comment "pod traffic for ns1/svc1:p80'
        ' external destinations" -s 10.0.0.0/8 -j KUBE-SVC-XPGD46QRK7WJZT7O',
        '-A KUBE-EXT-XPGD46QRK7WJZT7O -m comment --comment "masquerade LOCAL traffic for'
        ' ns1/svc1:p80 external destinations" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ',
        '-A KUBE-EXT-XPGD46QRK7WJZT7O -m comment --comment "route LOCAL traffic for'
        ' ns1/svc1:p80 external destinations" -m addrtype --src-type LOCAL'
        " -j KUBE-SVC-XPGD46QRK7WJZT7O",
        "-A KUBE-EXT-XPGD46QRK7WJZT7O -j KUBE-SVL-XPGD46QRK7WJZT7O",
    ]
    assert rules_of(rendered, "nat", "KUBE-SVL-XPGD46QRK7WJZT7O") == [
        '-A KUBE-SVL-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.2.1:80"'
        " -j KUBE-SEP-ZX7GRIZKSNUQ3LAJ"
    ]
    assert rules_of(rendered, "filter", names.EXTERNAL_SERVICES) == []


def test_external_traffic_policy_local_without_local_endpoints() -> None:
    objects = etp_local_objects()
    objects[2] = endpoint_slice("ns1", "svc1", [ep("10.180.0.1"), ep("10.180.2.1", "host2")])
    rendered = render(objects)
    drop = '-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns1/svc1:p80 has no local endpoints"'
    assert rules_of(rendered, "filter", names.EXTERNAL_SERVICES) == [
        f"{drop} -m tcp -p tcp -d 192.168.99.11 --dport 80 -j DROP",
        f"{drop} -m tcp -p tcp -d 1.2.3.4 --dport 80 -j DROP",
        f"{drop} -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 3001 -j DROP",
    ]
    # The short-circuit rules stay, without the final jump to a local chain.
    ext = rules_of(rendered, "nat", "KUBE-EXT-XPGD46QRK7WJZT7O")
    assert len(ext) == 3 and all("KUBE-SVL" not in line for line in ext)
    assert "KUBE-SVL-XPGD46QRK7WJZT7O" not in plan_of(rendered).nat
    # The health check port stays open, local endpoints or not.
    assert len(rules_of(rendered, "filter", names.NODEPORTS)) == 1
    assert plan_of(rendered).no_local_endpoints == {"internal": 0, "external": 1}


def test_upstream_non_local_external_ips() -> None:
    """TestNonLocalExternalIPs: a ClusterIP Service with an external IP, Cluster policy."""
    objects = [
        node_obj(),
        service("ns1", "svc1", "172.30.0.41", [port()], externalIPs=["192.168.99.11"]),
        endpoint_slice("ns1", "svc1", [ep("10.180.0.1"), ep("10.180.2.1", NODE)]),
    ]
    rendered = render(objects)
    assert_golden("upstream-external-ips", rendered)
    assert (
        '-A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 external IP" -m tcp -p tcp'
        " -d 192.168.99.11 --dport 80 -j KUBE-EXT-XPGD46QRK7WJZT7O"
    ) in rules_of(rendered, "nat", names.SERVICES)


def local_nodeport_objects(family: IPFamily = V4) -> list[dict[str, Any]]:
    """upstream's localhost-NodePort and only-local-NodePort tests: a NodePort Service with
    externalTrafficPolicy Local, one remote and one local endpoint."""
    if family is V6:
        return [
            node_obj(addresses=("2001:db8::2",)),
            service(
                "ns1",
                "svc1",
                "fd00:ab34::20",
                [port(node_port=30001)],
                type="NodePort",
                externalTrafficPolicy="Local",
            ),
            endpoint_slice("ns1", "svc1", [ep("ff06::c1"), ep("ff06::c2", NODE)], family="IPv6"),
        ]
    return [
        node_obj(),
        service(
            "ns1",
            "svc1",
            "10.69.0.10",
            [port(node_port=30001)],
            type="NodePort",
            externalTrafficPolicy="Local",
        ),
        endpoint_slice("ns1", "svc1", [ep("10.244.0.1"), ep("10.244.2.1", NODE)]),
    ]


def test_upstream_localhost_nodeports_enabled_ipv4() -> None:
    """TestEnableLocalhostNodePortsIPv4 (no local-traffic detector)."""
    rendered = render(local_nodeport_objects(), NO_DETECTOR)
    assert_golden("upstream-localhost-nodeports-ipv4", rendered)
    assert rules_of(rendered, "nat", names.SERVICES)[-1].endswith(
        "-m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"
    )
    assert KUBELET_FIREWALL in plan_of(rendered).filter


def test_upstream_localhost_nodeports_disabled_ipv4() -> None:
    """TestDisableLocalhostNodePortsIPv4: 127/8 excluded, no anti-martian rule."""
    rendered = render(local_nodeport_objects(), {"iptables": {"localhostNodePorts": False}})
    assert_golden("upstream-no-localhost-nodeports-ipv4", rendered)
    assert rules_of(rendered, "nat", names.SERVICES)[-1] == (
        '-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be'
        ' the last rule in this chain" -m addrtype --dst-type LOCAL ! -d 127.0.0.0/8'
        " -j KUBE-NODEPORTS"
    )
    assert KUBELET_FIREWALL not in plan_of(rendered).filter


def test_upstream_ipv6_nodeports() -> None:
    """TestEnableLocalhostNodePortsIPv6: IPv6 never gets localhost NodePorts."""
    rendered = render(local_nodeport_objects(V6), NO_DETECTOR, families=(V6,))
    assert_golden("upstream-ipv6-nodeports", rendered)
    (plan,) = rendered.plans
    assert plan.family is V6
    assert str(rendered).startswith("# ip6tables-restore --noflush input (IPv6, full sync)\n")
    assert plan.nat[names.SERVICES][-1] == (
        '-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be'
        ' the last rule in this chain" -m addrtype --dst-type LOCAL ! -d ::1/128'
        " -j KUBE-NODEPORTS"
    )
    assert KUBELET_FIREWALL not in plan.filter
    assert (
        "-A KUBE-SEP-LIGRYQQLSZN4UWQ5 -m comment --comment ns1/svc1:p80 -m tcp -p tcp"
        " -j DNAT --to-destination [ff06::c1]:80"
    ) in plan.nat["KUBE-SEP-LIGRYQQLSZN4UWQ5"]


def test_ipv6_plan_never_writes_localhost_nodeports_even_if_configured() -> None:
    rendered = render(local_nodeport_objects(V6), NO_DETECTOR, families=(V6,), nfacct=True)
    text = str(rendered)
    assert "127.0.0.0/8" not in text and "localhost_nps_accepted_pkts" not in text


def test_dual_stack_renders_one_plan_per_family() -> None:
    objects = [
        node_obj(addresses=(NODE_IP, "2001:db8::2")),
        service(
            "ns1",
            "svc1",
            "172.30.0.41",
            [port()],
            clusterIPs=["172.30.0.41", "fd00::41"],
            ipFamilies=["IPv4", "IPv6"],
        ),
        endpoint_slice("ns1", "svc1", [ep("10.180.0.1")]),
        endpoint_slice("ns1", "svc1", [ep("fd00:10::1")], family="IPv6", name="svc1-v6"),
    ]
    rendered = render(objects, {"clusterCIDR": "10.0.0.0/8,fd00:10::/64"}, families=(V4, V6))
    v4, v6 = plan_of(rendered, V4), plan_of(rendered, V6)
    assert v4.nat["KUBE-SVC-XPGD46QRK7WJZT7O"][0].endswith(
        "-d 172.30.0.41 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ"
    )
    assert v6.nat["KUBE-SVC-XPGD46QRK7WJZT7O"][0].endswith(
        "-d fd00::41 --dport 80 ! -s fd00:10::/64 -j KUBE-MARK-MASQ"
    )
    assert "KUBE-SEP-SXIVWICOYRO3J4NJ" in v4.nat and "KUBE-SEP-SXIVWICOYRO3J4NJ" not in v6.nat


def only_local_objects() -> list[dict[str, Any]]:
    """upstream's onlyLocalNodePorts(): a NodePort Service, Local policy, one local endpoint."""
    return [
        node_obj(),
        svc1("NodePort", externalTrafficPolicy="Local"),
        endpoint_slice("ns1", "svc1", [ep("10.180.0.1"), ep("10.180.2.1", NODE)]),
    ]


def test_upstream_only_local_nodeports() -> None:
    """TestOnlyLocalNodePorts: nodePortAddresses selects the node IP; localhost is off."""
    cfg = {
        **UPSTREAM,
        "nodePortAddresses": ["192.168.0.0/24", "2001:db8::/64"],
        "iptables": {"localhostNodePorts": False},
    }
    rendered = render(only_local_objects(), cfg)
    assert_golden("upstream-only-local-nodeports", rendered)
    assert rules_of(rendered, "nat", names.SERVICES)[-1] == (
        '-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be'
        ' the last rule in this chain" -d 192.168.0.2 -j KUBE-NODEPORTS'
    )


def test_upstream_only_local_nodeports_without_cluster_cidr() -> None:
    """TestOnlyLocalNodePortsNoClusterCIDR: no pod-traffic short-circuit, no masquerade."""
    cfg = {
        "nodePortAddresses": ["192.168.0.0/24", "2001:db8::/64"],
        "iptables": {"localhostNodePorts": False},
    }
    rendered = render(only_local_objects(), cfg)
    ext = rules_of(rendered, "nat", "KUBE-EXT-XPGD46QRK7WJZT7O")
    assert not any("pod traffic for" in line for line in ext)
    assert len(ext) == 3
    assert not any(
        "KUBE-MARK-MASQ" in line for line in rules_of(rendered, "nat", "KUBE-SVC-XPGD46QRK7WJZT7O")
    )


def test_node_port_addresses_without_loopback_disable_localhost_nodeports() -> None:
    cfg = {**UPSTREAM, "nodePortAddresses": ["192.168.0.0/24"]}
    rendered = render(only_local_objects(), cfg, nfacct=True)
    assert KUBELET_FIREWALL not in plan_of(rendered).filter
    assert "localhost_nps_accepted_pkts" not in str(rendered)


def itp_objects(policy: str, nodes: Sequence[str]) -> list[dict[str, Any]]:
    """TestInternalTrafficPolicyE2E: an unnamed port, three endpoints."""
    return [
        node_obj(),
        service("ns1", "svc1", "172.30.1.1", [port(name="")], internalTrafficPolicy=policy),
        endpoint_slice(
            "ns1",
            "svc1",
            [ep(f"10.0.1.{i}", n, ready=True) for i, n in enumerate(nodes, 1)],
            [port(name="")],
        ),
    ]


def test_upstream_internal_traffic_policy_cluster() -> None:
    rendered = render(itp_objects("Cluster", (NODE, "host1", "host2")))
    assert_golden("upstream-itp-cluster", rendered)


def test_upstream_internal_traffic_policy_local() -> None:
    rendered = render(itp_objects("Local", (NODE, "host1", "host2")))
    assert_golden("upstream-itp-local", rendered)
    assert rules_of(rendered, "nat", names.SERVICES)[0] == (
        '-A KUBE-SERVICES -m comment --comment "ns1/svc1 cluster IP" -m tcp -p tcp'
        " -d 172.30.1.1 --dport 80 -j KUBE-SVL-AQI2S6QIMU7PVVRP"
    )
    assert rules_of(rendered, "nat", "KUBE-SVL-AQI2S6QIMU7PVVRP") == [
        '-A KUBE-SVL-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 cluster IP" -m tcp -p tcp'
        " -d 172.30.1.1 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ",
        '-A KUBE-SVL-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 -> 10.0.1.1:80"'
        " -j KUBE-SEP-3JOIVZTXZZRGORX4",
    ]
    assert "KUBE-SVC-AQI2S6QIMU7PVVRP" not in plan_of(rendered).nat


def test_upstream_internal_traffic_policy_local_without_local_endpoints() -> None:
    rendered = render(itp_objects("Local", ("host0", "host1", "host2")))
    assert_golden("upstream-itp-local-no-local-endpoints", rendered)
    assert rules_of(rendered, "filter", names.SERVICES) == [
        '-A KUBE-SERVICES -m comment --comment "ns1/svc1 has no local endpoints" -m tcp -p tcp'
        " -d 172.30.1.1 --dport 80 -j DROP"
    ]
    assert plan_of(rendered).no_local_endpoints == {"internal": 1, "external": 0}


def terminating_objects(policy: str, endpoints: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """TestTerminatingEndpointsTrafficPolicy{Local,Cluster}: LB, ClientIP affinity, HC port."""
    return render_kit.terminating_objects(
        node_obj(), policy, endpoints, health_check_node_port=30000
    )


READY = {"ready": True, "serving": True, "terminating": False}
TERMINATING = {"ready": False, "serving": True, "terminating": True}
GONE = {"ready": False, "serving": False, "terminating": True}


@pytest.mark.parametrize(
    ("golden", "endpoints"),
    [
        (
            "upstream-terminating-local-ready",
            [
                ep("10.0.1.1", NODE, **READY),
                ep("10.0.1.2", NODE, **READY),
                ep("10.0.1.3", NODE, **TERMINATING),
                ep("10.0.1.4", NODE, **GONE),
                ep("10.0.1.5", "host-1", **READY),
            ],
        ),
        (
            "upstream-terminating-local-only-terminating",
            [
                ep("10.0.1.2", NODE, **TERMINATING),
                ep("10.0.1.3", NODE, **TERMINATING),
                ep("10.0.1.4", NODE, **GONE),
                ep("10.0.1.5", "host-1", **READY),
            ],
        ),
        (
            "upstream-terminating-local-remote-only",
            [ep("10.0.1.5", "host-1", **TERMINATING)],
        ),
        (
            "upstream-terminating-local-none-usable",
            [ep("10.0.1.5", NODE, **GONE), ep("10.0.1.5", "host-1", **GONE)],
        ),
    ],
)
def test_upstream_terminating_endpoints_policy_local(
    golden: str, endpoints: list[dict[str, Any]]
) -> None:
    assert_golden(golden, render(terminating_objects("Local", endpoints)))


@pytest.mark.parametrize(
    ("golden", "endpoints"),
    [
        (
            "upstream-terminating-cluster-ready",
            [
                ep("10.0.1.1", NODE, **READY),
                ep("10.0.1.2", NODE, **READY),
                ep("10.0.1.3", "another-host", **TERMINATING),
                ep("10.0.1.4", "another-host", **GONE),
                ep("10.0.1.5", "another-host", **READY),
            ],
        ),
        (
            "upstream-terminating-cluster-only-terminating",
            [
                ep("10.0.1.2", NODE, **TERMINATING),
                ep("10.0.1.3", NODE, **TERMINATING),
                ep("10.0.1.4", "another-host", **GONE),
                ep("10.0.1.5", "another-host", **TERMINATING),
            ],
        ),
    ],
)
def test_upstream_terminating_endpoints_policy_cluster(
    golden: str, endpoints: list[dict[str, Any]]
) -> None:
    assert_golden(golden, render(terminating_objects("Cluster", endpoints)))


def test_upstream_no_endpoints_reject() -> None:
    """TestNoEndpointsReject: cluster IP, external IP, NodePort and LB IP all REJECT."""
    objects = [
        node_obj(),
        svc1("LoadBalancer", externalIPs=["192.168.99.11"], ingress=["1.2.3.4"]),
    ]
    rendered = render(objects)
    assert_golden("upstream-no-endpoints", rendered)
    reject = '-m comment --comment "ns1/svc1:p80 has no endpoints"'
    assert rules_of(rendered, "filter", names.SERVICES) == [
        f"-A KUBE-SERVICES {reject} -m tcp -p tcp -d 172.30.0.41 --dport 80 -j REJECT"
    ]
    assert rules_of(rendered, "filter", names.EXTERNAL_SERVICES) == [
        f"-A KUBE-EXTERNAL-SERVICES {reject} -m tcp -p tcp -d 192.168.99.11 --dport 80 -j REJECT",
        f"-A KUBE-EXTERNAL-SERVICES {reject} -m tcp -p tcp -d 1.2.3.4 --dport 80 -j REJECT",
        f"-A KUBE-EXTERNAL-SERVICES {reject} -m addrtype --dst-type LOCAL -m tcp -p tcp"
        " --dport 3001 -j REJECT",
    ]
    # No nat chain at all for the Service (upstream: "we will not generate any chains").
    assert [c for c in plan_of(rendered).nat if names.is_service_chain(c)] == []
    assert rules_of(rendered, "nat", names.NODEPORTS) == []
    # The seed: "a Service with an empty selector gets -j REJECT --reject-with
    # icmp-port-unreachable" in the filter table.
    assert save_form(rules_of(rendered, "filter", names.SERVICES)[0]).endswith(
        "-j REJECT --reject-with icmp-port-unreachable"
    )


def test_upstream_cluster_ip_general_with_sctp() -> None:
    """TestClusterIPGeneral: named ports, a targetPort, TCP and SCTP on the same port."""
    objects = [
        node_obj(),
        service("ns1", "svc1", "172.30.0.41", [port(name="http")]),
        service(
            "ns2",
            "svc2",
            "172.30.0.42",
            [
                port(80, "http"),
                port(443, "https"),
                port(53, "dns-sctp", "SCTP"),
                port(53, "dns-tcp"),
            ],
        ),
        endpoint_slice("ns1", "svc1", [ep("10.180.0.1", NODE)], [port(80, "http")]),
        endpoint_slice(
            "ns2",
            "svc2",
            [ep("10.180.0.1", NODE), ep("10.180.2.1", "host2")],
            [
                port(80, "http"),
                port(8443, "https"),
                port(53, "dns-sctp", "SCTP"),
                port(5353, "dns-tcp"),
            ],
        ),
    ]
    rendered = render(objects)
    assert_golden("upstream-cluster-ip-general", rendered)
    services = rules_of(rendered, "nat", names.SERVICES)
    assert any("-m sctp -p sctp -d 172.30.0.42 --dport 53" in line for line in services)
    assert any("-m tcp -p tcp -d 172.30.0.42 --dport 53" in line for line in services)


# --- 2b. features one at a time -----------------------------------------------------------------


def one_service(**spec: Any) -> list[dict[str, Any]]:
    ports = spec.pop("ports", [port(node_port=3001)])
    protocol = ports[0]["protocol"]
    return [
        node_obj(pod_cidrs=("10.244.1.0/24",)),
        service("ns1", "svc1", "172.30.0.41", ports, **{"type": "NodePort", **spec}),
        endpoint_slice(
            "ns1",
            "svc1",
            [ep("10.180.0.1", NODE), ep("10.180.2.1", "host2")],
            [port(name=ports[0]["name"], protocol=protocol)],
        ),
    ]


@pytest.mark.parametrize("protocol", ["UDP", "SCTP"])
def test_udp_and_sctp(protocol: str) -> None:
    lower = protocol.lower()
    spn = ServicePortName("ns1", "svc1", "p80", Protocol(protocol))
    svc, ext = names.service_chain(spn), names.external_chain(spn)
    sep = names.endpoint_chain(spn, Endpoint("10.180.0.1", 80))
    rendered = render(one_service(ports=[port(protocol=protocol, node_port=3001)]))
    assert rules_of(rendered, "nat", names.SERVICES)[0] == (
        f'-A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 cluster IP" -m {lower} -p {lower}'
        f" -d 172.30.0.41 --dport 80 -j {svc}"
    )
    assert rules_of(rendered, "nat", names.NODEPORTS) == [
        f"-A KUBE-NODEPORTS -m comment --comment ns1/svc1:p80 -m {lower} -p {lower}"
        f" --dport 3001 -j {ext}"
    ]
    assert rules_of(rendered, "nat", sep)[-1] == (
        f"-A {sep} -m comment --comment ns1/svc1:p80 -m {lower} -p {lower}"
        " -j DNAT --to-destination 10.180.0.1:80"
    )
    assert svc != names.service_chain(ServicePortName("ns1", "svc1", "p80", Protocol.TCP))


def test_health_check_node_port_is_always_tcp() -> None:
    rendered = render(
        one_service(
            type="LoadBalancer",
            externalTrafficPolicy="Local",
            healthCheckNodePort=32000,
            ports=[port(protocol="UDP", node_port=3001)],
        )
    )
    assert rules_of(rendered, "filter", names.NODEPORTS) == [
        '-A KUBE-NODEPORTS -m comment --comment "ns1/svc1:p80 health check node port"'
        " -m tcp -p tcp --dport 32000 -j ACCEPT"
    ]


def test_health_check_node_port_needs_local_load_balancer() -> None:
    # NodePort + Local, or LoadBalancer + Cluster: upstream's NeedsHealthCheck is false.
    for spec in (
        {"externalTrafficPolicy": "Local", "healthCheckNodePort": 32000},
        {"type": "LoadBalancer", "healthCheckNodePort": 32000},
    ):
        assert rules_of(render(one_service(**spec)), "filter", names.NODEPORTS) == []


@pytest.mark.parametrize("timeout", [10800, 300])
def test_session_affinity_client_ip(timeout: int) -> None:
    spn = ServicePortName("ns1", "svc1", "p80")
    seps = [names.endpoint_chain(spn, Endpoint(ip, 80)) for ip in ("10.180.0.1", "10.180.2.1")]
    rendered = render(
        one_service(
            sessionAffinity="ClientIP",
            sessionAffinityConfig={"clientIP": {"timeoutSeconds": timeout}},
        )
    )
    c1 = '-m comment --comment "ns1/svc1:p80 -> 10.180.0.1:80"'
    c2 = '-m comment --comment "ns1/svc1:p80 -> 10.180.2.1:80"'
    recent = f"--rcheck --seconds {timeout} --reap"
    assert rules_of(rendered, "nat", "KUBE-SVC-XPGD46QRK7WJZT7O")[1:] == [
        f"-A KUBE-SVC-XPGD46QRK7WJZT7O {c1} -m recent --name {seps[0]} {recent} -j {seps[0]}",
        f"-A KUBE-SVC-XPGD46QRK7WJZT7O {c2} -m recent --name {seps[1]} {recent} -j {seps[1]}",
        f"-A KUBE-SVC-XPGD46QRK7WJZT7O {c1} -m statistic --mode random --probability"
        f" 0.5000000000 -j {seps[0]}",
        f"-A KUBE-SVC-XPGD46QRK7WJZT7O {c2} -j {seps[1]}",
    ]
    assert rules_of(rendered, "nat", seps[0]) == [
        f"-A {seps[0]} -m comment --comment ns1/svc1:p80 -s 10.180.0.1 -j KUBE-MARK-MASQ",
        f"-A {seps[0]} -m comment --comment ns1/svc1:p80 -m recent --name {seps[0]} --set"
        " -m tcp -p tcp -j DNAT --to-destination 10.180.0.1:80",
    ]


def test_masquerade_all() -> None:
    rendered = render(one_service(), {**UPSTREAM, "iptables": {"masqueradeAll": True}})
    assert rules_of(rendered, "nat", "KUBE-SVC-XPGD46QRK7WJZT7O")[0] == (
        '-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp'
        " -p tcp -d 172.30.0.41 --dport 80 -j KUBE-MARK-MASQ"
    )


@pytest.mark.parametrize(
    ("cfg", "not_local", "local"),
    [
        ({"clusterCIDR": "10.0.0.0/8"}, "! -s 10.0.0.0/8", "-s 10.0.0.0/8"),
        (
            {"clusterCIDR": "10.0.0.0/8", "detectLocalMode": "NodeCIDR"},
            "! -s 10.244.1.0/24",
            "-s 10.244.1.0/24",
        ),
        (
            {"detectLocalMode": "BridgeInterface", "detectLocal": {"bridgeInterface": "cbr0"}},
            "! -i cbr0",
            "-i cbr0",
        ),
        (
            {
                "detectLocalMode": "InterfaceNamePrefix",
                "detectLocal": {"interfaceNamePrefix": "veth"},
            },
            "! -i veth+",
            "-i veth+",
        ),
    ],
)
def test_detect_local_modes(cfg: dict[str, Any], not_local: str, local: str) -> None:
    rendered = render(one_service(externalTrafficPolicy="Local"), cfg)
    assert rules_of(rendered, "nat", "KUBE-SVC-XPGD46QRK7WJZT7O")[0] == (
        '-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp'
        f" -p tcp -d 172.30.0.41 --dport 80 {not_local} -j KUBE-MARK-MASQ"
    )
    assert rules_of(rendered, "nat", "KUBE-EXT-XPGD46QRK7WJZT7O")[0] == (
        '-A KUBE-EXT-XPGD46QRK7WJZT7O -m comment --comment "pod traffic for ns1/svc1:p80'
        f' external destinations" {local} -j KUBE-SVC-XPGD46QRK7WJZT7O'
    )


@pytest.mark.parametrize(
    "cfg", [{}, {"detectLocalMode": "NodeCIDR"}], ids=["no-cluster-cidr", "node-without-cidr"]
)
def test_no_local_detector_means_no_masquerade_rule(cfg: dict[str, Any]) -> None:
    objects = one_service(externalTrafficPolicy="Local")
    objects[0] = node_obj()  # no pod CIDR for NodeCIDR to use
    rendered = render(objects, cfg)
    svc = rules_of(rendered, "nat", "KUBE-SVC-XPGD46QRK7WJZT7O")
    assert not any("KUBE-MARK-MASQ" in line for line in svc)
    assert not any(
        "pod traffic" in line for line in rules_of(rendered, "nat", "KUBE-EXT-XPGD46QRK7WJZT7O")
    )


def test_node_port_addresses_cidrs() -> None:
    cfg = {**UPSTREAM, "nodePortAddresses": ["192.168.0.0/16", "172.18.0.0/16"]}
    objects = one_service()
    objects[0] = node_obj(addresses=("172.18.0.5", NODE_IP, "10.1.1.1"))
    services = rules_of(render(objects, cfg), "nat", names.SERVICES)
    head = (
        '-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be'
        ' the last rule in this chain"'
    )
    # One jump per matching node address, after every service rule (upstream's order of the
    # addresses is Go map order, so only the set is compared).
    assert services[0].startswith('-A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 cluster')
    assert sorted(services[1:]) == [
        f"{head} -d 172.18.0.5 -j KUBE-NODEPORTS",
        f"{head} -d 192.168.0.2 -j KUBE-NODEPORTS",
    ]


def test_node_port_addresses_primary() -> None:
    cfg = {**UPSTREAM, "nodePortAddresses": ["primary"]}
    objects = one_service()
    objects[0] = node_obj(addresses=("172.18.0.5", NODE_IP))
    assert rules_of(render(objects, cfg), "nat", names.SERVICES)[-1] == (
        '-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be'
        ' the last rule in this chain" -d 172.18.0.5 -j KUBE-NODEPORTS'
    )


def test_localhost_node_ports_false_drops_the_127_rule() -> None:
    cfg = {**UPSTREAM, "iptables": {"localhostNodePorts": False}}
    rendered = render(one_service(), cfg, nfacct=True)
    assert rules_of(rendered, "nat", names.SERVICES)[-1].endswith(
        "-m addrtype --dst-type LOCAL ! -d 127.0.0.0/8 -j KUBE-NODEPORTS"
    )
    assert rules_of(rendered, "nat", names.NODEPORTS) == [
        "-A KUBE-NODEPORTS -m comment --comment ns1/svc1:p80 -m tcp -p tcp --dport 3001"
        " -j KUBE-EXT-XPGD46QRK7WJZT7O"
    ]
    assert KUBELET_FIREWALL not in plan_of(rendered).filter


def test_localhost_node_ports_with_nfacct() -> None:
    rendered = render(one_service(), nfacct=True)
    assert rules_of(rendered, "nat", names.NODEPORTS) == [
        "-A KUBE-NODEPORTS -m comment --comment ns1/svc1:p80 -m tcp -p tcp -d 127.0.0.0/8"
        " --dport 3001 -m nfacct --nfacct-name localhost_nps_accepted_pkts"
        " -j KUBE-EXT-XPGD46QRK7WJZT7O",
        "-A KUBE-NODEPORTS -m comment --comment ns1/svc1:p80 -m tcp -p tcp --dport 3001"
        " -j KUBE-EXT-XPGD46QRK7WJZT7O",
    ]
    assert rules_of(rendered, "filter", KUBELET_FIREWALL) == [
        '-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections"'
        " -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT"
        " -j DROP"
    ]


@pytest.mark.parametrize("nfacct", [False, True])
def test_conntrack_tcp_be_liberal_drops_invalid_rule(nfacct: bool) -> None:
    forward = rules_of(render(one_service(), nfacct=nfacct), "filter", names.FORWARD)
    assert "--ctstate INVALID" in forward[0]
    liberal = {**UPSTREAM, "conntrack": {"tcpBeLiberal": True}}
    forward = rules_of(render(one_service(), liberal, nfacct=nfacct), "filter", names.FORWARD)
    assert forward == [
        '-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules"'
        " -m mark --mark 0x00004000/0x00004000 -j ACCEPT",
        '-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule"'
        " -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
    ]


@pytest.mark.parametrize(
    ("bit", "mark"), [(14, "0x00004000"), (0, "0x00000001"), (20, "0x00100000"), (31, "0x80000000")]
)
def test_masquerade_bit(bit: int, mark: str) -> None:
    rendered = render(one_service(), {**UPSTREAM, "iptables": {"masqueradeBit": bit}})
    assert rules_of(rendered, "nat", names.MARK_MASQ) == [
        f"-A KUBE-MARK-MASQ -j MARK --or-mark {mark}"
    ]
    assert rules_of(rendered, "nat", names.POSTROUTING)[:2] == [
        f"-A KUBE-POSTROUTING -m mark ! --mark {mark}/{mark} -j RETURN",
        f"-A KUBE-POSTROUTING -j MARK --xor-mark {mark}",
    ]
    assert (
        f"-m mark --mark {mark}/{mark} -j ACCEPT" in rules_of(rendered, "filter", names.FORWARD)[1]
    )


def test_go_hex_mark() -> None:
    # Go's fmt.Sprintf("%#08x", 1<<14): width 8 counts the digits only.
    assert go_hex_mark(f"{1 << 14:#08x}") == "0x00004000"
    assert go_hex_mark("0x4000") == "0x00004000"


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (1, []),
        (2, ["0.5000000000"]),
        (3, ["0.3333333333", "0.5000000000"]),
        (4, ["0.2500000000", "0.3333333333", "0.5000000000"]),
        (5, ["0.2000000000", "0.2500000000", "0.3333333333", "0.5000000000"]),
    ],
)
def test_probabilities(n: int, expected: list[str]) -> None:
    objects = [
        node_obj(),
        service("ns1", "svc1", "172.30.0.41", [port()]),
        endpoint_slice("ns1", "svc1", [ep(f"10.180.0.{i}") for i in range(1, n + 1)]),
    ]
    rules = rules_of(render(objects), "nat", "KUBE-SVC-XPGD46QRK7WJZT7O")[1:]
    assert len(rules) == n
    got = [line.split("--probability ")[1].split()[0] for line in rules if "--probability" in line]
    assert got == expected
    assert "statistic" not in rules[-1]
    assert [probability(k) for k in range(1, 6)] == [
        "1.0000000000",
        "0.5000000000",
        "0.3333333333",
        "0.2500000000",
        "0.2000000000",
    ]


def test_endpoints_in_upstream_order() -> None:
    # Upstream sorts a service's endpoints by their "ip:port" string (endpointslicecache.go,
    # byEndpoint), not numerically.
    objects = [
        node_obj(),
        service("ns1", "svc1", "172.30.0.41", [port()]),
        endpoint_slice("ns1", "svc1", [ep("10.0.0.9"), ep("10.0.0.10"), ep("10.0.0.1")]),
    ]
    rules = rules_of(render(objects), "nat", "KUBE-SVC-XPGD46QRK7WJZT7O")[1:]
    assert [line.split("-> ")[1].split('"')[0] for line in rules] == [
        "10.0.0.10:80",  # "0" sorts before ":"
        "10.0.0.1:80",
        "10.0.0.9:80",
    ]


def large_cluster_objects(n: int) -> list[dict[str, Any]]:
    return [
        node_obj(),
        service("ns1", "svc1", "172.30.0.41", [port()]),
        service("ns2", "svc2", "172.30.0.42", [port()]),
        endpoint_slice("ns1", "svc1", [ep(f"10.1.{i // 250}.{i % 250 + 1}") for i in range(n)]),
        endpoint_slice("ns2", "svc2", [ep("10.180.0.2")]),
    ]


def test_large_cluster_mode_drops_endpoint_comments() -> None:
    rendered = render(large_cluster_objects(1000))  # 1001 endpoints in all
    plan = plan_of(rendered)
    assert plan.large_cluster
    sep = names.endpoint_chain(ServicePortName("ns2", "svc2", "p80"), Endpoint("10.180.0.2", 80))
    assert plan.nat[sep] == (
        f"-A {sep} -s 10.180.0.2 -j KUBE-MARK-MASQ",
        f"-A {sep} -m tcp -p tcp -j DNAT --to-destination 10.180.0.2:80",
    )
    svc2 = plan.nat[names.service_chain(ServicePortName("ns2", "svc2", "p80"))]
    assert svc2[-1] == f"-A {names.service_chain(ServicePortName('ns2', 'svc2', 'p80'))} -j {sep}"
    # Comments stay everywhere else (upstream drops only appendServiceCommentLocked's).
    assert '"ns2/svc2:p80 cluster IP"' in svc2[0]
    svc1 = plan.nat["KUBE-SVC-XPGD46QRK7WJZT7O"]
    assert len(svc1) == 1 + 1000 and all("comment" not in line for line in svc1[1:])


def test_exactly_1000_endpoints_is_not_large() -> None:
    plan = plan_of(render(large_cluster_objects(999)))
    assert not plan.large_cluster
    assert all(
        "--comment" in line
        for chain, rules in plan.nat.items()
        if chain.startswith(("KUBE-SEP-", "KUBE-SVC-"))
        for line in rules
    )


# --- 3. partial sync ----------------------------------------------------------------------------


def lab_objects() -> list[dict[str, Any]]:
    return [d for f in sorted((LAB / "manifests").glob("*.yaml")) for d in _yaml_docs(f)]


def lab_harness() -> Harness:
    cfg = load_config(LAB / "config.yaml")
    return Harness(lab_objects(), cfg, nfacct=True, node=cfg.hostname_override)


def web_slice(ips: Sequence[str]) -> dict[str, Any]:
    (doc,) = [
        d
        for d in lab_objects()
        if d["kind"] == "EndpointSlice" and d["metadata"]["name"] == "web-7x2kq"
    ]
    doc["endpoints"] = [
        {"addresses": [ip], "conditions": {"ready": True}, "nodeName": "kind-worker2"} for ip in ips
    ]
    return doc


WEB_SVC = "KUBE-SVC-LOLE4ISW44XBNF3G"
WEB_SEP_1 = "KUBE-SEP-PXJ2U7QYT2QW5545"
WEB_SEP_2 = "KUBE-SEP-5Q3P56IRA2PP7VYF"
WEB_SEP_3 = "KUBE-SEP-G2TK3RG32KUOAWKQ"


def test_partial_sync_writes_only_changed_chains() -> None:
    h = lab_harness()
    first = h.render(full=True)
    assert first.full
    h.commit(first)

    h.feed([web_slice(["10.244.1.2", "10.244.2.2", "10.244.2.4"])])  # .3 replaced by .4
    second = h.render()
    plan = plan_of(second)
    new_sep = names.endpoint_chain(ServicePortName("default", "web"), Endpoint("10.244.2.4", 8080))
    assert not second.full and not plan.full
    assert plan.filter == {}
    assert set(plan.nat) == {WEB_SVC, new_sep}
    assert plan.delete == {WEB_SEP_3}
    assert plan.restore_input() == "\n".join(
        [
            "*nat",
            f":{WEB_SVC} - [0:0]",
            f":{new_sep} - [0:0]",
            f":{WEB_SEP_3} - [0:0]",
            *plan.nat[WEB_SVC],
            f"-A {new_sep} -m comment --comment default/web -s 10.244.2.4 -j KUBE-MARK-MASQ",
            f"-A {new_sep} -m comment --comment default/web -m tcp -p tcp"
            " -j DNAT --to-destination 10.244.2.4:8080",
            f"-X {WEB_SEP_3}",
            "COMMIT",
            "",
        ]
    )
    assert plan.nat[WEB_SVC][-1] == (
        f'-A {WEB_SVC} -m comment --comment "default/web -> 10.244.2.4:8080" -j {new_sep}'
    )
    h.commit(second)

    # Nothing changed: nothing to write.
    third = h.render()
    assert not third.full
    assert all(p.empty for p in third.plans)
    assert plan_of(third).restore_input() == ""


def test_partial_sync_rewrites_shared_chains_whose_content_changed() -> None:
    h = lab_harness()
    h.commit(h.render(full=True))
    # All endpoints of web go: its chains go, and KUBE-SERVICES loses its cluster IP rule
    # while the filter table's KUBE-SERVICES gains a REJECT.
    h.feed([web_slice([])])
    plan = plan_of(h.render())
    assert not plan.full
    assert set(plan.nat) == {names.SERVICES}
    assert set(plan.filter) == {names.SERVICES}
    assert plan.filter[names.SERVICES] == (
        '-A KUBE-SERVICES -m comment --comment "default/web has no endpoints" -m tcp -p tcp'
        " -d 10.96.88.59 --dport 80 -j REJECT",
    )
    assert plan.delete == {WEB_SVC, WEB_SEP_1, WEB_SEP_2, WEB_SEP_3}
    text = plan.restore_input()
    for chain in sorted(plan.delete):
        assert f":{chain} - [0:0]\n" in text and f"-X {chain}\n" in text
    # Deletions come after every rule that could still jump to the chains.
    assert text.index("-X ") > text.rindex("-A ")


def test_partial_sync_after_delete_and_readd() -> None:
    h = lab_harness()
    h.commit(h.render(full=True))
    h.feed([web_slice(["10.244.1.2"])])
    second = h.render()
    assert plan_of(second).delete == {WEB_SEP_2, WEB_SEP_3}
    h.commit(second)
    h.feed([web_slice(["10.244.1.2", "10.244.2.2", "10.244.2.3"])])
    plan = plan_of(h.render())
    assert set(plan.nat) == {WEB_SVC, WEB_SEP_2, WEB_SEP_3}
    assert plan.delete == set()


def test_settings_change_forces_full_sync() -> None:
    h = lab_harness()
    h.commit(h.render(full=True))
    doc = yaml.safe_load((LAB / "config.yaml").read_text())
    h.reconfigure({**doc, "iptables": {"masqueradeBit": 15}})
    rendered = h.render()
    plan = plan_of(rendered)
    assert rendered.full and plan.full
    assert plan.nat[names.MARK_MASQ] == ("-A KUBE-MARK-MASQ -j MARK --or-mark 0x00008000",)
    assert {WEB_SVC, WEB_SEP_1, "KUBE-SVC-GCYSPZR5VVR6P7RM"} <= set(plan.nat)


def test_large_cluster_mode_switch_forces_full_sync() -> None:
    h = Harness(large_cluster_objects(999))
    h.commit(h.render(full=True))
    h.feed([endpoint_slice("ns2", "svc2", [ep("10.180.0.2"), ep("10.180.0.3")])])
    rendered = h.render()
    plan = plan_of(rendered)
    assert plan.large_cluster and plan.full and rendered.full
    # svc1 did not change, but its chains lose their comments, so they are written again.
    assert "KUBE-SVC-XPGD46QRK7WJZT7O" in plan.nat
    assert all("comment" not in line for line in plan.nat["KUBE-SVC-XPGD46QRK7WJZT7O"][1:])
    h.commit(rendered)
    # And back: the switch out of large-cluster mode is a full sync too.
    h.feed([endpoint_slice("ns2", "svc2", [])])
    plan = plan_of(h.render())
    assert not plan.large_cluster and plan.full


def test_full_sync_after_commit_deletes_vanished_chains() -> None:
    h = lab_harness()
    h.commit(h.render(full=True))
    h.feed([web_slice(["10.244.1.2"])])
    plan = plan_of(h.render(full=True))
    assert plan.full
    assert plan.delete == {WEB_SEP_2, WEB_SEP_3}
    assert WEB_SEP_1 in plan.nat and names.SERVICES in plan.filter


def test_partial_sync_deleting_a_service() -> None:
    h = lab_harness()
    h.commit(h.render(full=True))
    h.cluster.delete_service("default", "web")
    h.cluster.delete_endpoint_slice("default", "web-7x2kq")
    plan = plan_of(h.render())
    assert not plan.full
    assert set(plan.nat) == {names.SERVICES}
    assert not any("default/web cluster IP" in line for line in plan.nat[names.SERVICES])
    assert plan.filter == {}
    assert plan.delete == {WEB_SVC, WEB_SEP_1, WEB_SEP_2, WEB_SEP_3}


def test_failed_apply_forces_full_sync() -> None:
    h = lab_harness()
    h.commit(h.render(full=True))
    h.feed([web_slice(["10.244.1.2", "10.244.2.2"])])
    failed = plan_of(h.render())
    assert failed.delete == {WEB_SEP_3}
    h.backend.invalidate()  # what apply() does when iptables-restore fails
    retry = plan_of(h.render())
    assert retry.full


# --- 4. injection -------------------------------------------------------------------------------

EVIL = '" -j EVIL\n-A INPUT -j EVIL'


def web(ports: Sequence[dict[str, Any]] = (port(),), **spec: Any) -> dict[str, Any]:
    """ns1/web at 172.30.0.9, the Service the injection cases tamper with."""
    return service("ns1", "web", "172.30.0.9", ports, **spec)


@pytest.mark.parametrize(
    ("obj", "where", "field"),
    [
        (
            service("ns1", 'web" -j EVIL', "172.30.0.9", [port()]),
            "Service ns1/web",
            "metadata.name",
        ),
        (service("ns 1", "web", "172.30.0.9", [port()]), "Service ns 1/web", "metadata.namespace"),
        (
            service("ns1", "web", "172.30.0.9 -j EVIL", [port()]),
            "Service ns1/web",
            "spec.clusterIP",
        ),
        (
            web(externalIPs=["1.2.3.4\n-A INPUT -j EVIL"]),
            "Service ns1/web",
            "spec.externalIPs[0]",
        ),
        (
            web([port(name='http" -j EVIL')]),
            "Service ns1/web",
            "spec.ports[0].name",
        ),
        (
            web([{"name": "p80", "port": "80 -j EVIL"}]),
            "Service ns1/web",
            "spec.ports[0].port",
        ),
        (
            web([{"name": "p80", "port": 80, "protocol": "tcp -j EVIL"}]),
            "Service ns1/web",
            "spec.ports[0].protocol",
        ),
        (
            web(
                [port(node_port=3001)],
                type="LoadBalancer",
                loadBalancerSourceRanges=["0.0.0.0/0 -j EVIL"],
            ),
            "Service ns1/web",
            "spec.loadBalancerSourceRanges[0]",
        ),
        (
            web(
                [port(node_port=3001)],
                type="LoadBalancer",
                ingress=["1.2.3.4 --dport 1 -j EVIL"],
            ),
            "Service ns1/web",
            "status.loadBalancer.ingress[0].ip",
        ),
        (
            web(
                sessionAffinity="ClientIP",
                sessionAffinityConfig={"clientIP": {"timeoutSeconds": "10 -j EVIL"}},
            ),
            "Service ns1/web",
            "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
        ),
        (
            endpoint_slice("ns1", "web", [ep("10.180.0.1 -j EVIL")]),
            "EndpointSlice ns1/web-1",
            "endpoints[0].addresses[0]",
        ),
        (
            endpoint_slice("ns1", "web", [ep("fe80::1%eth0 -j EVIL")], family="IPv6"),
            "EndpointSlice ns1/web-1",
            "endpoints[0].addresses[0]",
        ),
        (
            endpoint_slice("ns1", "web", [ep("10.180.0.1")], [port(name="p80\n-A INPUT")]),
            "EndpointSlice ns1/web-1",
            "ports[0].name",
        ),
        (
            endpoint_slice("ns1", "web", [ep("10.180.0.1")], [{"name": "p80", "port": "80 EVIL"}]),
            "EndpointSlice ns1/web-1",
            "ports[0].port",
        ),
    ],
)
def test_injection_is_rejected_by_cluster_state(
    obj: dict[str, Any], where: str, field: str
) -> None:
    good = [
        node_obj(),
        service("ns1", "good", "172.30.0.41", [port()]),
        endpoint_slice("ns1", "good", [ep("10.180.0.1")]),
    ]
    h = Harness([*good, obj], families=(V4, V6))
    errors = [str(e) for e in h.cluster.invalid.values()]
    assert len(errors) == 1, errors
    assert where in errors[0] and field in errors[0], errors[0]
    text = str(h.render(full=True))
    assert "EVIL" not in text and "INPUT" not in text
    # The other Service still renders.
    assert '"ns1/good:p80 cluster IP"' in text


def test_injection_in_node_is_rejected() -> None:
    h = Harness(
        [
            node_obj(addresses=("192.168.0.2 -j EVIL",)),
            service("ns1", "svc1", "172.30.0.41", [port()]),
        ],
        {"clusterCIDR": "10.0.0.0/8", "detectLocalMode": "NodeCIDR"},
    )
    (error,) = [str(e) for e in h.cluster.invalid.values()]
    assert "Node test-hostname" in error and "status.addresses[0].address" in error
    assert "EVIL" not in str(h.render(full=True))


def test_injection_in_pod_cidr_is_rejected() -> None:
    h = Harness(
        [node_obj(pod_cidrs=("10.244.1.0/24 -j EVIL",)), *one_service()[1:]],
        {"detectLocalMode": "NodeCIDR"},
    )
    (error,) = [str(e) for e in h.cluster.invalid.values()]
    assert "spec.podCIDRs[0]" in error
    assert "EVIL" not in str(h.render(full=True))


def test_whitespace_around_addresses_is_normalized_not_written() -> None:
    objects = one_service(externalIPs=[" 192.168.99.11\n"])
    text = str(render(objects))
    assert "-d 192.168.99.11 --dport 80" in text
    assert all(line == line.strip() and "  " not in line for line in text.splitlines())


@pytest.mark.parametrize(
    "text",
    [
        'ns1/svc1" -j ACCEPT',
        "ns1/svc1\n-A INPUT -j ACCEPT",
        "ns1/svc1\n",
        "ns1/svc1\r",
        "ns1/svc1\\",
        "ns1/svc1'",
        "ns1/svc1$(reboot)",
        "ns1/svc1`id`",
        "ns1/svc1;",
        "ns1/svc1\x00",
        "ns1/svc1\t",
    ],
)
def test_comment_refuses_unsafe_text(text: str) -> None:
    with pytest.raises(BackendError, match="unsafe"):
        comment(text)
    with pytest.raises(BackendError, match="unsafe"):
        bare_comment(text)


def test_comments_that_are_safe() -> None:
    assert comment("ns1/svc1:p80 -> [fd00::1]:80") == (
        '-m comment --comment "ns1/svc1:p80 -> [fd00::1]:80"'
    )
    assert bare_comment("ns1/svc1:p80") == "-m comment --comment ns1/svc1:p80"
    with pytest.raises(BackendError):
        bare_comment("two words")
    with pytest.raises(BackendError):
        bare_comment("")


def _settings(family: IPFamily = V4) -> FamilySettings:
    return FamilySettings(family=family, masquerade_mark="0x00004000")


def test_renderer_skips_a_service_it_cannot_write_safely() -> None:
    # A ServicePort that bypassed ClusterState's validation: the renderer refuses it, reports
    # it, and still renders the others.
    node = NodeInfo(NODE)
    bad = ServicePortName("ns1", 'bad" -j EVIL')
    good = ServicePortName("ns1", "good")
    services = {
        spn: ServicePort(spn, V4, ip, 80)
        for spn, ip in ((bad, "172.30.0.9"), (good, "172.30.0.41"))
    }
    graph = ServiceGraph.build(
        V4, node, services, {bad: (Endpoint("10.1.1.1", 80),), good: (Endpoint("10.1.1.2", 80),)}
    )
    plan = FamilyRenderer(_settings()).render(graph, ChangeSet(full=True))
    assert list(plan.errors) == [str(bad)]
    text = plan.restore_input()
    assert "EVIL" not in text
    assert '"ns1/good cluster IP"' in text


def test_unsafe_local_detector_value_is_refused() -> None:
    from kubeplex.core.config.localdetect import LocalDetector

    settings = replace(_settings(), local=LocalDetector("interface", "cbr0 -j EVIL"))
    spn = ServicePortName("ns1", "svc1")
    svc = ServicePort(spn, V4, "172.30.0.41", 80)
    graph = ServiceGraph.build(V4, NodeInfo(NODE), {spn: svc}, {spn: (Endpoint("10.1.1.1", 80),)})
    with pytest.raises(BackendError, match="unsafe"):
        service_rules(svc, graph.categorized(spn), settings, large_cluster=False)
    plan = FamilyRenderer(settings).render(graph, ChangeSet(full=True))
    assert "EVIL" not in plan.restore_input() and list(plan.errors) == ["ns1/svc1"]
