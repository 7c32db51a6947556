"""The nftables backend over an in-memory nftables (``FakeNftables``), set up as upstream's fake
proxier is: node "test-node" (192.168.0.2), clusterCIDR 10.0.0.0/8, nodePortAddresses
192.168.0.2/32 + 2001:db8::1/128, ServiceCIDRs 172.30.0.0/16 and fd00:10:96::/112; and the
comparison of tables after upstream's own normalization (sortNFTablesTransaction)."""

from __future__ import annotations

import difflib
import re
import subprocess
import unittest.mock
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import kubeplex.backends.nftables as backend_module
from kits import render_kit
from kits.render_kit import (
    NODE_IP,
    V4,
    V6,
    RenderHarness,
    assert_golden_file,
    endpoint_slice,
    ep,
    port,
    service,
    service_cidr,
)
from kubeplex.backends.nftables import NftablesBackend
from kubeplex.backends.nftables.kernel import NftKernel
from kubeplex.backends.nftables.render import NftablesRendered
from kubeplex.core.config.kubeproxy import KubeProxyConfiguration
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import BackendContext
from kubeplex.core.model.errors import BackendError
from kubeplex.core.model.types import IPFamily
from kubeplex.testing.fakes import FakeNftables

NODE = "test-node"

#: upstream's NewFakeProxier.
UPSTREAM: dict[str, Any] = {
    "mode": "nftables",
    "clusterCIDR": "10.0.0.0/8",
    "nodePortAddresses": [f"{NODE_IP}/32", "2001:db8::1/128"],
}
UPSTREAM_SERVICE_CIDRS = ("172.30.0.0/16", "fd00:10:96::/112")


def config(fields: Mapping[str, Any]) -> KubeProxyConfiguration:
    return render_kit.config(fields, known_modes=plugins.known_modes())


def node_obj(addresses: Sequence[str] = (NODE_IP, "2001:db8::1")) -> dict[str, Any]:
    return render_kit.node_obj(addresses, name=NODE)


class FaultyNftables(FakeNftables):
    """A ``FakeNftables`` that can be told to refuse the next transaction (``refuse``: nft's
    message) or to fail every listing of the table's objects (``fail_listing``)."""

    def __init__(self) -> None:
        super().__init__()
        self.refuse: str | None = None
        self.fail_listing = False

    def run(self, text: str) -> None:
        if self.refuse is not None:
            message, self.refuse = self.refuse, None
            raise BackendError(message)
        super().run(text)

    def list(self, commands: str, terse: bool = False) -> str:
        if self.fail_listing and commands != "list tables\n":
            self.listings.append(commands)
            raise BackendError("nft -t -f - failed (exit 1): simulated")
        return super().list(commands, terse)

    @property
    def table_listings(self) -> int:
        """How often the table's objects were listed (what a full sync reads), tables aside."""
        return sum(commands != "list tables\n" for commands in self.listings)


_ORDER = {"table": 10, "chain": 9, "rule": 8, "set": 7, "map": 6, "element": 5}


def normalized(text: str) -> list[str]:
    """Upstream's sortNFTablesTransaction: drop blank and comment lines, sort by object type
    and name, keep rules of one chain in their order."""
    lines = [ln.strip() for ln in text.splitlines()]
    lines = [ln.replace("0x00004000", "0x4000") for ln in lines if ln and not ln.startswith("#")]

    def key(line: str) -> tuple[int, str, str]:
        w = line.split(" ")
        if len(w) < 5:
            return (0, "", "")
        return (-_ORDER.get(w[1], 0), w[4], "" if w[1] == "rule" else line)

    return sorted(lines, key=key)


def assert_same_table(expected: str, got: str) -> None:
    want, have = normalized(expected), normalized(got)
    if want != have:
        diff = "\n".join(difflib.unified_diff(want, have, "upstream", "kubeplex", lineterm=""))
        pytest.fail(f"tables differ:\n{diff}")


class Harness(RenderHarness[NftablesBackend, NftablesRendered]):
    """ClusterState + NftablesBackend over a FakeNftables: render, apply, inspect."""

    def __init__(
        self,
        objects: Iterable[Mapping[str, Any]] = (),
        cfg: Mapping[str, Any] | KubeProxyConfiguration = UPSTREAM,
        families: tuple[IPFamily, ...] = (V4,),
        node: str = NODE,
        service_cidrs: tuple[str, ...] = UPSTREAM_SERVICE_CIDRS,
        kernel: FaultyNftables | None = None,
    ) -> None:
        self.kernel: FaultyNftables = kernel if kernel is not None else FaultyNftables()
        super().__init__(
            lambda ctx: NftablesBackend(replace(ctx, kernel=self.kernel)),
            objects,
            cfg,
            families,
            node,
            config,
        )
        if service_cidrs:  # upstream's fake proxier's ServiceCIDRs, as a ServiceCIDR object
            self.feed([service_cidr(service_cidrs)])

    def use(self, kernel: FaultyNftables) -> None:
        """Program ``kernel`` from now on (the backend's injected seam)."""
        self.kernel = self.backend.kernel = kernel

    def sync(self, full: bool = False) -> NftablesRendered:
        """Observe, render and apply (the backend's real steps, on the fake kernel)."""
        state = self.cluster.checkout(full=full)
        rendered = self.backend.render(state, self.backend.observe(state))
        self.backend.apply(rendered)
        return rendered

    def dump(self, family: IPFamily = V4) -> str:
        """The family's kube-proxy table as knftables' fake dumps it."""
        return self.kernel.dump("ip6" if family is V6 else "ip", "kube-proxy")


def web_service(i: int, ports: Sequence[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    """ns{i}/web, the i-th Service of many_services() (its cluster IP follows from i)."""
    return service(f"ns{i}", "web", f"172.30.{i // 200}.{i % 200 + 1}", ports, **spec)


def many_services(n: int = 40, endpoints: int = 3) -> list[dict[str, Any]]:
    """The node and ``n`` NodePort Services, each with ``endpoints`` endpoints (the first on
    this node)."""
    out: list[dict[str, Any]] = [node_obj()]
    for i in range(n):
        out.append(web_service(i, [port(node_port=30000 + i)], type="NodePort"))
        out.append(
            endpoint_slice(
                f"ns{i}",
                "web",
                [
                    ep(f"10.{i // 200}.{i % 200}.{j + 1}", NODE if j == 0 else "n2")
                    for j in range(endpoints)
                ],
            )
        )
    return out


#: The nftables goldens (``KUBEPLEX_UPDATE_GOLDEN=1`` rewrites them).
GOLDEN = Path(__file__).resolve().parents[1] / "unit" / "golden" / "nftables"


def render(
    objects: Iterable[Mapping[str, Any]],
    cfg: Mapping[str, Any] = UPSTREAM,
    families: tuple[IPFamily, ...] = (V4,),
) -> NftablesRendered:
    return Harness(objects, cfg, families).render(full=True)


def assert_golden(name: str, rendered: NftablesRendered | str) -> None:
    assert_golden_file(GOLDEN / f"{name}.txt", str(rendered), "rendered transaction differs")


def lines_of(rendered: NftablesRendered | str) -> list[str]:
    return str(rendered).splitlines()


def rules_of(dump: str, chain: str) -> list[str]:
    head = f"add rule ip kube-proxy {chain} "
    return [ln[len(head) :] for ln in dump.splitlines() if ln.startswith(head)]


def elements_of(dump: str, container: str) -> list[str]:
    head = f"add element ip kube-proxy {container} "
    return [ln[len(head) :] for ln in dump.splitlines() if ln.startswith(head)]


def overall_objects() -> list[dict[str, Any]]:
    """TestOverallNFTablesRules: ClusterIP, LB (Local), NodePort, ExternalIP, LB with source
    ranges and affinity, and a Service without endpoints."""
    return render_kit.overall_objects(
        node_obj(),
        NODE,
        sessionAffinity="ClientIP",
        sessionAffinityConfig={"clientIP": {"timeoutSeconds": 10800}},
    )


def commands_of(rendered: NftablesRendered) -> list[str]:
    """The transaction's commands (no blank or comment lines)."""
    return [ln for ln in lines_of(rendered) if ln and not ln.startswith("#")]


def kernel_table(ns: str, family: str = "ip") -> dict[str, list[str]]:
    """``nft list table`` by object, in a form independent of creation order: each chain's
    rules in order, each set's or map's lines with its elements sorted."""
    text = subprocess.run(
        ["ip", "netns", "exec", ns, "nft", "list", "table", family, "kube-proxy"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    objects: dict[str, list[str]] = {}
    current: list[str] = []
    for raw in text.replace(",\n", ", ").splitlines():
        line = raw.strip()
        m = re.match(r"^(chain|set|map) (\S+) \{$", line)
        if m:
            current = objects.setdefault(f"{m.group(1)} {m.group(2)}", [])
        elif line.startswith("elements = {"):
            items = line.removeprefix("elements = {").removesuffix("}").split(", ")
            current.append("elements " + " | ".join(sorted(i.strip() for i in items)))
        elif line not in ("}", "") and not line.startswith("table "):
            current.append(line)
    return objects


def kernel_harness(
    objects: Iterable[Mapping[str, Any]], ns: str, kernel: NftKernel | None = None
) -> Harness:
    """A harness on the real kernel in ``ns`` (through ``kernel``, if given)."""
    h = Harness(objects, families=(V4, V6))
    real = kernel if kernel is not None else NftKernel(ns)
    h.backend = NftablesBackend(BackendContext(h.cfg, NODE, (V4, V6), netns=ns, kernel=real))
    return h


def assert_as_one_nft_transaction(h: Harness, netns: str, netns2: str) -> None:
    """``netns`` holds the tables one nft transaction writes for ``h``'s cluster state (in
    ``netns2``, from scratch, without the netlink path and without stages)."""
    kernel = NftKernel(netns2)
    kernel.use_netlink = False
    fresh = kernel_harness([], netns2, kernel)
    fresh.cluster = h.cluster
    kernel.run("flush ruleset\n")
    with unittest.mock.patch.object(backend_module, "STAGE_MIN_LINES", 10**9):
        fresh.sync(full=True)
    for fam in ("ip", "ip6"):
        assert kernel_table(netns2, fam) == kernel_table(netns, fam), fam
