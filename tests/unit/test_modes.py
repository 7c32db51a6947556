"""Every mode at once (kubeplex.core.daemon.modes), on in-memory kernels: cleaning them all up,
a mode that cannot run here, a failing one, and the other modes' cleanup after a switch,
which keeps what the active mode programmed and runs once, after the first sync."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from kits.render_kit import V4, config, endpoint_slice, ep, port, service

from kubeplex.backends.iptables import IptablesBackend
from kubeplex.backends.nftables import NftablesBackend
from kubeplex.core.daemon.modes import (
    ModeCleanup,
    SwitchCleanup,
    cleanup_modes,
    platform_modes,
    remove_other_modes,
)
from kubeplex.core.daemon.proxier import Proxier
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import Backend, BackendContext, CleanupReport
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.errors import BackendError
from kubeplex.testing.fakes import FakeIptables, FakeNftables

NODE = "node-a"
CLASSES: dict[str, type[Backend]] = {"iptables": IptablesBackend, "nftables": NftablesBackend}


class Node:
    """One node's kernels, one per mode, and the backends made on them."""

    def __init__(self) -> None:
        self.kernels: dict[str, Any] = {"iptables": FakeIptables(), "nftables": FakeNftables()}
        self.made: list[str] = []

    def make(self, mode: str, ctx: BackendContext) -> Backend:
        self.made.append(mode)
        return CLASSES[mode](replace(ctx, kernel=self.kernels[mode]))

    def ctx(self, mode: str) -> BackendContext:
        return BackendContext(config({"mode": mode}), NODE, (V4,))

    def programmed(self, mode: str) -> tuple[Backend, ClusterState]:
        be = self.make(mode, self.ctx(mode))
        be.prepare()
        cluster = ClusterState(NODE, (V4,))
        cluster.set_service(service("ns", "web", "10.96.0.10", [port(80)]))
        cluster.set_endpoint_slice(endpoint_slice("ns", "web", [ep("10.0.0.1", NODE)]))
        be.sync(cluster.checkout(full=True))
        return be, cluster


@pytest.fixture(autouse=True)
def _linux_modes(monkeypatch: pytest.MonkeyPatch) -> None:
    # Only the modes these kernels model (the trust list may list more).
    monkeypatch.setattr("kubeplex.core.daemon.modes.platform_modes", lambda: sorted(CLASSES))


def test_platform_modes_are_the_trust_lists_for_this_platform() -> None:
    found = platform_modes()  # this module's name is the real one (the fixture patches modes')
    assert {"iptables", "nftables"} <= set(found) and "kernelspace" not in found
    assert found == sorted(found)


def test_every_mode_is_cleaned_up_and_says_what_it_removed() -> None:
    node = Node()
    node.programmed("iptables")
    node.programmed("nftables")
    done = cleanup_modes(node.ctx("iptables"), make=node.make)
    assert [d.mode for d in done] == ["iptables", "nftables"]
    ipt, nft = done
    assert "iptables nat chain KUBE-SERVICES" in ipt.removed and not ipt.error
    assert nft.removed[0] == "nftables table ip kube-proxy"
    assert "KUBE-" not in node.kernels["iptables"].save(V4)
    assert not node.kernels["nftables"].tables
    again = cleanup_modes(node.ctx("iptables"), make=node.make)
    assert [d.lines() for d in again] == [
        ["iptables: nothing to remove"],
        ["nftables: nothing to remove"],
    ]


def test_one_mode_only() -> None:
    node = Node()
    node.programmed("iptables")
    node.programmed("nftables")
    (done,) = cleanup_modes(node.ctx("iptables"), ["nftables"], make=node.make)
    assert done.mode == "nftables" and done.removed
    assert "KUBE-SERVICES" in node.kernels["iptables"].save(V4)


def test_a_mode_this_node_cannot_run_has_nothing_to_clean(tmp_path: Path) -> None:
    trust = Path(plugins.packaged_trust_file()).read_text()
    trust = trust.replace('executables = ["nft"]', 'executables = ["kubeplex-no-such-nft"]')
    (tmp_path / "plugins.toml").write_text(trust)
    node = Node()
    with plugins.trusting(tmp_path / "plugins.toml"):
        done = cleanup_modes(node.ctx("iptables"), make=node.make)
    nft = next(d for d in done if d.mode == "nftables")
    assert nft.skipped == "executable 'kubeplex-no-such-nft' not found in PATH"
    assert nft.lines() == [f"nftables: nothing to remove ({nft.skipped})"]
    assert "nftables" not in node.made  # not even constructed


def test_a_failing_mode_is_reported_and_the_others_still_run() -> None:
    node = Node()
    node.programmed("nftables")

    class Broken(FakeIptables):
        def save(self, *args: Any, **kwargs: Any) -> str:
            raise BackendError("iptables-save: permission denied")

    node.kernels["iptables"] = Broken()
    ipt, nft = cleanup_modes(node.ctx("iptables"), make=node.make)
    assert ipt.error == "iptables-save: permission denied"
    assert ipt.lines() == ["iptables: cleanup failed: iptables-save: permission denied"]
    assert nft.removed and not node.kernels["nftables"].tables


def test_after_a_switch_the_other_modes_go_but_what_the_active_one_shares() -> None:
    node = Node()
    node.programmed("nftables")
    active, _ = node.programmed("iptables")
    calls: list[tuple[str, frozenset[str], bool]] = []

    class Spy(NftablesBackend):
        def cleanup(self, keep: Any = (), drain: bool = False) -> CleanupReport:
            calls.append((self.mode, frozenset(keep), drain))
            return super().cleanup(keep, drain)

    def make(mode: str, ctx: BackendContext) -> Backend:
        if mode == "nftables":
            return Spy(replace(ctx, kernel=node.kernels[mode]))
        return node.make(mode, ctx)

    (done,) = remove_other_modes(active, make)
    assert done.mode == "nftables" and done.removed
    assert calls == [("nftables", frozenset(active.leftovers()), True)]
    assert "KUBE-SERVICES" in node.kernels["iptables"].save(V4)


@pytest.mark.parametrize("others_hold", [False, True])
def test_the_active_modes_leftovers_are_read_only_if_another_mode_finds_something(
    others_hold: bool,
) -> None:
    node = Node()
    if others_hold:
        node.programmed("iptables")
    reads: list[str] = []

    class Active(NftablesBackend):
        def leftovers(self) -> list[str]:
            reads.append(self.mode)
            return super().leftovers()

    active = Active(replace(node.ctx("nftables"), kernel=node.kernels["nftables"]))
    active.prepare()
    (done,) = remove_other_modes(active, node.make)
    assert done.mode == "iptables" and bool(done.removed) is others_hold
    assert reads == (["nftables"] if others_hold else [])


def test_the_switch_runs_once_after_the_first_successful_sync() -> None:
    node = Node()
    node.programmed("iptables")
    be = node.make("nftables", node.ctx("nftables"))
    cluster = ClusterState(NODE, (V4,))
    cluster.set_service(service("ns", "web", "10.96.0.10", [port(80)]))
    reports: list[list[ModeCleanup]] = []
    switch = SwitchCleanup(be, lambda result, elapsed, done: reports.append(list(done)), node.make)
    proxier = Proxier(cluster, be)
    proxier.listeners.append(switch)

    class Refusing(FakeNftables):
        refuse = True

        def run(self, text: str) -> None:
            if self.refuse:
                raise BackendError("nft: refused")
            super().run(text)

        def run_stages(self, texts: Any, empty_tables: bool = True) -> None:
            if self.refuse:
                raise BackendError("nft: refused")
            super().run_stages(texts, empty_tables)

    kernel = Refusing()
    be.kernel = kernel
    node.kernels["nftables"] = kernel
    assert not proxier.sync(full=True)
    assert not reports and "KUBE-SERVICES" in node.kernels["iptables"].save(V4)  # untouched
    kernel.refuse = False
    assert proxier.sync(full=True)
    assert [[d.mode for d in r] for r in reports] == [["iptables"]]
    assert "KUBE-" not in node.kernels["iptables"].save(V4)
    cluster.set_service(service("ns", "web2", "10.96.0.11", [port(80)]))
    assert proxier.sync()
    assert len(reports) == 1


def test_a_failing_switch_cleanup_is_never_fatal() -> None:
    node = Node()
    be, cluster = node.programmed("nftables")

    class Broken(FakeIptables):
        def save(self, *args: Any, **kwargs: Any) -> str:
            raise BackendError("iptables-save: gone")

    node.kernels["iptables"] = Broken()
    switch = SwitchCleanup(be, make=node.make)
    proxier = Proxier(cluster, be)
    proxier.listeners.append(switch)
    cluster.set_service(service("ns", "web2", "10.96.0.11", [port(80)]))
    assert proxier.sync(full=True)
    assert switch.results == [ModeCleanup("iptables", error="iptables-save: gone")]


def test_what_another_mode_holds_connections_through_drains_then_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ipvs keeps an established connection's NAT in its own table, reached only while the
    Service IP is local: after a switch away from it, a virtual service with connections
    stays (with its address) until they are gone; later syncs remove it."""
    from kubeplex.backends.ipvs import IpvsBackend
    from kubeplex.testing.fakes import FakeIpvs

    trust = Path(plugins.packaged_trust_file()).read_text()
    trust = trust.replace('kernel-modules = ["ip_vs", "dummy", "ip_set"]', "")
    (tmp_path / "plugins.toml").write_text(trust)
    monkeypatch.setitem(CLASSES, "ipvs", IpvsBackend)
    monkeypatch.setattr("kubeplex.core.daemon.modes.platform_modes", lambda: sorted(CLASSES))
    node = Node()
    # One node, one iptables: the two modes share KUBE-SERVICES and its kin.
    ipvs = node.kernels["ipvs"] = FakeIpvs(node.kernels["iptables"])
    with plugins.trusting(tmp_path / "plugins.toml"):
        node.programmed("ipvs")
        ipvs.set_connections(V4, "-t 10.96.0.10:80", "10.0.0.1:80", active=1)
        active, cluster = node.programmed("iptables")
        now = [0.0]
        switch = SwitchCleanup(active, make=node.make, recheck=10, clock=lambda: now[0])
        state = cluster.checkout(full=True)
        result = active.sync(state)
        switch(state, result, 0.1)
        by_mode = {r.mode: r for r in switch.results}
        assert by_mode["nftables"].draining == ()
        assert by_mode["ipvs"].draining == (
            "ipvs virtual service -t 10.96.0.10:80 (1 active connections)",
            "address 10.96.0.10 on kube-ipvs0",
            "link kube-ipvs0",
        )
        assert "ipset KUBE-CLUSTER-IP" in by_mode["ipvs"].removed
        assert [str(k) for k in ipvs.dump(V4).virtual] == ["-t 10.96.0.10:80"]
        assert ipvs.dump(V4).addresses == {"10.96.0.10"}
        assert not ipvs.dump(V4).ipsets  # the sets and chains went at once
        assert switch.draining == ["ipvs"]
        switch(state, result, 0.1)  # too soon: not checked again
        ipvs.set_connections(V4, "-t 10.96.0.10:80", "10.0.0.1:80", inactive=1)  # closed
        switch(state, result, 0.1)
        assert ipvs.dump(V4).virtual  # still too soon
        now[0] = 10.0
        switch(state, result, 0.1)
        assert switch.draining == []
        assert not ipvs.dump(V4).virtual and not ipvs.dump(V4).link
        assert "KUBE-SERVICES" in node.kernels["iptables"].save(V4)  # the active mode's own
