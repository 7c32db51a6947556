"""Large plans are applied in batches; the kernel must end up exactly as with one restore."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from kubeplex.backends.iptables import IptablesBackend, render
from kubeplex.backends.iptables.render import IptablesRendered
from kubeplex.core.backend import BackendContext
from kubeplex.core.cluster import ClusterState
from kubeplex.core.config import parse_config
from kubeplex.core.model import IPFamily

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
