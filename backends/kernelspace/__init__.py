"""The Windows dataplane (upstream kube-proxy's ``kernelspace`` mode, pkg/proxy/winkernel).

Render only: ``kubeplex render --proxy-mode kernelspace`` prints, as JSON, the HNS load
balancers and remote endpoints Windows kube-proxy would create. Programming them needs the
Windows Host Networking Service (HNS), which kubeplex does not drive: ``run`` and ``cleanup``
refuse with a clear error rather than pretend.
"""

from __future__ import annotations

import ipaddress
import os
import sys
from collections.abc import Collection

from kubeplex.backends.kernelspace.policies import (
    FamilyPlan,
    FamilyRenderer,
    FamilySettings,
    KernelspaceRendered,
)
from kubeplex.core.dataplane.backend import (
    BackendContext,
    CleanupReport,
    FamilyBackend,
    Rendered,
    SyncResult,
)
from kubeplex.core.model.errors import BackendError
from kubeplex.core.model.graph import ChangeSet, ProxyState, ServiceGraph
from kubeplex.core.model.types import IPFamily, NodeInfo, family_of, normalize_ip

#: Where upstream reads the HNS network name when winkernel.networkName is not set.
NETWORK_ENV = "KUBE_NETWORK"


def requires_hns() -> str:
    """Why this backend cannot program the node it runs on."""
    if sys.platform == "win32":
        return (
            "mode kernelspace is render-only in kubeplex: programming Windows HNS (the Host "
            "Networking Service) is not implemented; `kubeplex render --proxy-mode kernelspace` "
            "prints the policies"
        )
    return (
        f"mode kernelspace requires Windows HNS (the Host Networking Service); this node runs "
        f"{sys.platform}, where only `kubeplex render --proxy-mode kernelspace` works"
    )


def _port_of(address: str) -> int:
    """The port of a ``host:port`` bind address (0 if there is none)."""
    _, _, port = address.rpartition(":")
    return int(port) if port.isdigit() else 0


class KernelspaceBackend(
    FamilyBackend[FamilyRenderer, KernelspaceRendered, None, None, FamilySettings, FamilyPlan]
):
    """No kernel seam (``real_kernel`` is None): nothing is ever programmed."""

    mode = "kernelspace"
    capabilities = frozenset({"session-affinity", "ipv6", "dsr", "render-only"})
    #: HNS has no conntrack for the daemon to clean (upstream registers no reconciler metrics).
    uses_conntrack = False

    def __init__(self, ctx: BackendContext) -> None:
        super().__init__(ctx)
        # Read once, here: a render must not depend on when it runs.
        self._network_name = ctx.config.winkernel.network_name or os.environ.get(NETWORK_ENV, "")

    # --- render -----------------------------------------------------------------------------

    def settings(self, family: IPFamily, node: NodeInfo) -> FamilySettings:
        cfg = self.ctx.config
        win = cfg.winkernel
        source_vip = ""
        if win.source_vip:
            try:
                source_vip = normalize_ip(win.source_vip)
            except ValueError as err:
                raise BackendError(
                    f"winkernel.sourceVip: {win.source_vip!r} is not an IP address"
                ) from err
        # Only overlay networks need a source VIP (upstream refuses to start without one
        # there, and ignores it on L2Bridge); overlay networks are single-stack.
        overlay = bool(source_vip) and family_of(source_vip) is family
        addresses = node.addresses_of(family)
        # The node's primary address of the family ("" if the Node has none).
        node_ip = addresses[0] if addresses else ""
        return FamilySettings(
            family=family,
            network_name=self._network_name,
            overlay=overlay,
            source_vip=source_vip if overlay else "",
            node_ip=node_ip,
            node_addresses=addresses,
            enable_dsr=win.enable_dsr,
            forward_health_check_vip=win.forward_health_check_vip,
            root_hns_endpoint_name=win.root_hns_endpoint_name,
            healthz_port=_port_of(cfg.healthz_bind_address),
            cluster_cidrs=tuple(
                ipaddress.ip_network(c) for c in cfg.cluster_cidrs if c.version == _version(family)
            ),
        )

    def make_renderer(self, settings: FamilySettings) -> FamilyRenderer:
        return FamilyRenderer(settings)

    def family_settings(
        self, family: IPFamily, state: ProxyState, observed: None
    ) -> FamilySettings:
        return self.settings(family, state.node)

    def render_family(
        self, renderer: FamilyRenderer, graph: ServiceGraph, changes: ChangeSet, observed: None
    ) -> FamilyPlan:
        return renderer.render(graph, changes)

    def combine(self, plans: list[FamilyPlan]) -> KernelspaceRendered:
        return KernelspaceRendered(plans)

    # --- the node: Windows HNS only ---------------------------------------------------------

    def missing_requirements(self) -> list[str]:
        return [requires_hns()]

    def apply(self, rendered: Rendered) -> SyncResult:
        raise BackendError(requires_hns())

    def cleanup(self, keep: Collection[str] = (), drain: bool = False) -> CleanupReport:
        raise BackendError(requires_hns())

    def describe(self) -> list[str]:
        return [*super().describe(), "render only: " + requires_hns()]


def _version(family: IPFamily) -> int:
    return 6 if family is IPFamily.IPv6 else 4
