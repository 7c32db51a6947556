"""The nftables backend's hooks on the real kernel (root, a throw-away namespace): what a
render prints is what the kernel receives, cleanup and leftovers, and inspect."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from typing import Any

import pytest
from kits.nftables_kit import NODE, Harness, many_services, node_obj, web_service
from kits.render_kit import V4, V6, endpoint_slice, ep, port

from kubeplex.backends.nftables import NftablesBackend
from kubeplex.backends.nftables.kernel import NftKernel
from kubeplex.core.dataplane.backend import BackendContext
from kubeplex.core.model.types import ServicePortName

pytestmark = pytest.mark.kernel


class Recording:
    """An NftSeam that passes everything to the real kernel and keeps what it was sent."""

    writes = ("run", "run_stages")

    def __init__(self, kernel: NftKernel) -> None:
        self.kernel = kernel
        self.received: list[str] = []

    def run(self, text: str) -> None:
        self.received.append(text)
        self.kernel.run(text)

    def run_stages(self, texts: Sequence[str], empty_tables: bool = True) -> None:
        self.received.extend(texts)
        self.kernel.run_stages(texts, empty_tables)

    def list(self, commands: str, terse: bool = False) -> str:
        return self.kernel.list(commands, terse)


def backend_in(ns: str, objects: list[dict[str, Any]]) -> tuple[Harness, Recording]:
    recording = Recording(NftKernel(ns))
    h = Harness(objects, families=(V4, V6))
    h.backend = NftablesBackend(BackendContext(h.cfg, NODE, (V4, V6), netns=ns, kernel=recording))
    return h, recording


def without_comments(text: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith("#"))


def nft(ns: str, *args: str, text: str | None = None) -> str:
    return subprocess.run(
        ["ip", "netns", "exec", ns, "nft", *args],
        input=text,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def assert_printed_is_sent(h: Harness, recording: Recording, full: bool) -> str:
    state = h.cluster.checkout(full=full)
    rendered = h.backend.render(state, h.backend.observe(state))
    before = len(recording.received)
    h.backend.apply(rendered)
    sent = recording.received[before:]
    assert rendered.full == full and sent
    assert list(rendered.kernel_inputs()) == sent
    assert without_comments(str(rendered)) == "".join(sent)
    return str(rendered)


def test_what_a_render_prints_is_what_the_kernel_receives(netns: str) -> None:
    h, recording = backend_in(netns, many_services(6))
    assert_printed_is_sent(h, recording, full=True)  # the first load
    # Leftovers of an earlier run, found by the next full sync's listing.
    nft(netns, "-f", "-", text="add chain ip kube-proxy service-AAAAAAAA-old/gone/tcp/\n")
    assert_printed_is_sent(h, recording, full=True)
    assert "delete chain ip kube-proxy service-AAAAAAAA-old/gone/tcp/\n" in recording.received[-1]
    h.feed([endpoint_slice("ns2", "web", [ep("10.0.2.9", NODE), ep("10.0.2.8", "n2")])])
    h.cluster.delete_service("ns4", "web")
    assert_printed_is_sent(h, recording, full=False)


def test_a_staged_first_load_prints_its_stages(netns: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import kubeplex.backends.nftables as backend_module

    monkeypatch.setattr(backend_module, "STAGE_LINES", 50)
    monkeypatch.setattr(backend_module, "STAGE_MIN_LINES", 0)
    h, recording = backend_in(netns, many_services(8))
    printed = assert_printed_is_sent(h, recording, full=True)
    assert len(recording.received) > 3
    assert printed.startswith("# nft -f - transaction (first load, stage 1 of ")


def test_cleanup_and_leftovers(netns: str) -> None:
    h, _ = backend_in(netns, many_services(2))
    assert h.backend.leftovers() == []
    assert h.backend.cleanup().removed == ()
    h.backend.sync(h.cluster.checkout())
    nft(netns, "-f", "-", text="add table ip other\nadd table inet kube-proxy\n")
    both = ["nftables table ip kube-proxy", "nftables table ip6 kube-proxy"]
    left = h.backend.leftovers()
    assert [line for line in left if " table " in line] == both
    assert "nftables ip kube-proxy chain services" in left
    assert any(line.startswith("nftables ip kube-proxy chain endpoint-") for line in left)
    report = h.backend.cleanup()
    assert report.mode == "nftables" and list(report.removed) == left
    assert h.backend.leftovers() == []
    tables = nft(netns, "list", "tables")
    assert "table ip other" in tables and "table inet kube-proxy" in tables  # not ours
    assert h.backend.sync(h.cluster.checkout()).full  # programs everything again
    assert h.backend.leftovers() == left


def test_inspect_three_endpoints(netns: str) -> None:
    objects: list[dict[str, Any]] = [
        node_obj(),
        web_service(
            1,
            [port(node_port=30001)],
            type="NodePort",
            sessionAffinity="ClientIP",
            sessionAffinityConfig={"clientIP": {"timeoutSeconds": 600}},
        ),
        endpoint_slice(
            "ns1", "web", [ep("10.0.1.1", NODE), ep("10.0.1.2", "n2"), ep("10.0.1.3", "n2")]
        ),
        web_service(2, [port()]),  # no endpoints
        endpoint_slice("ns2", "web", []),
    ]
    h, _ = backend_in(netns, objects)
    h.backend.sync(h.cluster.checkout())
    (found,) = h.backend.inspect(ServicePortName("ns1", "web", "p80"))
    assert found.family is V4 and found.service == "ns1/web:p80"
    assert sorted(e.target for e in found.endpoints) == [
        "10.0.1.1:80",
        "10.0.1.2:80",
        "10.0.1.3:80",
    ]
    assert all(e.share == pytest.approx(1 / 3) and e.weight == 1 for e in found.endpoints)
    assert found.masquerade and found.affinity_seconds == 600
    entries = " ".join(found.entries)
    assert "172.30.0.2 . tcp . 80 : goto service-" in entries
    assert "tcp . 30001 : goto external-" in entries
    assert any(o.startswith("service-") for o in found.objects)
    assert sum(o.startswith("endpoint-") for o in found.objects) == 3
    assert sum(o.startswith("affinity-") for o in found.objects) == 3
    (empty,) = h.backend.inspect(ServicePortName("ns2", "web", "p80"))
    assert empty.endpoints == () and re.search(
        r'comment "ns2/web:p80" : goto reject-chain', empty.entries[0]
    )
    assert h.backend.inspect(ServicePortName("ns9", "web", "p80")) == []


def test_list_tables_over_netlink_is_what_nft_prints(netns: str) -> None:
    kernel = NftKernel(netns)
    assert kernel.list("list tables\n") == ""
    nft(
        netns,
        "-f",
        "-",
        text="add table ip kube-proxy\nadd table inet foreign\nadd table ip6 kube-proxy\n"
        "add table bridge b\nadd table netdev n\nadd table arp a\n",
    )
    by_nft = nft(netns, "list", "tables")
    assert kernel.list("list tables\n") == by_nft
    assert kernel._netlink is not None  # answered over netlink, not by nft
    kernel.use_netlink = False
    assert kernel.list("list tables\n") == by_nft
    kernel.close()
