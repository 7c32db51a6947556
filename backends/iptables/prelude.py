"""The canary chains and the jumps from the built-in chains into ours, as upstream ensures them."""

from __future__ import annotations

from kubeplex.backends.iptables import names
from kubeplex.backends.iptables.rules import KUBELET_FIREWALL
from kubeplex.backends.netfilter.iptables import SavedRuleset
from kubeplex.backends.netfilter.jumps import Jump, missing_jumps

#: (table, builtin chain, comment, extra match, target): upstream's jumps into our chains, in the
#: order upstream ensures them; each is inserted at position 1 when missing.
JUMPS: tuple[Jump, ...] = (
    (
        "filter",
        "INPUT",
        "kubernetes externally-visible service portals",
        "-m conntrack --ctstate NEW",
        names.EXTERNAL_SERVICES,
    ),
    (
        "filter",
        "FORWARD",
        "kubernetes externally-visible service portals",
        "-m conntrack --ctstate NEW",
        names.EXTERNAL_SERVICES,
    ),
    ("filter", "INPUT", "kubernetes health check service ports", "", names.NODEPORTS),
    (
        "filter",
        "FORWARD",
        "kubernetes service portals",
        "-m conntrack --ctstate NEW",
        names.SERVICES,
    ),
    (
        "filter",
        "OUTPUT",
        "kubernetes service portals",
        "-m conntrack --ctstate NEW",
        names.SERVICES,
    ),
    ("filter", "FORWARD", "kubernetes forwarding rules", "", names.FORWARD),
    (
        "filter",
        "INPUT",
        "kubernetes load balancer firewall",
        "-m conntrack --ctstate NEW",
        names.PROXY_FIREWALL,
    ),
    (
        "filter",
        "OUTPUT",
        "kubernetes load balancer firewall",
        "-m conntrack --ctstate NEW",
        names.PROXY_FIREWALL,
    ),
    (
        "filter",
        "FORWARD",
        "kubernetes load balancer firewall",
        "-m conntrack --ctstate NEW",
        names.PROXY_FIREWALL,
    ),
    ("nat", "OUTPUT", "kubernetes service portals", "", names.SERVICES),
    ("nat", "PREROUTING", "kubernetes service portals", "", names.SERVICES),
    ("nat", "POSTROUTING", "kubernetes postrouting rules", "", names.POSTROUTING),
    # Shared with kubelet, which may have made them already: plain jumps without a comment.
    ("filter", "INPUT", "", "", KUBELET_FIREWALL),
    ("filter", "OUTPUT", "", "", KUBELET_FIREWALL),
)
CANARY_TABLES = ("mangle", "nat", "filter")


def prelude(saved: SavedRuleset, planned: dict[str, set[str]]) -> dict[str, list[str]]:
    """Lines that create missing canary chains and jump rules, in upstream's effective order.

    ``planned`` are the chains the restore declares, per table: a jump is only written to a
    chain that exists or is about to.
    """
    out: dict[str, list[str]] = {}
    for table in CANARY_TABLES:
        if names.CANARY not in saved.chains.get(table, set()):
            out.setdefault(table, []).append(f":{names.CANARY} - [0:0]")
    for table, lines in missing_jumps(saved, JUMPS, planned).items():
        out.setdefault(table, []).extend(lines)
    return out
