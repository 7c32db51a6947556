"""How a dataplane tells "traffic from a local pod" apart (upstream's detectLocalMode).

Backend-neutral: each backend turns a LocalDetector into its own match syntax.
"""

from __future__ import annotations

from dataclasses import dataclass

from kubeplex.core.config.kubeproxy import KubeProxyConfiguration
from kubeplex.core.model.types import IPFamily, NodeInfo, family_of


@dataclass(frozen=True, slots=True)
class LocalDetector:
    """``kind`` is "cidr" (source address in ``value``) or "interface" (input interface).

    For "interface", ``value`` is a name, or a prefix ending in ``+`` (iptables' wildcard).
    ``kind`` "" means no detection is possible: rules that need it are left out, as upstream.
    """

    kind: str = ""
    value: str = ""

    @property
    def implemented(self) -> bool:
        return bool(self.kind)


def local_detector(cfg: KubeProxyConfiguration, node: NodeInfo, family: IPFamily) -> LocalDetector:
    mode = cfg.detect_local_mode or "ClusterCIDR"
    if mode == "ClusterCIDR":
        for cidr in cfg.cluster_cidrs:
            if family_of(str(cidr)) is family:
                return LocalDetector("cidr", str(cidr))
        return LocalDetector()
    if mode == "NodeCIDR":
        cidrs = node.pod_cidrs_of(family)
        return LocalDetector("cidr", cidrs[0]) if cidrs else LocalDetector()
    if mode == "BridgeInterface":
        return LocalDetector("interface", cfg.detect_local.bridge_interface)
    if mode == "InterfaceNamePrefix":
        return LocalDetector("interface", cfg.detect_local.interface_name_prefix + "+")
    return LocalDetector()
