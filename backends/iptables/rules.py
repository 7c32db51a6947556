"""Per-service iptables rules, following upstream kube-proxy's syncProxyRules line by line.

``service_rules`` is a pure function of one service port, its categorized endpoints and the
family-wide settings. Its output is split by chain so a partial sync can rebuild the shared
chains (KUBE-SERVICES, KUBE-NODEPORTS, ...) from cached fragments of unchanged services.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

from kubeplex.backends.iptables import names
from kubeplex.core.config.localdetect import LocalDetector
from kubeplex.core.model.errors import BackendError
from kubeplex.core.model.policy import traffic_plan
from kubeplex.core.model.topology import CategorizedEndpoints
from kubeplex.core.model.types import Endpoint, IPFamily, ServicePort

# Upstream's nfacct counter names (metrics read them back).
NFACCT_LOCALHOST_NODEPORTS = "localhost_nps_accepted_pkts"
NFACCT_INVALID_DROPPED = "ct_state_invalid_dropped_pkts"

LARGE_CLUSTER_ENDPOINTS = 1000

#: kubelet's anti-martian chain; upstream kube-proxy writes an identical copy of its one rule
#: (IPv4 with localhost NodePorts only) and, like kubelet, never deletes the chain.
KUBELET_FIREWALL = "KUBE-FIREWALL"

# What may appear inside a quoted comment: the core validates names already; this is the
# last line of defence against a quote or newline reaching iptables-restore. (\Z, not $:
# "$" also matches before a trailing newline.)
_COMMENT_SAFE = re.compile(r"^[A-Za-z0-9 ./:_\-\[\]>]*\Z")
#: One argument (a CIDR, an interface name or a "name+" prefix): no blank, quote or control.
_WORD_SAFE = re.compile(r"^[A-Za-z0-9./:_@+\-]+\Z")


@dataclass(frozen=True)
class FamilySettings:
    family: IPFamily
    masquerade_mark: str
    masquerade_all: bool = False
    local: LocalDetector = field(default_factory=LocalDetector)
    localhost_node_ports: bool = True
    #: None: NodePorts on every local address; else these node addresses only.
    node_port_ips: tuple[str, ...] | None = None
    #: The node's own addresses, for loadBalancerSourceRanges that include the node.
    node_ips: tuple[str, ...] = ()
    nfacct_counters: frozenset[str] = frozenset()
    conntrack_tcp_liberal: bool = False

    @property
    def ipv6(self) -> bool:
        return self.family is IPFamily.IPv6

    def if_local(self) -> str:
        return _detector_args(self.local, negate=False)

    def if_not_local(self) -> str:
        return _detector_args(self.local, negate=True)


def _detector_args(det: LocalDetector, negate: bool) -> str:
    bang = "! " if negate else ""
    # The value comes from the configuration (an interface name or prefix) or a Node's pod
    # CIDR; a space or quote in it would add arguments to the rule.
    if not _WORD_SAFE.match(det.value):
        raise BackendError(f"refusing to match local traffic on {det.value!r}: unsafe characters")
    if det.kind == "cidr":
        return f"{bang}-s {det.value}"
    return f"{bang}-i {det.value}"


def comment(text: str) -> str:
    if not _COMMENT_SAFE.match(text):
        raise BackendError(f"refusing to write comment {text!r}: unsafe characters")
    return f'-m comment --comment "{text}"'


def bare_comment(text: str) -> str:
    """A one-word comment, unquoted: upstream writes the bare service port name in KUBE-SEP-*
    and KUBE-NODEPORTS rules (``--comment ns/svc:port``)."""
    if not text or " " in text or not _COMMENT_SAFE.match(text):
        raise BackendError(f"refusing to write comment {text!r}: unsafe characters")
    return f"-m comment --comment {text}"


def go_hex_mark(mark: str) -> str:
    """A mark as upstream spells it, ``fmt.Sprintf("%#08x", v)``: Go pads the digits (not the
    "0x") to 8, so 1<<14 is ``0x00004000`` where Python's ``f"{v:#08x}"`` gives ``0x004000``."""
    return f"0x{int(mark, 16):08x}"


def probability(n: int) -> str:
    """Probability of the first of n remaining endpoints, written like upstream (%0.10f)."""
    return f"{1.0 / n:0.10f}"


@dataclass
class ServiceRules:
    """The lines one service port contributes, by table and chain."""

    nat_services: list[str] = field(default_factory=list)
    nat_nodeports: list[str] = field(default_factory=list)
    filter_services: list[str] = field(default_factory=list)
    filter_external: list[str] = field(default_factory=list)
    filter_nodeports: list[str] = field(default_factory=list)
    filter_firewall: list[str] = field(default_factory=list)
    #: This service's own nat chains (SVC/SVL/EXT/FW/SEP), in creation order, with their rules.
    chains: dict[str, list[str]] = field(default_factory=dict)
    no_local_endpoints_internal: bool = False
    no_local_endpoints_external: bool = False


def service_rules(
    svc: ServicePort, cat: CategorizedEndpoints, s: FamilySettings, large_cluster: bool
) -> ServiceRules:
    out = ServiceRules()
    spn = svc.name
    name = str(spn)
    proto = svc.protocol.lower()
    port = svc.port
    cluster_chain = names.service_chain(spn)
    local_chain = names.local_service_chain(spn)
    external_chain = names.external_chain(spn)
    fw_chain = names.firewall_chain(spn)
    ep_chains = {ep.address: names.endpoint_chain(spn, ep) for ep in cat.reachable}

    plan = traffic_plan(svc, cat)
    has_endpoints, has_internal, has_external = (
        plan.has_endpoints,
        plan.has_internal,
        plan.has_external,
    )
    uses_cluster_chain = plan.uses_cluster_endpoints
    uses_local_chain = plan.uses_local_endpoints
    uses_external_chain = plan.uses_external_chain
    internal_chain = local_chain if svc.internal_policy_local else cluster_chain
    external_policy_chain = local_chain if svc.external_policy_local else cluster_chain
    uses_fw_chain = (
        has_endpoints and bool(svc.load_balancer_vips) and bool(svc.load_balancer_source_ranges)
    )
    lb_chain = fw_chain if uses_fw_chain else external_chain

    internal_target = external_target = ""
    internal_comment = external_comment = ""
    if not has_endpoints:
        internal_target = external_target = "REJECT"
        internal_comment = external_comment = comment(f"{name} has no endpoints")
    else:
        if not has_internal:
            internal_target = "DROP"
            internal_comment = comment(f"{name} has no local endpoints")
            out.no_local_endpoints_internal = True
        if not has_external:
            external_target = "DROP"
            external_comment = comment(f"{name} has no local endpoints")
            out.no_local_endpoints_external = True

    match = f"-m {proto} -p {proto}"
    cluster_ip_match = f"{comment(f'{name} cluster IP')} {match} -d {svc.cluster_ip} --dport {port}"

    # Capture the cluster IP.
    if has_internal:
        out.nat_services.append(f"-A {names.SERVICES} {cluster_ip_match} -j {internal_chain}")
    else:
        out.filter_services.append(
            f"-A {names.SERVICES} {internal_comment} {match} -d {svc.cluster_ip} --dport {port}"
            f" -j {internal_target}"
        )

    # Capture external IPs.
    for ip in svc.external_ips:
        if has_endpoints:
            out.nat_services.append(
                f"-A {names.SERVICES} {comment(f'{name} external IP')} {match} -d {ip}"
                f" --dport {port} -j {external_chain}"
            )
        if not has_external:
            out.filter_external.append(
                f"-A {names.EXTERNAL_SERVICES} {external_comment} {match} -d {ip}"
                f" --dport {port} -j {external_target}"
            )

    # Capture load-balancer ingress.
    for ip in svc.load_balancer_vips:
        if has_endpoints:
            out.nat_services.append(
                f"-A {names.SERVICES} {comment(f'{name} loadbalancer IP')} {match} -d {ip}"
                f" --dport {port} -j {lb_chain}"
            )
        if uses_fw_chain:
            out.filter_firewall.append(
                f"-A {names.PROXY_FIREWALL} {comment(f'{name} traffic not accepted by {fw_chain}')}"
                f" {match} -d {ip} --dport {port} -j DROP"
            )
    if not has_external:
        for ip in svc.load_balancer_vips:
            out.filter_external.append(
                f"-A {names.EXTERNAL_SERVICES} {external_comment} {match} -d {ip}"
                f" --dport {port} -j {external_target}"
            )

    # Capture node ports.
    if svc.node_port:
        if has_endpoints:
            if (
                s.localhost_node_ports
                and not s.ipv6
                and NFACCT_LOCALHOST_NODEPORTS in s.nfacct_counters
            ):
                out.nat_nodeports.append(
                    f"-A {names.NODEPORTS} {bare_comment(name)} {match} -d 127.0.0.0/8"
                    f" --dport {svc.node_port} -m nfacct --nfacct-name {NFACCT_LOCALHOST_NODEPORTS}"
                    f" -j {external_chain}"
                )
            out.nat_nodeports.append(
                f"-A {names.NODEPORTS} {bare_comment(name)} {match} --dport {svc.node_port}"
                f" -j {external_chain}"
            )
        if not has_external:
            out.filter_external.append(
                f"-A {names.EXTERNAL_SERVICES} {external_comment} -m addrtype --dst-type LOCAL"
                f" {match} --dport {svc.node_port} -j {external_target}"
            )

    # Accept health-check node ports whether or not there are local endpoints.
    if svc.health_check_node_port:
        out.filter_nodeports.append(
            f"-A {names.NODEPORTS} {comment(f'{name} health check node port')} -m tcp -p tcp"
            f" --dport {svc.health_check_node_port} -j ACCEPT"
        )

    chains = out.chains

    # Internal traffic: masquerade off-cluster clients of the cluster IP.
    if has_internal:
        if s.masquerade_all:
            chains.setdefault(internal_chain, []).append(
                f"-A {internal_chain} {cluster_ip_match} -j {names.MARK_MASQ}"
            )
        elif s.local.implemented:
            chains.setdefault(internal_chain, []).append(
                f"-A {internal_chain} {cluster_ip_match} {s.if_not_local()} -j {names.MARK_MASQ}"
            )

    # External traffic: every external destination goes through the EXT chain.
    if uses_external_chain:
        ext = chains.setdefault(external_chain, [])
        if not svc.external_policy_local:
            # Endpoints may be on other nodes: masquerade so replies come back through here.
            masq = comment(f"masquerade traffic for {name} external destinations")
            ext.append(f"-A {external_chain} {masq} -j {names.MARK_MASQ}")
        else:
            if s.local.implemented:
                # Pod traffic to an external address acts as if it went out and came back in.
                pods = comment(f"pod traffic for {name} external destinations")
                ext.append(f"-A {external_chain} {pods} {s.if_local()} -j {cluster_chain}")
            # The node's own traffic has a local source address: it needs masquerade.
            ext.append(
                f"-A {external_chain}"
                f" {comment(f'masquerade LOCAL traffic for {name} external destinations')}"
                f" -m addrtype --src-type LOCAL -j {names.MARK_MASQ}"
            )
            ext.append(
                f"-A {external_chain}"
                f" {comment(f'route LOCAL traffic for {name} external destinations')}"
                f" -m addrtype --src-type LOCAL -j {cluster_chain}"
            )
        if has_external:
            ext.append(f"-A {external_chain} -j {external_policy_chain}")

    # Firewall chain for loadBalancerSourceRanges.
    if uses_fw_chain:
        fw = chains.setdefault(fw_chain, [])
        head = f"-A {fw_chain} {comment(f'{name} loadbalancer IP')}"
        allow_from_node = False
        for cidr in svc.load_balancer_source_ranges:
            fw.append(f"{head} -s {cidr} -j {external_chain}")
            net = ipaddress.ip_network(cidr)
            # Upstream checks its one node IP of this family (the first), not every address.
            allow_from_node = allow_from_node or any(
                ipaddress.ip_address(ip) in net for ip in s.node_ips[:1]
            )
        if allow_from_node:
            # A node's request to a VIP that is also local comes back with the VIP as source.
            for ip in svc.load_balancer_vips:
                fw.append(f"{head} -s {ip} -j {external_chain}")
        # What falls off the end of this chain was not DNATed: KUBE-PROXY-FIREWALL drops it.
        # Upstream ends the chain with a rule that is only this comment.
        fw.append(
            f"-A {fw_chain}"
            f" {comment(f'other traffic to {name} will be dropped by {names.PROXY_FIREWALL}')}"
        )

    if uses_cluster_chain:
        chains.setdefault(cluster_chain, []).extend(
            _service_to_endpoints(svc, cluster_chain, cat.cluster, ep_chains, large_cluster)
        )
    if uses_local_chain:
        chains.setdefault(local_chain, []).extend(
            _service_to_endpoints(svc, local_chain, cat.local, ep_chains, large_cluster)
        )

    # Per-endpoint chains: hairpin masquerade, affinity bookkeeping, DNAT.
    svc_comment = "" if large_cluster else f" {bare_comment(name)}"
    for ep in cat.reachable:
        chain = ep_chains[ep.address]
        rules = chains.setdefault(chain, [])
        rules.append(f"-A {chain}{svc_comment} -s {ep.ip} -j {names.MARK_MASQ}")
        affinity = f" -m recent --name {chain} --set" if svc.session_affinity_client_ip else ""
        rules.append(
            f"-A {chain}{svc_comment}{affinity} {match} -j DNAT --to-destination {ep.address}"
        )
    return out


def _service_to_endpoints(
    svc: ServicePort,
    chain: str,
    endpoints: tuple[Endpoint, ...],
    ep_chains: dict[str, str],
    large_cluster: bool,
) -> list[str]:
    name = str(svc.name)
    rules: list[str] = []
    if svc.session_affinity_client_ip:
        for ep in endpoints:
            c = "" if large_cluster else f" {comment(f'{name} -> {ep.address}')}"
            target = ep_chains[ep.address]
            rules.append(
                f"-A {chain}{c} -m recent --name {target} --rcheck"
                f" --seconds {svc.sticky_max_age_seconds} --reap -j {target}"
            )
    n = len(endpoints)
    for i, ep in enumerate(endpoints):
        c = "" if large_cluster else f" {comment(f'{name} -> {ep.address}')}"
        stat = ""
        if i < n - 1:
            stat = f" -m statistic --mode random --probability {probability(n - i)}"
        rules.append(f"-A {chain}{c}{stat} -j {ep_chains[ep.address]}")
    return rules


def static_rules(s: FamilySettings) -> dict[tuple[str, str], list[str]]:
    """Rules of the fixed chains that do not depend on services, by (table, chain)."""
    mark = go_hex_mark(s.masquerade_mark)
    forward = []
    if not s.conntrack_tcp_liberal:
        # Drop INVALID packets, which would otherwise reset long-lived connections (kernels < 6.1).
        acct = (
            f" -m nfacct --nfacct-name {NFACCT_INVALID_DROPPED}"
            if NFACCT_INVALID_DROPPED in s.nfacct_counters
            else ""
        )
        forward.append(f"-A {names.FORWARD} -m conntrack --ctstate INVALID{acct} -j DROP")
    forward += [
        f'-A {names.FORWARD} -m comment --comment "kubernetes forwarding rules"'
        f" -m mark --mark {mark}/{mark} -j ACCEPT",
        f'-A {names.FORWARD} -m comment --comment "kubernetes forwarding conntrack rule"'
        " -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
    ]
    rules: dict[tuple[str, str], list[str]] = {}
    if not s.ipv6 and s.localhost_node_ports:
        # route_localnet makes 127/8 routable; this blocks what would otherwise reach it from
        # outside (issue 90259). kubelet creates the identical rule.
        rules[("filter", KUBELET_FIREWALL)] = [
            f'-A {KUBELET_FIREWALL} -m comment --comment "block incoming localnet connections"'
            " -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT"
            " -j DROP"
        ]
    return rules | {
        ("filter", names.FORWARD): forward,
        ("nat", names.POSTROUTING): [
            f"-A {names.POSTROUTING} -m mark ! --mark {mark}/{mark} -j RETURN",
            f"-A {names.POSTROUTING} -j MARK --xor-mark {mark}",
            f"-A {names.POSTROUTING}"
            ' -m comment --comment "kubernetes service traffic requiring SNAT"'
            " -j MASQUERADE --random-fully",
        ],
        ("nat", names.MARK_MASQ): [f"-A {names.MARK_MASQ} -j MARK --or-mark {mark}"],
    }


def nodeports_jump(s: FamilySettings) -> list[str]:
    """The tail of nat KUBE-SERVICES: local destinations go on to KUBE-NODEPORTS."""
    text = (
        '-m comment --comment "kubernetes service nodeports;'
        ' NOTE: this must be the last rule in this chain"'
    )
    if s.node_port_ips is None:
        dest = "-m addrtype --dst-type LOCAL"
        # Localhost NodePorts never work on IPv6; on IPv4 only with route_localnet.
        if s.ipv6:
            dest += " ! -d ::1/128"
        elif not s.localhost_node_ports:
            dest += " ! -d 127.0.0.0/8"
        return [f"-A {names.SERVICES} {text} {dest} -j {names.NODEPORTS}"]
    rules = []
    for ip in s.node_port_ips:
        if ipaddress.ip_address(ip).is_loopback and (s.ipv6 or not s.localhost_node_ports):
            continue
        rules.append(f"-A {names.SERVICES} {text} -d {ip} -j {names.NODEPORTS}")
    return rules
