"""In-memory kernels for tests and plugin authors: ``FakeIptables``, ``FakeNftables``, ``FakeIpvs``,
``FakeEbpfMaps``.

They implement the text-level kernel seams of the netfilter backends (the iptables mode's
``IptablesSeam``, the nftables mode's ``NftSeam``; ``FakeIpvs`` the ipvs mode's ``IpvsSeam``,
operations as data) as independent models of what
iptables-restore/-save and nft do, so a backend runs without root and without a kernel::

    from kubeplex.core.dataplane.backend import BackendContext
    from kubeplex.testing import fakes

    kernel = fakes.for_mode("nftables")          # a fresh FakeNftables
    ctx = BackendContext(config, node_name="node-1", kernel=kernel)
    backend = plugin_class(ctx)
    rendered = backend.render(state, backend.observe(state))
    backend.apply(rendered)
    assert kernel.inputs() == list(rendered.kernel_inputs())

Each fake keeps a log of every input it received and says in its docstring what it cannot
model (packets, above all).
"""

from __future__ import annotations

from kubeplex.testing.fakes.ebpf import FakeEbpfMaps
from kubeplex.testing.fakes.iptables import FakeIptables
from kubeplex.testing.fakes.ipvs import FakeIpvs
from kubeplex.testing.fakes.nftables import FakeNftables

__all__ = ["FakeEbpfMaps", "FakeIptables", "FakeIpvs", "FakeNftables", "for_mode"]


def for_mode(mode: str) -> FakeIptables | FakeNftables | FakeIpvs | FakeEbpfMaps | None:
    """A fresh fake kernel for ``mode`` ("iptables", "nftables", "ipvs", "ebpf"); None for
    others."""
    if mode == "iptables":
        return FakeIptables()
    if mode == "nftables":
        return FakeNftables()
    if mode == "ipvs":
        return FakeIpvs()
    if mode == "ebpf":
        return FakeEbpfMaps()
    return None
