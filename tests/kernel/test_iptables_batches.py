"""Large plans are applied in batches; the kernel must end up exactly as with one restore.
A refused input (the kernel refuses a rule added to it) leaves exactly the previous rules."""

from __future__ import annotations

import copy
import re
import subprocess
from typing import Any

import pytest
from cli_kit import in_netns

from kubeplex.backends.iptables import IptablesBackend, render
from kubeplex.backends.iptables.render import IptablesRendered
from kubeplex.backends.netfilter import iptables
from kubeplex.backends.netfilter.iptables import IptablesKernel
from kubeplex.core.config.kubeproxy import parse_config
from kubeplex.core.dataplane.backend import BackendContext
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.errors import BackendError
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


def backend(netns: str) -> tuple[IptablesBackend, ClusterState]:
    state = ClusterState(NODE, families=(IPFamily.IPv4,))
    be = IptablesBackend(BackendContext(CONFIG, NODE, families=(IPFamily.IPv4,), netns=netns))
    be.prepare()
    return be, state


@pytest.mark.kernel
def test_batched_full_and_partial_syncs_equal_one_restore(
    netns: str, netns2: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    batched_ns, single_ns = netns, netns2
    batched, state = backend(batched_ns)
    load(state, objects(300))
    rendered = batched.render(state.checkout(full=True))
    assert isinstance(rendered, IptablesRendered)
    plan = rendered.plans[0]
    assert plan.rule_count > 9000
    assert len(plan.batches()) >= 4  # really split: service batches, then the fixed chains
    batched.apply(rendered)

    single, single_state = backend(single_ns)
    load(single_state, objects(300))
    one = single.render(single_state.checkout(full=True))
    assert isinstance(one, IptablesRendered)
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
    partial = batched.render(state.checkout())
    assert isinstance(partial, IptablesRendered) and not partial.full
    monkeypatch.setattr(render, "BATCH_RULES", 5)
    assert len(partial.plans[0].batches()) >= 2
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


def refuse_input(monkeypatch: pytest.MonkeyPatch, number: int, cmd: str) -> list[str]:
    """The ``number``-th restore input of ``cmd`` gets a rule that jumps to no chain in its
    last table: the kernel refuses that table. Returns the inputs as they were sent."""
    real = IptablesKernel.restore
    sent: list[str] = []

    def restore(self: IptablesKernel, text: str) -> None:
        if self.restore_cmd == cmd:
            sent.append(text)
            if len(sent) == number:
                head, commit, tail = text.rpartition("COMMIT\n")
                text = f"{head}-A KUBE-MARK-MASQ -j KUBEPLEX-NO-SUCH-CHAIN\n{commit}{tail}"
        real(self, text)

    monkeypatch.setattr(IptablesKernel, "restore", restore)
    return sent


@pytest.mark.kernel
@pytest.mark.parametrize("full", [True, False], ids=["full", "partial"])
def test_a_refused_batch_leaves_exactly_the_previous_rules(
    netns: str, monkeypatch: pytest.MonkeyPatch, full: bool
) -> None:
    be, state = backend(netns)
    load(state, objects(300))
    be.apply(be.render(state.checkout(full=True)))
    before = exact(netns)

    load(state, renumbered(objects(300)))
    rendered = be.render(state.checkout(full=full))
    assert isinstance(rendered, IptablesRendered) and rendered.full is full
    plan = rendered.plans[0]
    monkeypatch.setattr(render, "BATCH_RULES", plan.rule_count // 4 + 1)
    monkeypatch.setattr(iptables, "BATCH_RULES", plan.rule_count // 4 + 1)  # the rollback's
    assert len(plan.batches(existing_nat=set(be._renderers[IPFamily.IPv4].applied_nat))) == 5
    sent = refuse_input(monkeypatch, 3, "iptables-restore")
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
    be.invalidate()
    be.apply(be.render(state.checkout(full=True)))
    assert any("--dport 81 " in ln for ln in exact(netns))
    assert not any("--dport 80 " in ln for ln in exact(netns))


@pytest.mark.kernel
def test_a_refused_nat_table_rolls_back_the_filter_table(
    netns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """iptables-restore commits table by table: a refused *nat leaves *filter written."""
    be, state = backend(netns)
    load(state, objects(3))
    be.apply(be.render(state.checkout(full=True)))
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
    rendered = be.render(state.checkout())
    assert isinstance(rendered, IptablesRendered) and not rendered.full
    plan = rendered.plans[0]
    assert plan.filter and plan.nat and len(plan.batches()) == 1
    refuse_input(monkeypatch, 1, "iptables-restore")
    with pytest.raises(BackendError) as refused:
        be.apply(rendered)
    assert exact(netns) == before
    assert "rolled back, the previous rules are in place" in str(refused.value)


@pytest.mark.kernel
def test_a_refused_first_table_is_reported_as_nothing_written(
    netns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    be, state = backend(netns)
    load(state, objects(3))
    be.apply(be.render(state.checkout(full=True)))
    before = exact(netns)
    load(state, objects(3, moved=1))  # nat only
    rendered = be.render(state.checkout())
    assert isinstance(rendered, IptablesRendered) and not rendered.plans[0].filter
    refuse_input(monkeypatch, 1, "iptables-restore")
    with pytest.raises(BackendError, match="nothing was written, the previous rules are in"):
        be.apply(rendered)
    assert exact(netns) == before


@pytest.mark.kernel
def test_a_first_sync_refused_midway_leaves_no_chain_behind(
    netns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rolled back to nothing: the chains and the jumps the sync created are gone (the
    empty tables iptables-nft made stay: iptables-restore cannot delete a table)."""
    be, state = backend(netns)
    load(state, objects(300))
    rendered = be.render(state.checkout(full=True))
    refuse_input(monkeypatch, 3, "iptables-restore")
    with pytest.raises(BackendError) as refused:
        be.apply(rendered)
    assert [ln for ln in exact(netns) if "KUBE-" in ln or ln.startswith("-A")] == []
    assert re.search(r"(?s)input 3 of .*rolled back", str(refused.value))


@pytest.mark.kernel
def test_one_familys_failure_leaves_the_other_family_synced(
    netns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    families = (IPFamily.IPv4, IPFamily.IPv6)
    be = IptablesBackend(BackendContext(CONFIG, NODE, families=families, netns=netns))
    be.prepare()
    state = ClusterState(NODE, families=families)

    def dual(port: int) -> list[dict[str, Any]]:
        svc = service("web", "10.96.0.10", port, secondary_cluster_ip="fd00:96::10")
        v4 = endpoint_slice("web", [endpoint("10.128.0.5", NODE)], port=8080)
        v6 = endpoint_slice(
            "web", [endpoint("fd00:128::5", NODE)], port=8080, name="v6", address_type="IPv6"
        )
        return [svc, v4, v6]

    load(state, dual(80))
    be.apply(be.render(state.checkout(full=True)))
    v6_before = exact(netns, "ip6tables-save")

    load(state, dual(81))
    rendered = be.render(state.checkout())
    refuse_input(monkeypatch, 1, "ip6tables-restore")
    with pytest.raises(BackendError) as refused:
        be.apply(rendered)
    assert any("10.96.0.10/32" in ln and "--dport 81 " in ln for ln in exact(netns))
    assert exact(netns, "ip6tables-save") == v6_before
    assert refused.value.families == (IPFamily.IPv6,)
    assert str(refused.value).startswith("IPv6: ip6tables-restore")
