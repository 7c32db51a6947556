"""The iptables backend's render without a kernel, as upstream's fake proxier sets it up (for
the render, golden and isolation tests of the iptables mode)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from kits.render_kit import NODE, V4, RenderHarness, config
from kubeplex.backends.iptables import IptablesBackend
from kubeplex.backends.iptables.render import IptablesRendered
from kubeplex.core.config.kubeproxy import KubeProxyConfiguration
from kubeplex.core.model.types import IPFamily
from kubeplex.testing.fakes import FakeIptables

#: upstream's NewFakeProxier detects local traffic by this cluster CIDR.
UPSTREAM = {"clusterCIDR": "10.0.0.0/8"}


class Harness(RenderHarness[IptablesBackend, IptablesRendered]):
    """ClusterState + IptablesBackend.render, without a kernel."""

    def __init__(
        self,
        objects: Iterable[Mapping[str, Any]] = (),
        cfg: Mapping[str, Any] | KubeProxyConfiguration = UPSTREAM,
        families: tuple[IPFamily, ...] = (V4,),
        nfacct: bool = False,
        node: str = NODE,
    ) -> None:
        # Whether nfacct counters exist is found out on the node (prepare); a render test must
        # not depend on the host it runs on (upstream's fake proxier has none).
        kernel = FakeIptables(nfacct=nfacct)
        super().__init__(
            lambda ctx: IptablesBackend(replace(ctx, kernel=kernel)), objects, cfg, families, node
        )
        self.backend.prepare()

    def commit(self, rendered: IptablesRendered) -> None:
        """What apply() does after a successful iptables-restore, minus the kernel."""
        for plan in rendered.plans:
            self.backend.renderers[plan.family].commit(plan)

    def reconfigure(self, fields: Mapping[str, Any]) -> None:
        self.cfg = config(fields)
        self.backend.ctx = replace(self.backend.ctx, config=self.cfg)


def all_lines(rendered: IptablesRendered) -> list[str]:
    return str(rendered).splitlines()
