"""The IPVS mode's fixed iptables rules, as upstream kube-proxy writes them.

Mirrors pkg/proxy/ipvs/proxier.go: the chains of ``iptablesChains`` (declared, hence flushed
and rewritten, by every restore), the rules of ``writeIptablesRules`` and
``acceptIPVSTraffic`` (a set's rule only while the set has entries, as upstream's
``isEmpty`` checks), and the jumps of ``iptablesJumpChain`` that ``createAndLinkKubeChain``
ensures. The rules do not grow with the cluster: the ipsets hold the Service addresses; only
KUBE-IPVS-OUT-FILTER has a rule per LoadBalancer IP whose source ranges leave the node out.

Services without endpoints need no rule here: their virtual service has no real server, and
IPVS answers a new connection to it with an ICMP port unreachable (a refusal), as upstream.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping

from kubeplex.backends.ipvs import ipsets as S
from kubeplex.backends.ipvs.settings import IpvsSettings
from kubeplex.backends.netfilter.iptables import SavedRuleset
from kubeplex.backends.netfilter.jumps import Jump, insert_before_commit, missing_jumps
from kubeplex.core.model.errors import BackendError

SERVICES = "KUBE-SERVICES"
PROXY_FIREWALL = "KUBE-PROXY-FIREWALL"
SOURCE_RANGES_FIREWALL = "KUBE-SOURCE-RANGES-FIREWALL"
POSTROUTING = "KUBE-POSTROUTING"
MARK_MASQ = "KUBE-MARK-MASQ"
NODE_PORT = "KUBE-NODE-PORT"
FORWARD = "KUBE-FORWARD"
LOAD_BALANCER = "KUBE-LOAD-BALANCER"
IPVS_FILTER = "KUBE-IPVS-FILTER"
IPVS_OUT_FILTER = "KUBE-IPVS-OUT-FILTER"

#: Upstream's iptablesChains, in its order.
NAT_CHAINS = (SERVICES, POSTROUTING, NODE_PORT, LOAD_BALANCER, MARK_MASQ)
FILTER_CHAINS = (
    FORWARD,
    NODE_PORT,
    PROXY_FIREWALL,
    SOURCE_RANGES_FIREWALL,
    IPVS_FILTER,
    IPVS_OUT_FILTER,
)

#: Upstream's iptablesJumpChain: (table, built-in chain, comment, extra match, target).
JUMPS: tuple[Jump, ...] = (
    ("nat", "OUTPUT", "kubernetes service portals", "", SERVICES),
    ("nat", "PREROUTING", "kubernetes service portals", "", SERVICES),
    ("nat", "POSTROUTING", "kubernetes postrouting rules", "", POSTROUTING),
    ("filter", "FORWARD", "kubernetes forwarding rules", "", FORWARD),
    ("filter", "INPUT", "kubernetes health check rules", "", NODE_PORT),
    ("filter", "INPUT", "kube-proxy firewall rules", "", PROXY_FIREWALL),
    ("filter", "FORWARD", "kube-proxy firewall rules", "", PROXY_FIREWALL),
    ("filter", "INPUT", "kubernetes ipvs access filter", "", IPVS_FILTER),
    ("filter", "OUTPUT", "kubernetes ipvs access filter", "", IPVS_OUT_FILTER),
)

#: Upstream's ipsetWithIptablesChain: (set, table, from chain, target, match, protocol).
#: The LOCAL NodePort sets come before their non-local ones (RETURN before masquerade).
SET_RULES: tuple[tuple[str, str, str, str, str, str], ...] = (
    (S.LOOP_BACK, "nat", POSTROUTING, "MASQUERADE", "dst,dst,src", ""),
    (S.LOAD_BALANCER, "nat", SERVICES, LOAD_BALANCER, "dst,dst", ""),
    (S.LOAD_BALANCER_LOCAL, "nat", LOAD_BALANCER, "RETURN", "dst,dst", ""),
    (S.NODE_PORT_LOCAL_TCP, "nat", NODE_PORT, "RETURN", "dst", "tcp"),
    (S.NODE_PORT_TCP, "nat", NODE_PORT, MARK_MASQ, "dst", "tcp"),
    (S.NODE_PORT_LOCAL_UDP, "nat", NODE_PORT, "RETURN", "dst", "udp"),
    (S.NODE_PORT_UDP, "nat", NODE_PORT, MARK_MASQ, "dst", "udp"),
    (S.NODE_PORT_LOCAL_SCTP, "nat", NODE_PORT, "RETURN", "dst,dst", "sctp"),
    (S.NODE_PORT_SCTP, "nat", NODE_PORT, MARK_MASQ, "dst,dst", "sctp"),
    (S.LOAD_BALANCER_FW, "filter", PROXY_FIREWALL, SOURCE_RANGES_FIREWALL, "dst,dst", ""),
    (S.LOAD_BALANCER_SOURCE_CIDR, "filter", SOURCE_RANGES_FIREWALL, "RETURN", "dst,dst,src", ""),
    (S.LOAD_BALANCER_SOURCE_IP, "filter", SOURCE_RANGES_FIREWALL, "RETURN", "dst,dst,src", ""),
)

#: One argument of a rule (an address, CIDR, interface or "name+" prefix).
_WORD_SAFE = re.compile(r"^[A-Za-z0-9./:_@+\-]+\Z")


def _word(text: str) -> str:
    if not _WORD_SAFE.match(text):
        raise BackendError(f"refusing to write {text!r} into a rule: unsafe characters")
    return text


def _comment(base: str) -> str:
    """A set's comment as upstream's getComment quotes it."""
    return f'-m comment --comment "{S.SETS[base][1]}"'


def _not_local(s: IpvsSettings) -> str:
    """The local traffic detector's IfNotLocal (``! -s CIDR`` or ``! -i IFACE``)."""
    flag = "-s" if s.local.kind == "cidr" else "-i"
    return f"! {flag} {_word(s.local.value)}"


def out_filter_rule(ip: str, proto: str, port: int) -> str:
    """KUBE-IPVS-OUT-FILTER: the node may not reach an LB IP whose source ranges leave the
    node out (for IPVS, both source and destination are the LB IP)."""
    return (
        f"-A {IPVS_OUT_FILTER} -s {_word(ip)} -m ipvs --vaddr {ip} --vproto {proto}"
        f" --vport {port} -j DROP"
    )


def restore_text(s: IpvsSettings, nonempty: Collection[str], out_filter: Iterable[str]) -> str:
    """The ``iptables-restore --noflush`` input of one sync (writeIptablesRules): ``nonempty``
    are the (base) names of the sets with entries, ``out_filter`` the KUBE-IPVS-OUT-FILTER
    rules (``out_filter_rule``)."""
    name = S.names(s.family)
    mark = s.masquerade_mark
    nat = [f":{c} - [0:0]" for c in NAT_CHAINS]
    filt = [f":{c} - [0:0]" for c in FILTER_CHAINS]
    nat_rules: list[str] = []
    filter_rules: list[str] = []

    # Dismiss connections to localhost early in the service chain.
    nat_rules.append(f"-A {SERVICES} -s {'::1/128' if s.ipv6 else '127.0.0.0/8'} -j RETURN")
    for base, table, chain, target, match, proto in SET_RULES:
        if base not in nonempty:
            continue
        p = f" -p {proto}" if proto else ""
        rule = f"-A {chain}{p} {_comment(base)} -m set --match-set {name[base]} {match} -j {target}"
        (filter_rules if table == "filter" else nat_rules).append(rule)

    if S.CLUSTER_IP in nonempty:
        head = f"-A {SERVICES} {_comment(S.CLUSTER_IP)} -m set --match-set {name[S.CLUSTER_IP]}"
        if s.masquerade_all:
            nat_rules.append(f"{head} dst,dst -j {MARK_MASQ}")
        elif s.local.implemented:
            # Off-cluster traffic to a service VIP may bounce off-node: masquerade it.
            nat_rules.append(f"{head} dst,dst {_not_local(s)} -j {MARK_MASQ}")
        else:
            # Node traffic picks a VIP on kube-ipvs0 as its source: masquerade VIP sources.
            nat_rules.append(f"{head} src,dst -j {MARK_MASQ}")

    def external(base: str) -> None:
        head = f"-A {SERVICES} {_comment(base)} -m set --match-set {name[base]} dst,dst"
        if base == S.EXTERNAL_IP:
            nat_rules.append(f"{head} -j {MARK_MASQ}")
        # Off-machine traffic (not from a bridge, not from a local process) goes on to IPVS,
        # and so does traffic to an external IP that happens to be local.
        nat_rules.append(
            f"{head} -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT"
        )
        nat_rules.append(f"{head} -m addrtype --dst-type LOCAL -j ACCEPT")

    if S.EXTERNAL_IP in nonempty:
        external(S.EXTERNAL_IP)
    if S.EXTERNAL_IP_LOCAL in nonempty:
        external(S.EXTERNAL_IP_LOCAL)

    nat_rules.append(f"-A {SERVICES} -m addrtype --dst-type LOCAL -j {NODE_PORT}")
    nat_rules.append(f"-A {LOAD_BALANCER} -j {MARK_MASQ}")
    filter_rules.append(f"-A {SOURCE_RANGES_FIREWALL} -j DROP")
    filter_rules.extend(out_filter)

    # acceptIPVSTraffic: the end of KUBE-SERVICES accepts what IPVS serves.
    for base in (S.CLUSTER_IP, S.LOAD_BALANCER):
        if base in nonempty:
            nat_rules.append(f"-A {SERVICES} -m set --match-set {name[base]} dst,dst -j ACCEPT")

    filter_rules += [
        f'-A {FORWARD} -m comment --comment "kubernetes forwarding rules"'
        f" -m mark --mark {mark}/{mark} -j ACCEPT",
        f'-A {FORWARD} -m comment --comment "kubernetes forwarding conntrack rule"'
        " -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
        f"-A {NODE_PORT} {_comment(S.HEALTH_CHECK_NODE_PORT)}"
        f" -m set --match-set {name[S.HEALTH_CHECK_NODE_PORT]} dst -j ACCEPT",
    ]
    # KUBE-IPVS-FILTER: no access to the host's other ports through a VIP (issue 72236).
    for base in (S.LOAD_BALANCER, S.CLUSTER_IP, S.EXTERNAL_IP, S.EXTERNAL_IP_LOCAL):
        filter_rules.append(f"-A {IPVS_FILTER} -m set --match-set {name[base]} dst,dst -j RETURN")
    filter_rules.append(
        f"-A {IPVS_FILTER} -m set --match-set {name[S.HEALTH_CHECK_NODE_PORT]} dst -j RETURN"
    )
    filter_rules.append(
        f"-A {IPVS_FILTER} -m conntrack --ctstate NEW"
        f" -m set --match-set {name[S.IPVS_IPS]} dst -j REJECT"
    )

    nat_rules += [
        f"-A {POSTROUTING} -m mark ! --mark {mark}/{mark} -j RETURN",
        # Clear the mark so a packet that traverses the stack again is not masqueraded twice.
        f"-A {POSTROUTING} -j MARK --xor-mark {mark}",
        f'-A {POSTROUTING} -m comment --comment "kubernetes service traffic requiring SNAT"'
        " -j MASQUERADE --random-fully",
        f"-A {MARK_MASQ} -j MARK --or-mark {mark}",
    ]
    lines = ["*nat", *nat, *nat_rules, "COMMIT", "*filter", *filt, *filter_rules, "COMMIT"]
    return "\n".join(lines) + "\n"


def jump_prelude(saved: SavedRuleset) -> dict[str, list[str]]:
    """The jumps from the built-in chains that ``saved`` lacks (createAndLinkKubeChain's
    EnsureRule(Prepend)), per table; the restore declares every target chain."""
    planned: Mapping[str, Collection[str]] = {"nat": NAT_CHAINS, "filter": FILTER_CHAINS}
    return missing_jumps(saved, JUMPS, planned)


def with_jumps(text: str, jumps: Mapping[str, list[str]]) -> str:
    """``restore_text`` output with the missing jumps added to their tables."""
    return insert_before_commit(text, jumps)
