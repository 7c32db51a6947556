"""The iptables backend on the v2 contract, against the in-memory iptables (no root): observe
reads only for full renders, the observed render holds everything apply sends, apply adds
nothing; metric families and samples; cleanup, leftovers and inspect read the rules back."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pytest
from kits.render_kit import V4, V6, config, endpoint_slice, ep, port, service

import kubeplex.backends.iptables.render as render_module
from kubeplex.backends.iptables import ROUTE_LOCALNET, IptablesBackend, names
from kubeplex.backends.iptables.render import IptablesRendered
from kubeplex.backends.netfilter.iptables import Iptables, SavedRuleset
from kubeplex.core.dataplane.backend import (
    BackendContext,
    MetricEvent,
    NoLocalEndpoints,
    Sample,
)
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.errors import BackendError
from kubeplex.core.model.types import IPFamily, Protocol, ServicePortName
from kubeplex.testing.fakes import FakeIptables

NODE = "node-a"
CFG = config({"clusterCIDR": "10.128.0.0/9"})


class Seam(FakeIptables):
    """The in-memory iptables, counting its reads, and refusing every restore when told."""

    def __init__(self) -> None:
        super().__init__(addresses=("127.0.0.1", "192.168.0.2", "::1"))
        self.saves: list[tuple[IPFamily, str | None, bool]] = []
        self.address_reads = 0
        self.refuse = False

    def save(self, family: IPFamily, table: str | None = None, counters: bool = False) -> str:
        self.saves.append((family, table, counters))
        return super().save(family, table, counters)

    def restore(self, family: IPFamily, text: str) -> None:
        if self.refuse:
            raise BackendError("iptables-restore: line 2 failed")
        super().restore(family, text)

    def interface_addresses(self) -> tuple[str, ...]:
        self.address_reads += 1
        return super().interface_addresses()


def objects(endpoints: int = 1, port_number: int = 80, **spec: Any) -> list[dict[str, Any]]:
    eps = [ep(f"10.128.0.{i + 1}", NODE) for i in range(endpoints)]
    return [
        service("ns", "web", "10.96.0.10", [port(port_number)], **spec),
        endpoint_slice("ns", "web", eps, ports=[port(8080)]),
    ]


WEB = ServicePortName("ns", "web", "p80", Protocol.TCP)


def setup(
    seam: Seam, objs: Iterable[Mapping[str, Any]] = (), families: tuple[IPFamily, ...] = (V4,)
) -> tuple[IptablesBackend, ClusterState]:
    be = IptablesBackend(BackendContext(CFG, NODE, families, kernel=seam))
    be.prepare()
    cluster = ClusterState(NODE, families)
    feed(cluster, objs)
    return be, cluster


def feed(cluster: ClusterState, objs: Iterable[Mapping[str, Any]]) -> None:
    for obj in objs:
        if obj["kind"] == "Service":
            cluster.set_service(obj)
        else:
            cluster.set_endpoint_slice(obj)


def observed(be: IptablesBackend, cluster: ClusterState, full: bool = False) -> IptablesRendered:
    state = cluster.checkout(full=full)
    return be.render(state, be.observe(state))


# --- observe / render / apply -------------------------------------------------------------------


def test_the_real_seam_writes_through_restore() -> None:
    assert Iptables.writes == ("restore",)
    assert isinstance(IptablesBackend(BackendContext(CFG, NODE)).kernel, Iptables)


def test_observe_reads_the_kernel_only_for_a_full_render() -> None:
    seam = Seam()
    be, cluster = setup(seam, objects(), (V4, V6))
    state = cluster.checkout(full=True)
    seen = be.observe(state)
    assert seen is not None and set(seen) == {V4, V6}
    assert seam.address_reads == 1 and [s[0] for s in seam.saves] == [V4, V6]
    be.apply(be.render(state, seen))

    feed(cluster, objects(endpoints=2))
    seam.saves.clear()
    partial = cluster.checkout()
    assert be.observe(partial) is None and not seam.saves
    assert not be.render(partial, None).full


def test_the_observed_render_holds_everything_apply_sends() -> None:
    leftover = "KUBE-SVC-LEFTOVER00000000"
    seam = Seam()
    seam.restore(V4, f"*nat\n:{leftover} - [0:0]\nCOMMIT\n")
    seam.log.clear()
    be, cluster = setup(seam, objects(node_port=30080, type="NodePort"))
    rendered = observed(be, cluster, full=True)
    (plan,) = rendered.plans
    assert leftover in plan.delete
    assert plan.sysctls == ((ROUTE_LOCALNET, "1"),)
    assert plan.prelude["mangle"] == [f":{names.CANARY} - [0:0]"]
    assert any(line.startswith("-I PREROUTING 1 ") for line in plan.prelude["nat"])
    text = str(rendered)
    lines = text.splitlines()
    assert lines[:2] == [
        "# iptables-restore --noflush input (IPv4, full sync)",
        f"# sysctl {ROUTE_LOCALNET}=1",
    ]
    assert f"-X {leftover}" in lines

    be.apply(rendered)
    assert seam.inputs() == list(rendered.kernel_inputs())
    assert "".join(line + "\n" for line in lines[2:]) == "".join(rendered.kernel_inputs())
    assert seam.sysctls == {ROUTE_LOCALNET: "1"}
    assert leftover not in seam.chains(V4, "nat")
    assert names.CANARY in seam.chains(V4, "mangle")
    assert str(rendered) == text  # apply added nothing


def test_without_an_observation_the_render_is_the_plain_one() -> None:
    seam = Seam()
    be, cluster = setup(seam, objects())
    rendered = be.render(cluster.checkout(full=True))
    (plan,) = rendered.plans
    assert not plan.prelude and not plan.sysctls and not seam.saves
    assert list(rendered.kernel_inputs()) == [plan.restore_input()]
    assert str(rendered) == (
        "# iptables-restore --noflush input (IPv4, full sync)\n" + plan.restore_input()
    )


def test_a_partial_render_prints_what_it_sends() -> None:
    seam = Seam()
    be, cluster = setup(seam, objects())
    be.sync(cluster.checkout(full=True))
    seam.log.clear()
    feed(cluster, objects(endpoints=2))
    rendered = observed(be, cluster)
    assert not rendered.full
    be.apply(rendered)
    body = "".join(ln + "\n" for ln in str(rendered).splitlines() if not ln.startswith("#"))
    assert seam.inputs() == [body]
    # Nothing changed: nothing is sent, the print is the header alone.
    quiet = observed(be, cluster)
    assert quiet.kernel_inputs() == []
    assert str(quiet) == "# iptables-restore --noflush input (IPv4, partial sync)\n"


def test_a_large_plan_prints_each_batch() -> None:
    seam = Seam()
    be, cluster = setup(seam, objects(endpoints=30))
    rendered = observed(be, cluster, full=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(render_module, "BATCH_RULES", 20)
        inputs = list(rendered.kernel_inputs())
        text = str(rendered)
        assert len(inputs) > 1
        assert f"# iptables-restore --noflush input 2 of {len(inputs)} (IPv4, full sync)" in text
        assert "".join(ln + "\n" for ln in text.splitlines() if not ln.startswith("#")) == (
            "".join(inputs)
        )


def test_a_refused_restore_fails_its_family_and_the_next_render_is_full() -> None:
    seam = Seam()
    be, cluster = setup(seam, objects(), (V4, V6))
    be.sync(cluster.checkout(full=True))
    feed(cluster, objects(endpoints=2))
    seam.refuse = True
    with pytest.raises(BackendError) as refused:
        be.sync(cluster.checkout())
    assert refused.value.families == (V4,)  # the IPv6 graph has no endpoints: nothing to write
    assert "nothing was written" in str(refused.value)
    seam.refuse = False
    state = cluster.checkout()
    seen = be.observe(state)
    assert seen is not None and set(seen) == {V4}
    assert be.render(state, seen).plans[0].full


# --- metrics ------------------------------------------------------------------------------------


def test_metric_families_are_upstreams() -> None:
    be, _ = setup(Seam())
    fams = {f.name: f for f in be.metric_families()}
    assert list(fams) == [
        "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
        "kubeproxy_iptables_ct_state_invalid_dropped_packets_total",
        "kubeproxy_iptables_localhost_nodeports_accepted_packets_total",
        "kubeproxy_sync_full_proxy_rules_duration_seconds",
        "kubeproxy_sync_partial_proxy_rules_duration_seconds",
        "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total",
        "kubeproxy_sync_proxy_rules_iptables_total",
        "kubeproxy_sync_proxy_rules_iptables_last",
    ]
    on = {name: f.on for name, f in fams.items() if f.on is not MetricEvent.NONE}
    assert on == {
        "kubeproxy_sync_proxy_rules_iptables_restore_failures_total": MetricEvent.SYNC_FAILED,
        "kubeproxy_sync_full_proxy_rules_duration_seconds": MetricEvent.FULL_SYNC_SECONDS,
        "kubeproxy_sync_partial_proxy_rules_duration_seconds": MetricEvent.PARTIAL_SYNC_SECONDS,
        "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total": (
            MetricEvent.PARTIAL_SYNC_FAILED
        ),
    }
    assert [n for n, f in fams.items() if f.scraped] == [
        "kubeproxy_iptables_ct_state_invalid_dropped_packets_total",
        "kubeproxy_iptables_localhost_nodeports_accepted_packets_total",
    ]
    assert fams["kubeproxy_sync_proxy_rules_iptables_total"].labels == ("ip_family", "table")


def test_samples_and_no_local_endpoints_after_a_sync() -> None:
    seam = Seam()
    local = objects(externalTrafficPolicy="Local", type="NodePort", node_port=30080)
    local[1]["endpoints"][0]["nodeName"] = "other"
    be, cluster = setup(seam, local)
    result = be.sync(cluster.checkout(full=True))
    assert result.no_local_endpoints == {V4: NoLocalEndpoints(internal=0, external=1)}
    by_key = {(s.family, s.labels): s for s in result.samples}
    total = by_key[("kubeproxy_sync_proxy_rules_iptables_total", ("IPv4", "nat"))]
    assert total.value == be.renderers[V4].rules_owned["nat"] > 0 and not total.add
    assert ("kubeproxy_sync_proxy_rules_iptables_last", ("IPv4", "filter")) in by_key


def test_scrape_reads_the_nfacct_counters_it_can() -> None:
    seam = Seam()
    be, _ = setup(seam)  # prepare() made both counters
    assert seam.nfacct == {"ct_state_invalid_dropped_pkts": 0, "localhost_nps_accepted_pkts": 0}
    seam.nfacct = {"ct_state_invalid_dropped_pkts": 7}  # the other one unreadable
    assert list(be.scrape()) == [
        Sample("kubeproxy_iptables_ct_state_invalid_dropped_packets_total", (), 7)
    ]


# --- cleanup, leftovers, inspect ----------------------------------------------------------------


#: What kubelet writes on a node: its hint and canary chains, and KUBE-FIREWALL.
KUBELET = (
    "*mangle\n:KUBE-IPTABLES-HINT - [0:0]\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n"
    "*filter\n:KUBE-FIREWALL - [0:0]\n:KUBE-KUBELET-CANARY - [0:0]\n-A INPUT -j KUBE-FIREWALL\n"
    '-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections"'
    " -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP\n"
    "COMMIT\n"
)


def programmed(
    objs: list[dict[str, Any]], kubelet: bool = True, after: str = ""
) -> tuple[IptablesBackend, Seam]:
    """A node where a full sync of ``objs`` ran, with kubelet's chains beside ours (unless
    ``kubelet`` is False) and ``after`` restored once it ran."""
    seam = Seam()
    if kubelet:
        seam.restore(V4, KUBELET)
    be, cluster = setup(seam, objs)
    be.sync(cluster.checkout(full=True))
    if after:
        seam.restore(V4, after)
    seam.log.clear()
    return be, seam


def test_leftovers_and_cleanup_name_every_chain_and_jump_of_the_mode() -> None:
    be, seam = programmed(objects(node_port=30080, type="NodePort"))
    found = be.leftovers()
    assert f"iptables nat chain {names.service_chain(WEB)}" in found
    assert "iptables nat jump PREROUTING -> KUBE-SERVICES" in found
    assert "iptables mangle chain KUBE-PROXY-CANARY" in found
    assert not [line for line in found if "KUBE-FIREWALL" in line]
    report = be.cleanup()
    assert report.mode == "iptables" and list(report.removed) == found
    (text,) = seam.inputs()
    assert f"-X {names.service_chain(WEB)}" in text
    assert "-D INPUT -j KUBE-FIREWALL" not in text and "-X KUBE-FIREWALL" not in text
    assert be.leftovers() == []
    assert seam.chains(V4, "filter") == {
        "INPUT", "FORWARD", "OUTPUT", "KUBE-FIREWALL", "KUBE-KUBELET-CANARY"
    }  # fmt: skip
    assert seam.rules(V4, "filter", "INPUT") == ["-A INPUT -j KUBE-FIREWALL"]
    assert seam.chains(V4, "mangle") >= {"KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"}
    assert ROUTE_LOCALNET not in seam.sysctls or seam.sysctls[ROUTE_LOCALNET] == "1"


def test_without_kubelet_kube_firewall_is_ours_and_goes_with_route_localnet() -> None:
    be, seam = programmed(objects(node_port=30080, type="NodePort"), kubelet=False)
    assert seam.sysctls[ROUTE_LOCALNET] == "1"
    found = be.leftovers()
    assert "iptables filter chain KUBE-FIREWALL" in found
    assert "iptables filter jump INPUT -> KUBE-FIREWALL" in found
    assert "iptables filter jump OUTPUT -> KUBE-FIREWALL" in found
    assert found[-1] == f"sysctl {ROUTE_LOCALNET}=1"
    assert list(be.cleanup().removed) == found
    assert seam.sysctls[ROUTE_LOCALNET] == "0"
    assert "KUBE-" not in seam.save(V4)
    assert be.leftovers() == []


def test_foreign_chains_and_a_shared_kube_firewall_stay() -> None:
    foreign = (
        "*filter\n:KUBE-SVC-NOTOURS0000000 - [0:0]\n:KUBE-MYTHING - [0:0]\n"
        "-A INPUT -s 10.9.9.9/32 -j KUBE-MYTHING\n-A KUBE-MYTHING -j ACCEPT\n"
        # Someone else's rule in KUBE-FIREWALL (a sync declares the chain: it flushes it).
        '-A KUBE-FIREWALL -m comment --comment "kubernetes firewall for dropping marked packets"'
        " -m mark --mark 0x8000/0x8000 -j DROP\nCOMMIT\n"
        "*nat\n:KUBE-MYNAT - [0:0]\n-A PREROUTING -d 10.9.9.9/32 -j KUBE-MYNAT\nCOMMIT\n"
    )
    be, seam = programmed(objects(), kubelet=False, after=foreign)
    assert not [ln for ln in be.leftovers() if "FIREWALL" in ln and "PROXY" not in ln]
    before = seam.save(V4)
    be.cleanup()
    after = seam.save(V4)
    for line in before.splitlines():
        if any(
            w in line for w in ("MYTHING", "MYNAT", "NOTOURS", " KUBE-FIREWALL", ":KUBE-FIREWALL")
        ):
            assert line in after.splitlines(), line
    assert "-A OUTPUT -j KUBE-FIREWALL" in after and seam.sysctls[ROUTE_LOCALNET] == "1"
    assert be.leftovers() == []


def test_cleanup_keeps_what_the_active_mode_names() -> None:
    be, seam = programmed(objects(node_port=30080, type="NodePort"), kubelet=False)
    found = be.leftovers()
    keep = {
        "iptables nat chain KUBE-SERVICES",
        "iptables nat chain KUBE-MARK-MASQ",
        "iptables nat chain KUBE-POSTROUTING",
        "iptables nat jump POSTROUTING -> KUBE-POSTROUTING",
        f"sysctl {ROUTE_LOCALNET}=1",
    }
    report = be.cleanup(keep=keep)
    assert not set(report.removed) & keep
    # The guard stays with the route_localnet it guards; jumps into kept chains stay; the
    # kept chain's own jumps into chains that go, go with them.
    assert set(report.removed) == set(found) - keep - {
        "iptables filter chain KUBE-FIREWALL",
        "iptables filter jump INPUT -> KUBE-FIREWALL",
        "iptables filter jump OUTPUT -> KUBE-FIREWALL",
        "iptables nat jump PREROUTING -> KUBE-SERVICES",
        "iptables nat jump OUTPUT -> KUBE-SERVICES",
    } | {
        f"iptables nat jump KUBE-SERVICES -> {names.service_chain(WEB)}",
        "iptables nat jump KUBE-SERVICES -> KUBE-NODEPORTS",
    }
    assert seam.sysctls[ROUTE_LOCALNET] == "1"
    nat = seam.save(V4, "nat")
    assert ":KUBE-SERVICES" in nat and "-A PREROUTING" in nat and "KUBE-SVC-" not in nat
    assert "-A KUBE-MARK-MASQ -j MARK" in nat
    left = be.leftovers()
    assert set(left) == (keep | {
        "iptables filter chain KUBE-FIREWALL",
        "iptables filter jump INPUT -> KUBE-FIREWALL",
        "iptables filter jump OUTPUT -> KUBE-FIREWALL",
        "iptables nat jump PREROUTING -> KUBE-SERVICES",
        "iptables nat jump OUTPUT -> KUBE-SERVICES",
    })  # fmt: skip


def test_nothing_to_clean_up() -> None:
    seam = Seam()
    be, _ = setup(seam)
    assert be.leftovers() == [] and be.cleanup().removed == () and not seam.log


def test_inspect_reads_the_shares_targets_and_counters() -> None:
    be, seam = programmed(
        objects(
            endpoints=3,
            sessionAffinity="ClientIP",
            sessionAffinityConfig={"clientIP": {"timeoutSeconds": 300}},
        )
    )
    for chain in seam.chains(V4, "nat"):
        if chain.startswith(("KUBE-SEP-", "KUBE-SERVICES")):
            for rule in seam.rules(V4, "nat", chain):
                seam.set_counters(V4, "nat", rule, packets=5, bytes=300)
    (found,) = be.inspect(WEB) or []
    assert found.service == "ns/web:p80" and found.family is V4
    assert [e.target for e in found.endpoints] == [f"10.128.0.{i}:8080" for i in (1, 2, 3)]
    assert [e.share for e in found.endpoints] == pytest.approx([1 / 3] * 3, abs=1e-6)
    assert [(e.packets, e.bytes) for e in found.endpoints] == [(5, 300)] * 3
    assert found.masquerade and found.affinity_seconds == 300
    assert found.packets == 5 * len(found.entries) and found.entries
    assert found.objects[0] == names.service_chain(WEB) and len(found.objects) == 4
    assert (V4, "nat", True) in seam.saves
    other = ServicePortName("ns", "other", "p80", Protocol.TCP)
    assert be.inspect(other) == []


def test_saved_ruleset_parses_counters() -> None:
    text = (
        "*nat\n:PREROUTING ACCEPT [3:180]\n:KUBE-X - [0:0]\n"
        "[3:180] -A PREROUTING -j KUBE-X\nCOMMIT\n"
    )
    saved = SavedRuleset.parse(text)
    assert saved.chains["nat"] == {"PREROUTING", "KUBE-X"}
    assert saved.rules["nat"] == ["-A PREROUTING -j KUBE-X"]
    assert saved.counted("nat") == [("-A PREROUTING -j KUBE-X", (3, 180))]
