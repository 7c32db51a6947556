"""What upstream kube-proxy's nftables mode writes, as pure functions of the graph.

``service_objects`` follows the per-service loop of upstream's syncProxyRules (and
writeServiceToEndpointRules): for one service port it returns the chains it owns (with their
rules, as transaction lines), the affinity sets, and the elements it puts into the shared sets
and verdict maps. ``setup_lines`` is upstream's setupNFTables: the table, base chains, fixed
chains, sets and maps that every full sync re-creates and flushes inside the one transaction.

Everything that reaches the transaction unquoted (names, addresses, CIDRs) or quoted (comments,
interface names) passes a last-line check here: the core validates objects already, but a
newline or quote in any of them would add commands to ``nft -f``.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

from kubeplex.backends.nftables import names
from kubeplex.core.config.localdetect import LocalDetector
from kubeplex.core.model.errors import BackendError
from kubeplex.core.model.policy import traffic_plan
from kubeplex.core.model.topology import CategorizedEndpoints
from kubeplex.core.model.types import Endpoint, IPFamily, ServicePort

#: (container, key, value, comment): one set or map element. Sets have no value; only the
#: no-endpoint maps carry a comment (the service port name), as upstream.
Elem = tuple[str, str, str, str]
#: (container, key): what identifies an element.
ElemKey = tuple[str, str]

# Last-line checks (\Z, not $: "$" also matches before a trailing newline).
_NAME_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z")
_PORT_NAME = re.compile(r"^[A-Za-z0-9._-]*\Z")
_IP = re.compile(r"^[0-9A-Fa-f.:]*[0-9A-Fa-f][0-9A-Fa-f.:]*\Z")
_CIDR = re.compile(r"^[0-9A-Fa-f.:]+/[0-9]{1,3}\Z")
_COMMENT = re.compile(r"^[A-Za-z0-9 ./:_@\-]*\Z")
_IFACE = re.compile(r"^[A-Za-z0-9_.:@-]+\Z")

#: Base chains: (name, type, hook, priority). Filter chains before DNAT see the original
#: destination (dstnat - 10); the others run at the filter and NAT priorities.
BASE_CHAINS = (
    (names.FILTER_PREROUTING_PRE_DNAT, "filter", "prerouting", -110),
    (names.FILTER_OUTPUT_PRE_DNAT, "filter", "output", -110),
    (names.FILTER_INPUT, "filter", "input", 0),
    (names.FILTER_FORWARD, "filter", "forward", 0),
    (names.FILTER_OUTPUT, "filter", "output", 0),
    (names.NAT_PREROUTING, "nat", "prerouting", -100),
    (names.NAT_OUTPUT, "nat", "output", -100),
    (names.NAT_POSTROUTING, "nat", "postrouting", 100),
)

#: (destination, source base chain, match): the jumps from the base chains, in upstream order.
JUMP_CHAINS = (
    (names.NODEPORT_ENDPOINTS_CHECK, names.FILTER_INPUT, "ct state new"),
    (names.SERVICE_ENDPOINTS_CHECK, names.FILTER_INPUT, "ct state new"),
    (names.SERVICE_ENDPOINTS_CHECK, names.FILTER_FORWARD, "ct state new"),
    (names.SERVICE_ENDPOINTS_CHECK, names.FILTER_OUTPUT, "ct state new"),
    (names.FIREWALL_CHECK, names.FILTER_PREROUTING_PRE_DNAT, "ct state new"),
    (names.FIREWALL_CHECK, names.FILTER_OUTPUT_PRE_DNAT, "ct state new"),
    (names.SERVICES, names.NAT_OUTPUT, ""),
    (names.SERVICES, names.NAT_PREROUTING, ""),
    (names.MASQUERADING, names.NAT_POSTROUTING, ""),
    (names.CLUSTER_IPS_CHECK, names.FILTER_FORWARD, "ct state new"),
    (names.CLUSTER_IPS_CHECK, names.FILTER_OUTPUT, "ct state new"),
)

#: The sets and maps whose elements a full sync rewrites (flushed in the transaction).
ELEMENT_CONTAINERS = (
    ("set", names.CLUSTER_IPS),
    ("map", names.SERVICE_IPS),
    ("map", names.FIREWALL_IPS),
    ("map", names.NO_ENDPOINT_SERVICES),
    ("map", names.NO_ENDPOINT_NODEPORTS),
    ("map", names.SERVICE_NODEPORTS),
)

#: Every fixed chain (base and regular) and every fixed set or map.
FIXED_CHAINS = frozenset(
    [c[0] for c in BASE_CHAINS]
    + [j[0] for j in JUMP_CHAINS]
    + [names.SERVICES, names.CLUSTER_IPS_CHECK, names.MASQUERADING, names.MARK_MASQ]
    + [names.REJECT_CHAIN, names.FIREWALL_CHECK]
)
FIXED_SETS = frozenset([n for _, n in ELEMENT_CONTAINERS] + [names.NODEPORT_IPS])
#: An endpoint chain's name without "endpoint-" is its affinity set's name without "affinity-".
_EP = len(names.ENDPOINT_PREFIX)


def check_ip(ip: str) -> str:
    if not _IP.match(ip):
        raise BackendError(f"refusing to write address {ip!r}: not an IP address")
    return ip


def check_cidr(cidr: str) -> str:
    if not _CIDR.match(cidr):
        raise BackendError(f"refusing to write network {cidr!r}: not a CIDR")
    return cidr


def check_comment(text: str) -> str:
    if not _COMMENT.match(text):
        raise BackendError(f"refusing to write comment {text!r}: unsafe characters")
    return text


def go_hex_mark(bit: int) -> str:
    """The mark as upstream spells it, ``fmt.Sprintf("%#08x", 1<<bit)``: ``0x00004000``."""
    return f"0x{1 << bit:08x}"


@dataclass(frozen=True)
class FamilySettings:
    """Everything family-wide that rules depend on (a change forces a full sync)."""

    family: IPFamily
    masquerade_mark: str = "0x00004000"
    masquerade_all: bool = False
    local: LocalDetector = field(default_factory=LocalDetector)
    #: None: NodePorts on every local address but localhost ("fib daddr type local");
    #: else only on these addresses (the nodeport-ips set).
    node_port_ips: tuple[str, ...] | None = None
    #: The node's primary address of this family (loadBalancerSourceRanges that include it).
    node_ip: str = ""
    #: The ServiceCIDRs of this family: traffic to unallocated addresses in them is dropped.
    service_cidrs: tuple[str, ...] = ()

    @property
    def ip(self) -> str:
        """nft's address family keyword ("ip daddr", "ip6 saddr")."""
        return "ip6" if self.family is IPFamily.IPv6 else "ip"

    @property
    def table(self) -> str:
        """``ip kube-proxy`` or ``ip6 kube-proxy``: how every command names the table."""
        return f"{self.ip} {names.TABLE}"

    @property
    def addr_type(self) -> str:
        return "ipv6_addr" if self.family is IPFamily.IPv6 else "ipv4_addr"

    @property
    def no_localhost(self) -> str:
        return "ip6 daddr != ::1" if self.family is IPFamily.IPv6 else "ip daddr != 127.0.0.0/8"

    def if_local(self) -> str:
        return _detector(self, negate=False)

    def if_not_local(self) -> str:
        return _detector(self, negate=True)


def _detector(s: FamilySettings, negate: bool) -> str:
    det = s.local
    op = "!= " if negate else ""
    if det.kind == "cidr":
        return f"{s.ip} saddr {op}{check_cidr(det.value)}"
    # Upstream writes `iif NAME` / `iif PREFIX*`; `iif` resolves the interface when the rule is
    # loaded (failing the whole transaction while it does not exist) and takes no wildcard, so
    # the name is matched as a string: iifname "cbr0" / iifname "veth*".
    value = det.value[:-1] if det.value.endswith("+") else det.value
    if not _IFACE.match(value):
        raise BackendError(f"refusing to match local traffic on {det.value!r}: unsafe characters")
    pattern = f"{value}*" if det.value.endswith("+") else value
    return f'iifname {op}"{pattern}"'


@dataclass(frozen=True, slots=True)
class ServiceObjects:
    """What one service port owns in the table, and what it puts into the shared ones."""

    #: Its chains, in creation order, each with its rules as ``add rule ...`` lines.
    chains: dict[str, str]
    #: Its affinity sets and their timeouts (seconds).
    sets: dict[str, int]
    #: Its elements of cluster-ips, service-ips, service-nodeports, firewall-ips, no-endpoint-*.
    elements: tuple[Elem, ...]
    no_local_endpoints_internal: bool = False
    no_local_endpoints_external: bool = False


def element_line(table: str, elem: Elem) -> str:
    container, key, value, comment = elem
    note = f' comment "{comment}"' if comment else ""
    verdict = f" : {value}" if value else ""
    return f"add element {table} {container} {{ {key}{note}{verdict} }}\n"


def delete_element_line(table: str, key: ElemKey) -> str:
    return f"delete element {table} {key[0]} {{ {key[1]} }}\n"


def set_line(table: str, name: str, addr_type: str, timeout: int) -> str:
    return (
        f"add set {table} {name} {{ type {addr_type} ; flags dynamic,timeout ;"
        f" timeout {timeout}s ; }}\n"
    )


def _check_service(svc: ServicePort) -> None:
    spn = svc.name
    if not (_NAME_PART.match(spn.namespace) and _NAME_PART.match(spn.name)):
        raise BackendError(f"refusing to name chains after {spn.namespace!r}/{spn.name!r}")
    if not _PORT_NAME.match(spn.port):
        raise BackendError(f"refusing to name chains after port {spn.port!r}")
    check_ip(svc.cluster_ip)
    for ip in (*svc.external_ips, *svc.load_balancer_vips):
        check_ip(ip)
    for cidr in svc.load_balancer_source_ranges:
        check_cidr(cidr)


def service_objects(
    svc: ServicePort, cat: CategorizedEndpoints, s: FamilySettings
) -> ServiceObjects:
    _check_service(svc)
    spn = svc.name
    table = s.table
    ip = s.ip
    proto = svc.protocol.lower()
    port = svc.port
    name = check_comment(str(spn))
    ptext = names.port_text(spn)
    base = names.cached_base(ptext)
    cluster_chain = names.SERVICE_PREFIX + base
    local_chain = names.LOCAL_PREFIX + base
    external_chain = names.EXTERNAL_PREFIX + base
    fw_chain = names.FIREWALL_PREFIX + base
    affinity = svc.session_affinity_client_ip
    # Per-endpoint chains: hairpin masquerade, affinity bookkeeping, DNAT. This loop is most of
    # a full sync, so it is written flat: each chain's lines in one string. ``ep_chain`` maps
    # an endpoint (by identity: the categorized tuples share the objects) to its chain.
    ep_chain: dict[int, str] = {}
    endpoint_chains: dict[str, str] = {}
    head = f"add rule {table} "
    masq = f"jump {names.MARK_MASQ}\n"
    for ep in cat.reachable:
        epip = check_ip(ep.ip)
        chain = names.ENDPOINT_PREFIX + names.cached_base(names.endpoint_text(ptext, epip, ep.port))
        ep_chain[id(ep)] = chain
        line = f"{head}{chain} "
        update = ""
        if affinity:
            update = f"{line}update @{names.AFFINITY_PREFIX}{chain[_EP:]} {{ {ip} saddr }}\n"
        addr = f"[{epip}]:{ep.port}" if ":" in epip else f"{epip}:{ep.port}"
        endpoint_chains[chain] = (
            f"{line}{ip} saddr {epip} {masq}{update}{line}meta l4proto {proto} dnat to {addr}\n"
        )
    for group in (cat.cluster, cat.local):
        if group is not cat.reachable:
            for ep in group:
                if id(ep) not in ep_chain:  # the same address twice: one chain
                    text = names.endpoint_text(ptext, check_ip(ep.ip), ep.port)
                    ep_chain[id(ep)] = names.ENDPOINT_PREFIX + names.cached_base(text)

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
    uses_fw_chain = bool(svc.load_balancer_vips) and bool(svc.load_balancer_source_ranges)

    internal_verdict = external_verdict = ""
    no_local_internal = no_local_external = False
    if not has_endpoints:
        internal_verdict = external_verdict = f"goto {names.REJECT_CHAIN}"
    else:
        if not has_internal:
            internal_verdict = "drop"  # internalTrafficPolicy Local without local endpoints
            no_local_internal = True
        if not has_external:
            external_verdict = "drop"  # externalTrafficPolicy Local without local endpoints
            no_local_external = True

    # Elements of the shared sets and maps.
    elements: list[Elem] = [(names.CLUSTER_IPS, svc.cluster_ip, "", "")]
    tail = f" . {proto} . {port}"
    if has_internal:
        elements.append((names.SERVICE_IPS, svc.cluster_ip + tail, f"goto {internal_chain}", ""))
    else:
        elements.append((names.NO_ENDPOINT_SERVICES, svc.cluster_ip + tail, internal_verdict, name))
    for eip in svc.external_ips:
        if has_endpoints:
            elements.append((names.SERVICE_IPS, eip + tail, f"goto {external_chain}", ""))
        if not has_external:
            elements.append((names.NO_ENDPOINT_SERVICES, eip + tail, external_verdict, name))
    for lbip in svc.load_balancer_vips:
        if has_endpoints:
            elements.append((names.SERVICE_IPS, lbip + tail, f"goto {external_chain}", ""))
        if uses_fw_chain:
            elements.append((names.FIREWALL_IPS, lbip + tail, f"goto {fw_chain}", ""))
    if not has_external:
        for lbip in svc.load_balancer_vips:
            elements.append((names.NO_ENDPOINT_SERVICES, lbip + tail, external_verdict, name))
    if svc.node_port:
        # NodePorts are not subject to loadBalancerSourceRanges (upstream cannot change that).
        np = f"{proto} . {svc.node_port}"
        if has_endpoints:
            elements.append((names.SERVICE_NODEPORTS, np, f"goto {external_chain}", ""))
        if not has_external:
            elements.append((names.NO_ENDPOINT_NODEPORTS, np, external_verdict, name))

    # Chains, declared in a fixed order; rules are appended in upstream's order.
    rules: dict[str, list[str]] = {}
    if uses_cluster_chain:
        rules[cluster_chain] = []
    if uses_local_chain:
        rules[local_chain] = []
    if uses_external_chain:
        rules[external_chain] = []
    if uses_fw_chain:
        rules[fw_chain] = []

    # Internal traffic: masquerade off-cluster clients of the cluster IP (1.33 matches the
    # service port too, as its iptables mode does; 1.34 dropped the port match).
    if has_internal:
        to_cluster_ip = f"{ip} daddr {svc.cluster_ip} {proto} dport {port}"
        if s.masquerade_all:
            rules[internal_chain].append(f"{to_cluster_ip} jump {names.MARK_MASQ}")
        elif s.local.implemented:
            rules[internal_chain].append(
                f"{to_cluster_ip} {s.if_not_local()} jump {names.MARK_MASQ}"
            )

    # External traffic: every external destination goes through the external chain.
    if uses_external_chain:
        ext = rules[external_chain]
        if not svc.external_policy_local:
            # Endpoints may be on other nodes: masquerade so replies come back through here.
            ext.append(f"jump {names.MARK_MASQ}")
        else:
            if s.local.implemented:
                # Pod traffic to an external address acts as if it went out and came back in.
                ext.append(
                    f'{s.if_local()} goto {cluster_chain} comment "short-circuit pod traffic"'
                )
            # The node's own traffic has a local source address: it needs masquerade.
            ext.append(
                f'fib saddr type local jump {names.MARK_MASQ} comment "masquerade local traffic"'
            )
            ext.append(
                f'fib saddr type local goto {cluster_chain} comment "short-circuit local traffic"'
            )
        if has_external:
            ext.append(f"goto {external_policy_chain}")

    # Firewall chain for loadBalancerSourceRanges: drop what no range allows.
    if uses_fw_chain:
        sources = list(svc.load_balancer_source_ranges)
        node_ip = ipaddress.ip_address(s.node_ip) if s.node_ip else None
        allow_from_node = node_ip is not None and any(
            node_ip in ipaddress.ip_network(cidr) for cidr in sources
        )
        if allow_from_node:
            # A node's request to a VIP that is also local comes back with the VIP as source.
            sources += svc.load_balancer_vips
        rules[fw_chain].append(f"{ip} saddr != {{ {' , '.join(sources)} }} drop")

    sets: dict[str, int] = {}
    if affinity:
        for ep in cat.reachable:
            sets[names.AFFINITY_PREFIX + ep_chain[id(ep)][_EP:]] = svc.sticky_max_age_seconds

    if uses_cluster_chain:
        _to_endpoints(rules[cluster_chain], ip, affinity, cat.cluster, ep_chain)
    if uses_local_chain:
        _to_endpoints(rules[local_chain], ip, affinity, cat.local, ep_chain)

    chains = {
        chain: "".join(f"add rule {table} {chain} {rule}\n" for rule in body)
        for chain, body in rules.items()
    }
    chains.update(endpoint_chains)
    return ServiceObjects(chains, sets, tuple(elements), no_local_internal, no_local_external)


def _to_endpoints(
    out: list[str],
    ip: str,
    affinity: bool,
    endpoints: tuple[Endpoint, ...],
    ep_chain: dict[int, str],
) -> None:
    """Upstream's writeServiceToEndpointRules: affinity lookups, then the numgen vmap."""
    if affinity:
        for ep in endpoints:
            chain = ep_chain[id(ep)]
            out.append(f"{ip} saddr @{names.AFFINITY_PREFIX}{chain[_EP:]} goto {chain}")
    entries = " , ".join(f"{i} : goto {ep_chain[id(ep)]}" for i, ep in enumerate(endpoints))
    out.append(f"numgen random mod {len(endpoints)} vmap {{ {entries} }}")


def setup_lines(s: FamilySettings, recreate_base_chains: bool) -> list[str]:
    """Upstream's setupNFTables: everything fixed, re-created and flushed by a full sync.

    ``recreate_base_chains`` adds and deletes every base chain first (upstream does this once
    per process), so that a base chain left with another priority is made anew.
    """
    t = s.table
    ip = s.ip
    mark = s.masquerade_mark
    out = [f'add table {t} {{ comment "rules for kube-proxy" ; }}\n']
    if recreate_base_chains:
        for chain, _, _, _ in BASE_CHAINS:
            out.append(f"add chain {t} {chain}\n")
            out.append(f"delete chain {t} {chain}\n")
    for chain, kind, hook, prio in BASE_CHAINS:
        out.append(f"add chain {t} {chain} {{ type {kind} hook {hook} priority {prio} ; }}\n")
        out.append(f"flush chain {t} {chain}\n")

    created: set[str] = set()

    def ensure(chain: str) -> None:
        if chain not in created:
            created.add(chain)
            out.append(f"add chain {t} {chain}\n")
            out.append(f"flush chain {t} {chain}\n")

    for dst, src, match in JUMP_CHAINS:
        ensure(dst)
        out.append(f"add rule {t} {src} {match + ' ' if match else ''}jump {dst}\n")
    for chain in (names.SERVICES, names.CLUSTER_IPS_CHECK, names.MASQUERADING, names.MARK_MASQ):
        ensure(chain)

    out.append(f"add rule {t} {names.MARK_MASQ} mark set mark or {mark}\n")
    out.append(f"add rule {t} {names.MASQUERADING} mark and {mark} == 0 return\n")
    out.append(f"add rule {t} {names.MASQUERADING} mark set mark xor {mark}\n")
    out.append(f"add rule {t} {names.MASQUERADING} masquerade fully-random\n")

    out.append(
        f"add set {t} {names.CLUSTER_IPS} {{ type {s.addr_type} ;"
        ' comment "Active ClusterIPs" ; }\n'
    )
    out.append(
        f"add rule {t} {names.CLUSTER_IPS_CHECK} {ip} daddr @{names.CLUSTER_IPS} reject"
        ' comment "Reject traffic to invalid ports of ClusterIPs"\n'
    )
    if s.service_cidrs:
        cidrs = " , ".join(check_cidr(c) for c in s.service_cidrs)
        out.append(
            f"add rule {t} {names.CLUSTER_IPS_CHECK} {ip} daddr {{ {cidrs} }} drop"
            ' comment "Drop traffic to unallocated ClusterIPs"\n'
        )

    # nodeport-ips: filled, or removed when NodePorts are served on every local address ("add"
    # first: a "delete" of a set that does not exist would fail the transaction).
    out.append(
        f"add set {t} {names.NODEPORT_IPS} {{ type {s.addr_type} ;"
        ' comment "IPs that accept NodePort traffic" ; }\n'
    )
    if s.node_port_ips is None:
        out.append(f"delete set {t} {names.NODEPORT_IPS}\n")
    else:
        out.append(f"flush set {t} {names.NODEPORT_IPS}\n")
        for addr in s.node_port_ips:
            if not ipaddress.ip_address(addr).is_loopback:  # localhost NodePorts: never
                out.append(f"add element {t} {names.NODEPORT_IPS} {{ {check_ip(addr)} }}\n")

    out.append(
        f"add map {t} {names.NO_ENDPOINT_SERVICES} {{ type {s.addr_type} . inet_proto ."
        " inet_service : verdict ;"
        ' comment "vmap to drop or reject packets to services with no endpoints" ; }\n'
    )
    out.append(
        f"add map {t} {names.NO_ENDPOINT_NODEPORTS} {{ type inet_proto . inet_service : verdict ;"
        ' comment "vmap to drop or reject packets to service nodeports with no endpoints" ; }\n'
    )
    out.append(
        f"add chain {t} {names.REJECT_CHAIN}"
        ' { comment "helper for @no-endpoint-services / @no-endpoint-nodeports" ; }\n'
    )
    out.append(f"flush chain {t} {names.REJECT_CHAIN}\n")
    out.append(f"add rule {t} {names.REJECT_CHAIN} reject\n")
    out.append(
        f"add rule {t} {names.SERVICE_ENDPOINTS_CHECK} {ip} daddr . meta l4proto . th dport"
        f" vmap @{names.NO_ENDPOINT_SERVICES}\n"
    )
    if s.node_port_ips is None:
        out.append(
            f"add rule {t} {names.NODEPORT_ENDPOINTS_CHECK} {s.no_localhost}"
            f" meta l4proto . th dport vmap @{names.NO_ENDPOINT_NODEPORTS}\n"
        )
    else:
        out.append(
            f"add rule {t} {names.NODEPORT_ENDPOINTS_CHECK} {ip} daddr @{names.NODEPORT_IPS}"
            f" meta l4proto . th dport vmap @{names.NO_ENDPOINT_NODEPORTS}\n"
        )

    out.append(
        f"add map {t} {names.FIREWALL_IPS} {{ type {s.addr_type} . inet_proto . inet_service :"
        ' verdict ; comment "destinations that are subject to LoadBalancerSourceRanges" ; }\n'
    )
    ensure(names.FIREWALL_CHECK)
    out.append(
        f"add rule {t} {names.FIREWALL_CHECK} {ip} daddr . meta l4proto . th dport"
        f" vmap @{names.FIREWALL_IPS}\n"
    )

    out.append(
        f"add map {t} {names.SERVICE_IPS} {{ type {s.addr_type} . inet_proto . inet_service :"
        ' verdict ; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }\n'
    )
    out.append(
        f"add map {t} {names.SERVICE_NODEPORTS} {{ type inet_proto . inet_service : verdict ;"
        ' comment "NodePort traffic" ; }\n'
    )
    out.append(
        f"add rule {t} {names.SERVICES} {ip} daddr . meta l4proto . th dport"
        f" vmap @{names.SERVICE_IPS}\n"
    )
    if s.node_port_ips is None:
        out.append(
            f"add rule {t} {names.SERVICES} fib daddr type local {s.no_localhost}"
            f" meta l4proto . th dport vmap @{names.SERVICE_NODEPORTS}\n"
        )
    else:
        out.append(
            f"add rule {t} {names.SERVICES} {ip} daddr @{names.NODEPORT_IPS}"
            f" meta l4proto . th dport vmap @{names.SERVICE_NODEPORTS}\n"
        )

    for kind, container in ELEMENT_CONTAINERS:
        out.append(f"flush {kind} {t} {container}\n")
    return out
