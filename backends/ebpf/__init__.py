"""The ebpf mode: Services load-balanced at the socket by cgroup BPF programs (bpf/), whose maps
are laid out in layout.py, loaded and pinned by loader.py through libbpf.py.

``EbpfBackend`` joins them: ``observe`` dumps the maps the render writes, ``render`` is
render.py's (graph to map operations), and ``apply`` sends the plan through the map seam
(maps.py over the pinned maps, or ``FakeEbpfMaps``): the only step that touches the kernel.
``prepare`` loads and attaches (or adopts what an earlier start pinned); ``cleanup`` detaches
and unpins it all.

Traffic from other hosts (NodePorts, externalIPs and LoadBalancer IPs) goes through the
kernel's NAT in nftables tables of the mode's own (entry_nat.py), which the plan carries too.

Not done yet, so not declared: SCTP, loopback NodePorts, loadBalancerSourceRanges and
rejecting unused ClusterIP ports (``describe`` lists them for ``kubeplex backends``).
"""

from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import Collection, Mapping, Sequence
from typing import Any, cast

from kubeplex.backends.ebpf import entry_nat, metrics, requirements
from kubeplex.backends.ebpf.drain import keep_reverse_path
from kubeplex.backends.ebpf.inspection import delete_held, held_entries, programmed
from kubeplex.backends.ebpf.layout import PROGRAMS
from kubeplex.backends.ebpf.libbpf import LibbpfMissing
from kubeplex.backends.ebpf.loader import Loader, LoaderError
from kubeplex.backends.ebpf.maps import PinnedMaps
from kubeplex.backends.ebpf.options import EbpfOptions
from kubeplex.backends.ebpf.plan import OBSERVED_MAPS, EbpfPlan, MapDump, MapSeam
from kubeplex.backends.ebpf.render import EbpfRenderer, RenderSettings
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import (
    Backend,
    BackendContext,
    CleanupReport,
    MetricFamily,
    ProgrammedService,
    Rendered,
    Sample,
    SyncResult,
)
from kubeplex.core.dataplane.nodeports import node_port_ips
from kubeplex.core.model.errors import BackendError
from kubeplex.core.model.expectations import SOCKET_LOAD_BALANCING
from kubeplex.core.model.graph import ProxyState
from kubeplex.core.model.types import IPFamily, NodeInfo, ServicePortName

MODE = "ebpf"

#: What the mode does not do yet.
NOT_YET = (
    "SCTP Services",
    "NodePorts on loopback addresses",
    "loadBalancerSourceRanges for connections started on the node (other hosts' are filtered)",
    "rejecting traffic to unused ClusterIP ports",
)


def nodeport_addresses(addresses: Collection[str], node: NodeInfo) -> tuple[str, ...]:
    """The node addresses NodePorts are served on, both families: nodePortAddresses' choice
    among the Node's own, all of them (but loopback) where it matches everything."""
    chosen: list[str] = []
    for family in (IPFamily.IPv4, IPFamily.IPv6):
        own = node.addresses_of(family)
        picked = node_port_ips(list(addresses), node, family, own)
        if picked is None:
            picked = tuple(ip for ip in own if not ipaddress.ip_address(ip).is_loopback)
        chosen += picked
    return tuple(chosen)


class EbpfBackend(Backend[MapSeam, MapDump]):
    """See the module's documentation."""

    mode = MODE
    capabilities = frozenset({"session-affinity", "ipv6", SOCKET_LOAD_BALANCING})
    #: Connections started on the node are translated at the socket (conntrack holds no NAT
    #: of theirs), but those of the entry points for other hosts are the kernel's NAT: the
    #: daemon cleans their stale UDP entries, as upstream's modes do.
    uses_conntrack = True

    def __init__(self, ctx: BackendContext, options: Mapping[str, Any] | None = None) -> None:
        raw = plugins.backend_options(MODE) if options is None else options
        # The node's own cgroup and bpffs (the lab's, a test's) over the trust list's.
        self.options = EbpfOptions.parse(raw).on_node(ctx.cgroup, ctx.bpffs)
        self.loader = Loader(self.options.bpffs)
        super().__init__(ctx)
        self.renderer = EbpfRenderer()
        self.entries = entry_nat.EntryNatRenderer()

    def real_kernel(self) -> MapSeam:
        # No map is open until prepare (or an observe that finds them pinned): the
        # construction of a backend for `kubeplex render` touches nothing.
        return PinnedMaps({}, self.ctx.netns)

    def missing_requirements(self) -> list[str]:
        return requirements.missing(self.options, self.loader)

    def missing_for_cleanup(self) -> list[str]:
        """Only the bpffs folder: unpinning a link nobody else holds detaches its program, so
        another mode's pod (without cgroup2, without CAP_BPF) removes what this mode left."""
        return requirements.missing_bpffs(self.options)

    def describe(self) -> list[str]:
        return [
            f"attaches to cgroup {self.options.cgroup}, pins under {self.loader.folder}",
            *(f"not yet: {what}" for what in NOT_YET),
        ]

    def prepare(self) -> None:
        """Loads and attaches the programs to the cgroup (adopting what is pinned there)."""
        if isinstance(self.kernel, PinnedMaps):
            try:
                dataplane = self.loader.start(self.options.cgroup)
            except (LoaderError, OSError) as err:
                raise BackendError(f"ebpf: cannot attach the programs: {err}") from err
            self.kernel.close()
            self.kernel.maps = dict(dataplane.maps)

    def _open_pinned(self) -> None:
        """The pinned maps, opened read-write without attaching (an observe before prepare:
        `kubeplex render` as root). Nothing pinned: nothing opened. Pinned but not readable
        (not root, no libbpf, another version's maps): the error, so that `kubeplex render`
        says it prints the plan without what the node holds."""
        # (Path.exists raises PermissionError where the bpffs folder is closed to the user.)
        kernel = self.kernel
        if isinstance(kernel, PinnedMaps) and not kernel.maps and self.loader.folder.exists():
            kernel.maps = self.loader.open_maps()

    def observe(self, state: ProxyState) -> MapDump | None:
        """A full sync's dump of the maps the render writes, and of the affinity entries (it
        deletes those of Services gone; None: no maps pinned yet), and whether conntrack holds
        NATed flows (entry_nat.py keeps their NAT); a partial sync reads nothing."""
        self._settle(state)
        if not (self.renderer.force_full or state.is_full()):
            return None
        families = ["ipv6" if f is IPFamily.IPv6 else "ipv4" for f in self.ctx.families]
        self.entries.nat_flows = self.kernel.nat_flows(families)
        with contextlib.suppress(BackendError):  # (no nft: the apply will say so)
            self.entries.observed(self.kernel.tables())
        self._open_pinned()
        try:
            return {name: self.kernel.dump(name) for name in OBSERVED_MAPS}
        except OSError:
            return None

    def _settle(self, state: ProxyState) -> None:
        """The render's settings for ``state``'s node; a change makes the next render full
        (observe settles first, so that it reads the dump that render then needs)."""
        addresses = nodeport_addresses(self.ctx.config.node_port_addresses, state.node)
        settings = RenderSettings(addresses, tuple(self.ctx.families))
        if settings != self.renderer.settings:
            self.renderer.settings = settings
            self.renderer.invalidate()

    def render(self, state: ProxyState, observed: MapDump | None = None) -> EbpfPlan:
        self._settle(state)
        plan = self.renderer.render(state, observed)
        return entry_nat.joined(plan, self.entries, state, self.renderer.settings)

    def apply(self, rendered: Rendered) -> SyncResult:
        plan = cast(EbpfPlan, rendered)  # (what this backend's render returned)
        try:
            plan.send(self.kernel)
        except OSError as err:
            self.renderer.invalidate()
            raise BackendError(f"ebpf: the maps refused the plan: {err}") from err
        entry_nat.send(plan, self.entries, self.kernel)
        updates = sum(op.value is not None for op in plan.ops)
        return SyncResult(
            full=plan.full,
            counts={"map_updates": updates, "map_deletes": len(plan.ops) - updates},
            failed=dict(plan.left_out),
            samples=tuple(metrics.sync_samples(self.renderer.desired, plan.ops)),
        )

    def invalidate(self) -> None:
        self.renderer.invalidate()
        self.entries.invalidate()

    def metric_families(self) -> Sequence[MetricFamily]:
        return metrics.FAMILIES

    def scrape(self) -> Sequence[Sample]:
        """Which programs are attached to the cgroup, read from their pinned links (left out
        on a kernel of another kind, or where the pins cannot be read)."""
        if not isinstance(self.kernel, PinnedMaps):
            return []
        try:
            attached = self.loader.attached(self.options.cgroup)
        except (OSError, LibbpfMissing):
            return []
        return metrics.attached_samples(PROGRAMS, attached)

    def inspect(self, service_port: ServicePortName) -> list[ProgrammedService] | None:
        """From the maps, at the places the last render gave the Service port."""
        self._open_pinned()
        out = []
        for family in (IPFamily.IPv4, IPFamily.IPv6):
            part = self.renderer.contribution(family, service_port)
            found = part and programmed(self.kernel, family, service_port, part)
            if found:
                out.append(found)
        return out

    def leftovers(self) -> list[str]:
        """What is pinned, every entry of the rendered maps (so a Service left behind shows),
        and the entry-point tables."""
        pinned = self.loader.leftovers()
        if not pinned and isinstance(self.kernel, PinnedMaps) and self.kernel.maps:
            # Unpinned by another start's cleanup: the maps this one still holds open are
            # reachable by nobody else and go when it closes them.
            self.kernel.close()
            self.kernel.maps = {}
        try:
            self._open_pinned()
            held = held_entries(self.kernel)
        except (LoaderError, OSError, LibbpfMissing):
            held = []  # (the pins above still show)
        return pinned + held + entry_nat.leftovers(self.kernel)

    def cleanup(self, keep: Collection[str] = (), drain: bool = False) -> CleanupReport:
        """Detaches and unpins everything of the mode (the maps go with their last pin).
        With ``drain``, the reverse path (the recvmsg and getpeername programs and the reverse
        NAT maps) stays, for a while, for replies and getpeername of connections made before
        (drain.py); ``draining`` lists it."""
        held: list[str] = []
        if isinstance(self.kernel, PinnedMaps):
            self.kernel.close()
            self.kernel.maps = {}
        else:  # a seam without pins (the fake): its entries go one by one
            held = delete_held(self.kernel)
        try:
            if drain:
                removed, draining = keep_reverse_path(self.loader)
            else:
                removed, draining = self.loader.cleanup(), []
        except OSError as err:
            raise BackendError(f"ebpf: cleanup of {self.loader.folder}: {err}") from err
        removed += held + entry_nat.remove(self.kernel)
        self.renderer = EbpfRenderer(self.renderer.settings)
        self.entries = entry_nat.EntryNatRenderer()
        return CleanupReport(MODE, removed=tuple(removed), draining=tuple(draining))
