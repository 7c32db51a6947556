"""Large plans are applied in batches; the kernel must end up exactly as with one restore.
A refused input (the kernel refuses a rule added to it) leaves exactly the previous rules."""

from __future__ import annotations

import copy
import re
import subprocess
from typing import Any

import pytest
from kits.cli_kit import in_netns

from kubeplex.backends.iptables import IptablesBackend, render
from kubeplex.backends.iptables.render import IptablesRendered
from kubeplex.backends.netfilter import iptables
from kubeplex.backends.netfilter.iptables import Iptables
from kubeplex.core.config.kubeproxy import parse_config
from kubeplex.core.dataplane.backend import BackendContext
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.errors import BackendError
from kubeplex.core.model.graph import ProxyState
from kubeplex.core.model.types import IPFamily
from kubeplex.testing.dataplane import endpoint, endpoint_slice, service

NODE = "node-a"
CONFIG = parse_config(
    "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
    "clusterCIDR: 10.128.0.0/9\n",
    "test",
)


def objects(services: int, moved: int = -1) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(services):
        name = f"svc-{i}"
        out.append(
            {
                "kind": "Service",
                "metadata": {"name": name, "namespace": "bench"},
                "spec": {"clusterIP": f"10.96.{i // 250}.{i % 250 + 1}", "ports": [{"port": 80}]},
            }
        )
        eps = [
            {
                "addresses": [f"10.{128 + i // 250}.{i % 250}.{j + (100 if i == moved else 1)}"],
                "nodeName": NODE if j % 2 else "other",
            }
            for j in range(10)
        ]
        out.append(
            {
                "kind": "EndpointSlice",
                "metadata": {
                    "name": f"{name}-x",
                    "namespace": "bench",
                    "labels": {"kubernetes.io/service-name": name},
                },
                "addressType": "IPv4",
                "ports": [{"name": "", "port": 8080}],
                "endpoints": eps,
            }
        )
    return out


def load(state: ClusterState, objs: list[dict[str, Any]]) -> None:
    for obj in objs:
        (state.set_service if obj["kind"] == "Service" else state.set_endpoint_slice)(obj)


def saved(ns: str) -> list[str]:
    out = subprocess.run(
        ["ip", "netns", "exec", ns, "iptables-save"], capture_output=True, text=True, check=True
    ).stdout
    return sorted(line for line in out.splitlines() if line and not line.startswith("#"))


class Refusing(Iptables):
    """The real iptables, except that once armed, the ``number``-th restore input of
    ``family`` gets a rule that jumps to no chain in its last table: the kernel refuses that
    table. ``sent`` holds that family's inputs as they were sent."""

    def __init__(self, netns: str) -> None:
        super().__init__(netns)
        self.armed: tuple[int, IPFamily] | None = None
        self.sent: list[str] = []

    def arm(self, number: int, family: IPFamily = IPFamily.IPv4) -> list[str]:
        self.armed, self.sent = (number, family), []
        return self.sent

    def restore(self, family: IPFamily, text: str) -> None:
        if self.armed is not None and family is self.armed[1]:
            self.sent.append(text)
            if len(self.sent) == self.armed[0]:
                head, commit, tail = text.rpartition("COMMIT\n")
                text = f"{head}-A KUBE-MARK-MASQ -j KUBEPLEX-NO-SUCH-CHAIN\n{commit}{tail}"
        super().restore(family, text)


def backend(
    netns: str, families: tuple[IPFamily, ...] = (IPFamily.IPv4,)
) -> tuple[IptablesBackend, ClusterState, Refusing]:
    state = ClusterState(NODE, families=families)
    kernel = Refusing(netns)
    be = IptablesBackend(BackendContext(CONFIG, NODE, families=families, kernel=kernel))
    be.prepare()
    return be, state, kernel


def observed_render(be: IptablesBackend, state: ProxyState) -> IptablesRendered:
    """What sync() applies: the render of what observe() found."""
    return be.render(state, be.observe(state))


@pytest.mark.kernel
def test_batched_full_and_partial_syncs_equal_one_restore(
    netns: str, netns2: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    batched_ns, single_ns = netns, netns2
    batched, state, _ = backend(batched_ns)
    load(state, objects(300))
    rendered = observed_render(batched, state.checkout(full=True))
    plan = rendered.plans[0]
    assert plan.rule_count > 9000
    assert len(plan.inputs()) >= 4  # really split: service batches, then the fixed chains
    batched.apply(rendered)

    single, single_state, _ = backend(single_ns)
    load(single_state, objects(300))
    one = single.render(single_state.checkout(full=True))
    for p in one.plans:
        # One input with everything, as upstream writes it.
        subprocess.run(
            ["ip", "netns", "exec", single_ns, "iptables-restore", "--noflush"],
            input=p.restore_input(),
            text=True,
            check=True,
        )
    ours = [ln for ln in saved(batched_ns) if ln.startswith("-A KUBE-")]
    assert ours == [ln for ln in saved(single_ns) if ln.startswith("-A KUBE-")]

    # A partial sync that moves every endpoint of one Service, batched with a tiny limit.
    load(state, objects(300, moved=7))
    partial = observed_render(batched, state.checkout())
    assert not partial.full
    monkeypatch.setattr(render, "BATCH_RULES", 5)
    assert len(partial.plans[0].inputs()) >= 2
    batched.apply(partial)
    after = saved(batched_ns)
    assert any("10.128.7.100:8080" in ln for ln in after)
    assert not any("10.128.7.1:8080" in ln for ln in after)


def renumbered(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same Services on port 81 and their endpoints on 8081: every service chain is
    rewritten, every endpoint chain replaced by a new one."""
    out = copy.deepcopy(objs)
    for obj in out:
        if obj["kind"] == "Service":
            obj["spec"]["ports"][0]["port"] = 81
        else:
            obj["ports"][0]["port"] = 8081
    return out


def exact(ns: str, tool: str = "iptables-save") -> list[str]:
    """Every table, chain and rule in the kernel's order, without comments and counters."""
    out = in_netns(ns, tool)
    return [re.sub(r" \[\d+:\d+\]", "", ln) for ln in out.splitlines() if not ln.startswith("#")]


@pytest.mark.kernel
@pytest.mark.parametrize("full", [True, False], ids=["full", "partial"])
def test_a_refused_batch_leaves_exactly_the_previous_rules(
    netns: str, monkeypatch: pytest.MonkeyPatch, full: bool
) -> None:
    be, state, kernel = backend(netns)
    load(state, objects(300))
    be.sync(state.checkout(full=True))
    before = exact(netns)

    load(state, renumbered(objects(300)))
    rendered = observed_render(be, state.checkout(full=full))
    assert rendered.full is full
    plan = rendered.plans[0]
    monkeypatch.setattr(render, "BATCH_RULES", plan.rule_count // 4 + 1)
    monkeypatch.setattr(iptables, "BATCH_RULES", plan.rule_count // 4 + 1)  # the rollback's
    assert len(plan.inputs()) == 5
    sent = kernel.arm(3)
    with pytest.raises(BackendError) as refused:
        be.apply(rendered)
    assert exact(netns) == before
    message = str(refused.value)
    assert "input 3 of 5" in message and "rolled back" in message
    assert "KUBEPLEX-NO-SUCH-CHAIN" in message  # what the kernel said
    assert refused.value.families == (IPFamily.IPv4,)
    # Five inputs planned, three sent (the third refused), then the rollback's.
    assert len(sent) > 3 and not [t for t in sent[3:] if "KUBEPLEX-NO-SUCH-CHAIN" in t]

    # The next (full) sync writes the change.
    monkeypatch.undo()
    kernel.armed = None
    be.sync(state.checkout())  # a full one: the failure invalidated the renderer
    assert any("--dport 81 " in ln for ln in exact(netns))
    assert not any("--dport 80 " in ln for ln in exact(netns))


@pytest.mark.kernel
def test_a_refused_nat_table_rolls_back_the_filter_table(netns: str) -> None:
    """iptables-restore commits table by table: a refused *nat leaves *filter written."""
    be, state, kernel = backend(netns)
    load(state, objects(3))
    be.sync(state.checkout(full=True))
    before = exact(netns)

    # A Service without endpoints (a filter REJECT rule) and one with new endpoints (nat).
    state.set_service(
        {
            "kind": "Service",
            "metadata": {"name": "empty", "namespace": "bench"},
            "spec": {"clusterIP": "10.96.9.9", "ports": [{"port": 80}]},
        }
    )
    load(state, objects(3, moved=1))
    rendered = observed_render(be, state.checkout())
    assert not rendered.full
    plan = rendered.plans[0]
    assert plan.filter and plan.nat and len(plan.inputs()) == 1
    kernel.arm(1)
    with pytest.raises(BackendError) as refused:
        be.apply(rendered)
    assert exact(netns) == before
    assert "rolled back, the previous rules are in place" in str(refused.value)


@pytest.mark.kernel
def test_a_refused_first_table_is_reported_as_nothing_written(netns: str) -> None:
    be, state, kernel = backend(netns)
    load(state, objects(3))
    be.sync(state.checkout(full=True))
    before = exact(netns)
    load(state, objects(3, moved=1))  # nat only
    rendered = observed_render(be, state.checkout())
    assert not rendered.plans[0].filter
    kernel.arm(1)
    with pytest.raises(BackendError, match="nothing was written, the previous rules are in"):
        be.apply(rendered)
    assert exact(netns) == before


@pytest.mark.kernel
def test_a_first_sync_refused_midway_leaves_no_chain_behind(netns: str) -> None:
    """Rolled back to nothing: the chains and the jumps the sync created are gone (the
    empty tables iptables-nft made stay: iptables-restore cannot delete a table)."""
    be, state, kernel = backend(netns)
    load(state, objects(300))
    rendered = observed_render(be, state.checkout(full=True))
    kernel.arm(3)
    with pytest.raises(BackendError) as refused:
        be.apply(rendered)
    assert [ln for ln in exact(netns) if "KUBE-" in ln or ln.startswith("-A")] == []
    assert re.search(r"(?s)input 3 of .*rolled back", str(refused.value))


@pytest.mark.kernel
def test_one_familys_failure_leaves_the_other_family_synced(netns: str) -> None:
    be, state, kernel = backend(netns, (IPFamily.IPv4, IPFamily.IPv6))

    def dual(port: int) -> list[dict[str, Any]]:
        svc = service("web", "10.96.0.10", port, secondary_cluster_ip="fd00:96::10")
        v4 = endpoint_slice("web", [endpoint("10.128.0.5", NODE)], port=8080)
        v6 = endpoint_slice(
            "web", [endpoint("fd00:128::5", NODE)], port=8080, name="v6", address_type="IPv6"
        )
        return [svc, v4, v6]

    load(state, dual(80))
    be.sync(state.checkout(full=True))
    v6_before = exact(netns, "ip6tables-save")

    load(state, dual(81))
    kernel.arm(1, IPFamily.IPv6)
    with pytest.raises(BackendError) as refused:
        be.sync(state.checkout())
    assert any("10.96.0.10/32" in ln and "--dport 81 " in ln for ln in exact(netns))
    assert exact(netns, "ip6tables-save") == v6_before
    assert refused.value.families == (IPFamily.IPv6,)
    assert str(refused.value).startswith("IPv6: ip6tables-restore")
