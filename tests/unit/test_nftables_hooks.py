# ruff: noqa: E501 - LISTING holds nft's own long lines
"""The nftables backend on contract v2, without root: what observe reads, what the plan holds
with and without an observation, the transactions apply sends, the metric families, and the
hooks beside the sync path (cleanup, leftovers, inspect) over a fake kernel."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from kits.nftables_kit import NODE, FaultyNftables, Harness, many_services
from kits.render_kit import V4, V6, endpoint_slice, ep

from kubeplex.backends.nftables import (
    CLEANUP_FAILURES,
    SYNC_FAILURES,
    NftablesBackend,
    NftObserved,
)
from kubeplex.backends.nftables.inspection import programmed
from kubeplex.backends.nftables.kernel import NftKernel
from kubeplex.backends.nftables.listing import kube_proxy_tables, parse_duration, parse_table
from kubeplex.core.dataplane.backend import (
    EndpointView,
    MetricEvent,
    NoLocalEndpoints,
    ProgrammedService,
    Sample,
)
from kubeplex.core.model.errors import BackendError
from kubeplex.core.model.types import ServicePortName
from kubeplex.testing.fakes import FakeNftables

WEB1 = ServicePortName("ns1", "web", "p80")


def observed_sync(h: Harness, full: bool = False) -> tuple[NftObserved, str]:
    state = h.cluster.checkout(full=full)
    observed = h.backend.observe(state)
    return observed, str(h.backend.render(state, observed))


def test_the_kernel_seam_names_its_writes() -> None:
    assert NftKernel.writes == ("run", "run_stages")
    h = Harness()
    assert h.backend.kernel is h.kernel
    backend = NftablesBackend(replace(h.backend.ctx, kernel=None, netns="ns-x"))
    assert isinstance(backend.kernel, NftKernel) and backend.kernel.netns == "ns-x"


def test_observe_lists_on_full_syncs_only() -> None:
    h = Harness(many_services(3), families=(V4, V6))
    first = h.backend.observe(h.cluster.checkout())
    assert first.listed == ("ip", "ip6") and first.tables == {}  # no tables yet
    assert h.kernel.table_listings == 1
    h.sync()
    assert h.kernel.table_listings == 2
    h.feed([endpoint_slice("ns1", "web", [ep("10.0.1.7", NODE)])])
    partial = h.backend.observe(h.cluster.checkout())
    assert partial.listed == () and h.kernel.table_listings == 2
    full = h.backend.observe(h.cluster.checkout(full=True))
    assert full.listed == ("ip", "ip6") and full.tables is not None
    assert "services" in full.tables["ip"].chains


def test_without_an_observation_the_render_is_the_bare_transaction() -> None:
    h = Harness(many_services(3))
    h.sync()
    h.kernel.run("add chain ip kube-proxy service-AAAAAAAA-old/gone/tcp/\n")
    bare = str(h.render(full=True))
    assert "old/gone" not in bare
    _, observed = observed_sync(h, full=True)
    assert "delete chain ip kube-proxy service-AAAAAAAA-old/gone/tcp/" in observed
    # The observed plan's only difference is what the kernel listing added.
    extra = set(observed.splitlines()) - set(bare.splitlines())
    assert extra == {
        "flush chain ip kube-proxy service-AAAAAAAA-old/gone/tcp/",
        "delete chain ip kube-proxy service-AAAAAAAA-old/gone/tcp/",
    }


def test_pending_chain_deletes_are_the_first_transaction() -> None:
    h = Harness(many_services(3))
    h.sync()
    h.backend.renderers[V4].pending_chain_deletes = {"endpoint-GONE"}
    h.kernel.run("add chain ip kube-proxy endpoint-GONE\n")
    state = h.cluster.checkout(full=True)
    assert "endpoint-GONE" not in str(h.backend.render(state))  # no observation: not there
    h.backend.invalidate()
    rendered = h.backend.render(state, h.backend.observe(state))
    inputs = rendered.kernel_inputs()
    assert inputs[0] == "delete chain ip kube-proxy endpoint-GONE\n" and len(inputs) == 2
    assert "endpoint-GONE" not in inputs[1]  # not a leftover of this sync: deleted first
    assert str(rendered).startswith("# nft -f - transaction (chains left by earlier syncs)\n")
    h.backend.apply(rendered)
    assert "endpoint-GONE" not in h.kernel.tables["ip", "kube-proxy"].chains
    assert h.backend.renderers[V4].pending_chain_deletes == set()


def test_a_failed_listing_is_observed_and_counted_once() -> None:
    h = Harness(many_services(3), families=(V4, V6))
    h.sync()
    h.kernel.fail_listing = True
    state = h.cluster.checkout(full=True)
    observed = h.backend.observe(state)
    assert observed.tables is None and observed.listed == ("ip", "ip6")
    result = h.backend.sync(state)
    assert set(result.samples) == {
        Sample(CLEANUP_FAILURES, ("IPv4",), 1, add=True),
        Sample(CLEANUP_FAILURES, ("IPv6",), 1, add=True),
    }
    h.kernel.fail_listing = False
    assert h.backend.sync(h.cluster.checkout(full=True)).samples == ()


def test_results_are_typed() -> None:
    objects = many_services(2)
    objects.append(
        {
            **objects[1],
            "spec": {**objects[1]["spec"], "type": "NodePort", "externalTrafficPolicy": "Local"},
        }
    )
    h = Harness(objects, families=(V4, V6))
    h.feed([endpoint_slice("ns0", "web", [ep("10.0.0.2", "n2")])])
    result = h.backend.sync(h.cluster.checkout())
    assert result.no_local_endpoints == {
        V4: NoLocalEndpoints(internal=0, external=1),
        V6: NoLocalEndpoints(internal=0, external=0),
    }


def test_metric_families_are_upstreams() -> None:
    h = Harness()
    families = {f.name: f for f in h.backend.metric_families()}
    assert set(families) == {SYNC_FAILURES, CLEANUP_FAILURES}
    assert SYNC_FAILURES == "kubeproxy_sync_proxy_rules_nftables_sync_failures_total"
    assert CLEANUP_FAILURES == "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total"
    assert families[SYNC_FAILURES].on is MetricEvent.SYNC_FAILED
    assert families[CLEANUP_FAILURES].on is MetricEvent.NONE
    assert all(f.kind == "counter" and f.labels == ("ip_family",) for f in families.values())


def test_sync_periods_are_the_nftables_sections() -> None:
    h = Harness(cfg={"mode": "nftables", "nftables": {"syncPeriod": "7s", "minSyncPeriod": "2s"}})
    assert h.backend.sync_periods() == (7.0, 2.0)


def test_cleanup_reports_only_the_tables_that_existed() -> None:
    h = Harness(many_services(2), families=(V4, V6))
    assert h.backend.leftovers() == []
    assert h.backend.cleanup().removed == ()
    h.sync()
    h.kernel.tables.pop(("ip6", "kube-proxy"))
    h.kernel.run("add table ip other\n")
    # The ip table and what it holds; not the table of another program in the same family.
    left = h.backend.leftovers()
    assert left[0] == "nftables table ip kube-proxy"
    assert len(left) > 1 and all(line.startswith("nftables ip kube-proxy ") for line in left[1:])
    report = h.backend.cleanup()
    assert report.mode == "nftables" and report.removed == tuple(left)
    assert set(h.kernel.tables) == {("ip", "other")} and h.backend.leftovers() == []


def test_cleanup_keeps_a_table_the_active_mode_names() -> None:
    h = Harness(many_services(2), families=(V4, V6))
    h.sync()
    keep = {"nftables table ip6 kube-proxy", "iptables nat chain KUBE-SERVICES"}
    report = h.backend.cleanup(keep=keep)
    assert report.removed and all(" ip kube-proxy" in line for line in report.removed)
    assert set(h.kernel.tables) == {("ip6", "kube-proxy")}
    assert h.backend.leftovers()[0] == "nftables table ip6 kube-proxy"


def test_cleanup_fails_when_nft_does() -> None:
    class Broken(FaultyNftables):
        def list(self, commands: str, terse: bool = False) -> str:
            raise BackendError("nft: not installed")

    h = Harness(kernel=Broken())
    with pytest.raises(BackendError, match="not installed"):
        h.backend.cleanup()


# --- reading a table back ---------------------------------------------------------------------

#: What nft 1.0.6 lists for a Service with affinity and three endpoints (the last one has
#: two of the four slots), and one without endpoints.
LISTING = """table ip kube-proxy {
\tcomment "rules for kube-proxy"
\tset affinity-AAAA-ns1/web/tcp/p80__10.0.1.1/80 {
\t\ttype ipv4_addr
\t\tsize 65535
\t\tflags dynamic,timeout
\t\ttimeout 3h
\t}

\tmap service-ips {
\t\ttype ipv4_addr . inet_proto . inet_service : verdict
\t\tcomment "ClusterIP, ExternalIP and LoadBalancer IP traffic"
\t\telements = { 172.30.0.2 . tcp . 80 : goto service-SVC-ns1/web/tcp/p80,
\t\t\t     172.30.0.3 . tcp . 80 : goto service-OTHER-ns2/web/tcp/p80 }
\t}

\tmap no-endpoint-services {
\t\ttype ipv4_addr . inet_proto . inet_service : verdict
\t\telements = { 172.30.0.9 . tcp . 80 comment "ns9/web:p80" : goto reject-chain }
\t}

\tchain endpoint-AAAA-ns1/web/tcp/p80__10.0.1.1/80 {
\t\tip saddr 10.0.1.1 jump mark-for-masquerade
\t\tupdate @affinity-AAAA-ns1/web/tcp/p80__10.0.1.1/80 { ip saddr }
\t\tmeta l4proto tcp dnat to 10.0.1.1:80
\t}

\tchain endpoint-BBBB-ns1/web/tcp/p80__10.0.1.2/80 {
\t\tcounter packets 5 bytes 300
\t\tmeta l4proto tcp dnat to 10.0.1.2:80
\t}

\tchain endpoint-CCCC-ns1/web/tcp/p80__10.0.1.3/80 {
\t\tmeta l4proto tcp dnat to 10.0.1.3:80
\t}

\tchain service-SVC-ns1/web/tcp/p80 {
\t\tip saddr @affinity-AAAA-ns1/web/tcp/p80__10.0.1.1/80 goto endpoint-AAAA-ns1/web/tcp/p80__10.0.1.1/80
\t\tnumgen random mod 4 vmap { 0 : goto endpoint-AAAA-ns1/web/tcp/p80__10.0.1.1/80, 1 : goto endpoint-BBBB-ns1/web/tcp/p80__10.0.1.2/80, 2 : goto endpoint-CCCC-ns1/web/tcp/p80__10.0.1.3/80, 3 : goto endpoint-CCCC-ns1/web/tcp/p80__10.0.1.3/80 }
\t}
}
"""


def test_table_listing_parser() -> None:
    table = parse_table(LISTING)
    assert table.sets["service-ips"].elements == [
        "172.30.0.2 . tcp . 80 : goto service-SVC-ns1/web/tcp/p80",
        "172.30.0.3 . tcp . 80 : goto service-OTHER-ns2/web/tcp/p80",
    ]
    assert table.sets["affinity-AAAA-ns1/web/tcp/p80__10.0.1.1/80"].timeout == 10800
    assert table.chains["endpoint-CCCC-ns1/web/tcp/p80__10.0.1.3/80"] == [
        "meta l4proto tcp dnat to 10.0.1.3:80"
    ]
    assert [parse_duration(t) for t in ("3h", "1d2h3m4s", "10800s", "500ms", "x")] == [
        10800,
        93784,
        10800,
        0,
        None,
    ]
    assert kube_proxy_tables("table ip nat\ntable ip kube-proxy\ntable inet kube-proxy\n") == ["ip"]


def test_inspect_reads_entries_endpoints_and_objects(monkeypatch: pytest.MonkeyPatch) -> None:
    import kubeplex.backends.nftables.inspection as inspection

    bases = {WEB1: "SVC-ns1/web/tcp/p80"}
    monkeypatch.setattr(inspection.names, "service_base", lambda spn: bases.get(spn, "X-y"))
    found = programmed(WEB1, V4, LISTING)
    assert found is not None
    assert found.service == "ns1/web:p80" and found.family is V4
    assert found.entries == (
        "element ip kube-proxy service-ips"
        " { 172.30.0.2 . tcp . 80 : goto service-SVC-ns1/web/tcp/p80 }",
    )
    assert found.endpoints == (
        EndpointView("10.0.1.1:80", share=0.25, weight=1),
        EndpointView("10.0.1.2:80", share=0.25, weight=1, packets=5, bytes=300),
        EndpointView("10.0.1.3:80", share=0.5, weight=2),
    )
    assert found.masquerade and found.affinity_seconds == 10800 and found.packets is None
    assert found.objects == (
        "service-SVC-ns1/web/tcp/p80",
        "endpoint-AAAA-ns1/web/tcp/p80__10.0.1.1/80",
        "endpoint-BBBB-ns1/web/tcp/p80__10.0.1.2/80",
        "endpoint-CCCC-ns1/web/tcp/p80__10.0.1.3/80",
        "affinity-AAAA-ns1/web/tcp/p80__10.0.1.1/80",
    )
    # A Service without endpoints is found by its element's comment.
    (none,) = [programmed(ServicePortName("ns9", "web", "p80"), V4, LISTING)]
    assert none is not None and none.endpoints == () and len(none.entries) == 1
    assert programmed(ServicePortName("ns5", "web", "p80"), V4, LISTING) is None


def test_inspect_per_family_over_the_seam() -> None:
    class Listing(FaultyNftables):
        def list(self, commands: str, terse: bool = False) -> str:
            if commands == "list tables\n":
                return "table ip kube-proxy\n"
            assert commands == "list table ip kube-proxy\n", commands
            return LISTING

    h = Harness(families=(V4, V6), kernel=Listing())
    assert h.backend.inspect(WEB1) == []  # (the real names' hash is not "SVC")
    assert h.backend.inspect(ServicePortName("ns9", "web", "p80")) == [
        programmed(ServicePortName("ns9", "web", "p80"), V4, LISTING)
    ]


# --- over kubeplex.testing.fakes.FakeNftables ---------------------------------------------------


def on_fake(objects: list[dict[str, Any]]) -> tuple[Harness, FakeNftables]:
    fake = FakeNftables()
    h = Harness(objects, families=(V4, V6))
    h.backend = NftablesBackend(replace(h.backend.ctx, kernel=fake))
    return h, fake


def test_the_printed_plan_is_what_the_fake_kernel_receives() -> None:
    h, fake = on_fake(many_services(5))

    def step(full: bool) -> str:
        state = h.cluster.checkout(full=full)
        rendered = h.backend.render(state, h.backend.observe(state))
        before = len(fake.inputs())
        h.backend.apply(rendered)
        sent = fake.inputs()[before:]
        assert sent == list(rendered.kernel_inputs()) and sent
        printed = "".join(ln for ln in str(rendered).splitlines(True) if not ln.startswith("#"))
        assert printed == "".join(sent)
        return sent[-1]

    step(full=True)
    fake.run("add chain ip kube-proxy service-AAAAAAAA-old/gone/tcp/\n")
    assert "delete chain ip kube-proxy service-AAAAAAAA-old/gone/tcp/\n" in step(full=True)
    h.feed([endpoint_slice("ns2", "web", [ep("10.0.2.9", NODE)])])
    h.cluster.delete_service("ns4", "web")
    assert "10.0.2.9" in step(full=False)


def test_cleanup_leftovers_and_inspect_on_the_fake() -> None:
    h, fake = on_fake(many_services(3))
    assert h.backend.leftovers() == [] and h.backend.inspect(WEB1) == []
    h.backend.sync(h.cluster.checkout())
    (found,) = h.backend.inspect(WEB1)
    assert sorted(e.target for e in found.endpoints) == [
        "10.0.1.1:80",
        "10.0.1.2:80",
        "10.0.1.3:80",
    ]
    assert all(e.share == pytest.approx(1 / 3) for e in found.endpoints)
    assert found.masquerade and found.affinity_seconds is None
    assert any("172.30.0.2 . tcp . 80 : goto service-" in e for e in found.entries)
    both = ["nftables table ip kube-proxy", "nftables table ip6 kube-proxy"]
    left = h.backend.leftovers()
    assert [line for line in left if " table " in line] == both
    # Every object of the Service is named, in the words of the cleanup report.
    assert {f"nftables ip kube-proxy {kind} {name}" for kind, name in _kinds(found)} <= set(left)
    assert list(h.backend.cleanup().removed) == left
    assert h.backend.leftovers() == [] and h.backend.cleanup().removed == ()
    assert fake.list("list tables") == ""


def _kinds(found: ProgrammedService) -> list[tuple[str, str]]:
    """(kind, name) of a programmed service's objects: affinity sets, else chains."""
    return [("set" if n.startswith("affinity-") else "chain", n) for n in found.objects]
