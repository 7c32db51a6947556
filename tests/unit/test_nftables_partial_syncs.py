"""The nftables backend's partial and full syncs over ``FakeNftables``: what a change
rewrites, what a full sync finds and removes, refused transactions and deletions the kernel
puts off, ServiceCIDRs, the dual-stack transaction.
"""

from __future__ import annotations

from typing import Any

import pytest
from kits.nftables_kit import (
    NODE,
    FaultyNftables,
    Harness,
    assert_golden,
    assert_same_table,
    commands_of,
    elements_of,
    many_services,
    node_obj,
    web_service,
)
from kits.render_kit import V4, V6, endpoint_slice, ep, port, service_cidr

from kubeplex.backends.nftables import names as N
from kubeplex.backends.nftables.listing import parse_listing
from kubeplex.core.model.errors import BackendError
from kubeplex.core.model.types import IPFamily


def test_one_endpoint_change_touches_only_that_service() -> None:
    h = Harness(many_services())
    h.sync()
    before = h.dump()
    h.feed(
        [
            endpoint_slice(
                "ns7", "web", [ep("10.0.7.1", NODE), ep("10.0.7.2", "n2"), ep("10.0.7.9", "n2")]
            )
        ]
    )
    r = h.sync()
    assert not r.full
    cmds = commands_of(r)
    assert cmds and all("-ns7/web/" in line for line in cmds), cmds
    # The service chain, the new endpoint chain; the removed one flushed and deleted.
    assert sum(line.startswith("add chain") for line in cmds) == 2
    assert sum(line.startswith("delete chain") for line in cmds) == 1
    assert not any("element" in line for line in cmds)
    assert_golden("partial-endpoint-change", r)
    # Everything else is as it was.
    after = h.dump()
    unrelated = [ln for ln in before.splitlines() if "ns7/web" not in ln]
    assert all(ln in after for ln in unrelated)


def test_partial_syncs_end_where_a_full_sync_from_scratch_ends() -> None:
    import random

    rnd = random.Random(7)
    objects = many_services(20, 2)
    h = Harness(objects)
    h.sync()
    for step in range(60):
        i = rnd.randrange(20)
        kind = rnd.randrange(5)
        if kind == 0:
            h.feed(
                [
                    endpoint_slice(
                        f"ns{i}",
                        "web",
                        [
                            ep(f"10.0.{i}.{rnd.randrange(1, 6)}", rnd.choice([NODE, "n2"]))
                            for _ in range(rnd.randrange(0, 4))
                        ],
                    )
                ]
            )
        elif kind == 1:
            h.cluster.delete_service(f"ns{i}", "web")
        elif kind == 2:
            spec: dict[str, Any] = {"type": "NodePort"}
            if rnd.random() < 0.5:
                spec["externalTrafficPolicy"] = "Local"
            if rnd.random() < 0.3:
                spec["sessionAffinity"] = "ClientIP"
            if rnd.random() < 0.3:
                spec["internalTrafficPolicy"] = "Local"
            h.feed([web_service(i, [port(node_port=30000 + i)], **spec)])
        elif kind == 3:
            h.feed([web_service(i, [port(), port(81, "p81")], externalIPs=[f"192.168.99.{i}"])])
        else:
            h.feed(objects[1 + 2 * i : 3 + 2 * i])
        r = h.sync()
        assert not r.full, step
        fresh = Harness([])
        fresh.cluster = h.cluster
        fresh.backend.renderers.clear()
        fresh.use(FaultyNftables())
        fresh.sync(full=True)
        assert_same_table(fresh.dump(), h.dump())


def test_failed_apply_leaves_table_and_forces_full_sync() -> None:
    h = Harness(many_services(5))
    h.sync()
    before = h.dump()
    h.feed([endpoint_slice("ns1", "web", [ep("10.0.1.7")])])
    h.kernel.refuse = "nft -f failed: simulated"
    with pytest.raises(BackendError, match="simulated"):
        h.sync()
    assert h.dump() == before
    r = h.sync()  # the core asks for a full sync after a failure; the backend does it anyway
    assert r.full
    assert h.kernel.table_listings == 2  # leftovers are looked for on full syncs only
    assert "10.0.1.7" in h.dump()
    assert not h.sync().full and h.kernel.table_listings == 2


def test_full_sync_removes_leftovers_found_in_the_kernel() -> None:
    h = Harness(many_services(3))
    h.sync()
    # Left by an earlier run: a service chain, an affinity set, an old-version base chain and
    # map that reference each other.
    h.kernel.run(
        "add chain ip kube-proxy service-AAAAAAAA-old/gone/tcp/\n"
        "add set ip kube-proxy affinity-AAAAAAAA-old/gone/tcp/__10.9.9.9/80"
        " { type ipv4_addr ; flags dynamic,timeout ; timeout 10800s ; }\n"
        "add rule ip kube-proxy service-AAAAAAAA-old/gone/tcp/"
        " ip saddr @affinity-AAAAAAAA-old/gone/tcp/__10.9.9.9/80 drop\n"
        "add map ip kube-proxy old-map { type inet_proto . inet_service : verdict ; }\n"
        "add element ip kube-proxy old-map { tcp . 1 : goto service-AAAAAAAA-old/gone/tcp/ }\n"
        "add chain ip kube-proxy filter-prerouting"
        " { type filter hook prerouting priority -110 ; }\n"
        "add rule ip kube-proxy filter-prerouting jump services\n"
    )
    partial = h.sync()
    assert not partial.full and "old/gone" not in str(partial)
    r = h.sync(full=True)
    cmds = commands_of(r)
    assert "delete chain ip kube-proxy service-AAAAAAAA-old/gone/tcp/" in cmds
    assert "delete chain ip kube-proxy filter-prerouting" in cmds
    assert "delete map ip kube-proxy old-map" in cmds
    assert "delete set ip kube-proxy affinity-AAAAAAAA-old/gone/tcp/__10.9.9.9/80" in cmds
    fresh = Harness(many_services(3))
    fresh.sync()
    assert_same_table(fresh.dump(), h.dump())


def test_kernels_that_cannot_delete_at_once_get_the_deletes_later() -> None:
    h = Harness(many_services(3))
    h.sync()
    h.cluster.delete_service("ns1", "web")
    h.kernel.refuse = "Error: Could not process rule: Device or resource busy"
    r = h.sync()  # retried without the chain deletions
    assert not r.full
    t = h.kernel.tables["ip", "kube-proxy"]
    left = {c for c in t.chains if "ns1/web" in c}
    assert left and all(t.chains[c].rules == [] for c in left)
    renderer = h.backend.renderers[V4]
    assert renderer.pending_chain_deletes == left
    h.sync()  # nothing changed: only the pending deletions run
    assert not any("ns1/web" in c for c in h.kernel.tables["ip", "kube-proxy"].chains)
    assert renderer.pending_chain_deletes == set()


def test_periodic_full_sync_rewrites_only_what_changed_or_went_missing() -> None:
    h = Harness(many_services(5), families=(V4, V6))
    first = commands_of(h.sync())
    assert sum(line.startswith("add rule ip kube-proxy endpoint-") for line in first) == 30
    # A full sync with a trustworthy record: the fixed objects and every element again
    # (flushed and refilled), but no unchanged service chain.
    r = h.sync(full=True)
    cmds = commands_of(r)
    assert r.full and not any("/web/" in ln for ln in cmds if "chain" in ln.split()[1])
    assert not any(ln.startswith("add rule") and "/web/" in ln.split()[4] for ln in cmds)
    assert "flush map ip kube-proxy service-ips" in cmds
    assert sum(ln.startswith("add element ip kube-proxy service-ips") for ln in cmds) == 5
    # A chain deleted behind kubeplex's back (and its reference) is found missing and re-added.
    chain = "endpoint-" + N.hash8("ns3/web/tcp/p80__10.0.3.2/80") + "-ns3/web/tcp/p80__10.0.3.2/80"
    svc = "service-" + N.hash8("ns3/web/tcp/p80") + "-ns3/web/tcp/p80"
    h.kernel.run(f"flush chain ip kube-proxy {svc}\ndelete chain ip kube-proxy {chain}\n")
    assert not h.sync().full  # a partial sync trusts its record
    cmds = commands_of(h.sync(full=True))
    assert f"add chain ip kube-proxy {chain}" in cmds
    # The flushed service chain is noticed too (its rules are listed) and written again.
    assert f"flush chain ip kube-proxy {svc}" in cmds
    assert sum(ln.startswith(f"add rule ip kube-proxy {svc} ") for ln in cmds) == 2
    # A table flushed behind kubeplex's back is rebuilt by the next full sync.
    h.kernel.tables.clear()
    h.sync(full=True)
    fresh = Harness(many_services(5), families=(V4, V6))
    fresh.sync()
    for fam in (V4, V6):
        assert_same_table(fresh.dump(fam), h.dump(fam))


def test_full_sync_without_a_record_rewrites_everything() -> None:
    h = Harness(many_services(5))
    h.sync()
    h.backend.invalidate()
    cmds = commands_of(h.sync())
    assert sum(ln.startswith("add rule ip kube-proxy endpoint-") for ln in cmds) == 30


def test_settings_change_forces_full_sync() -> None:
    h = Harness(many_services(2))
    h.sync()
    assert not h.sync().full
    h.feed([{**node_obj(("192.168.0.3", "2001:db8::1")), "metadata": {"name": NODE}}])
    r = h.sync()
    assert r.full
    assert elements_of(h.dump(), "nodeport-ips") == []  # 192.168.0.2/32 matches no address now


def family_rules(dump: str, family: IPFamily, chain: str) -> list[str]:
    head = f"add rule {'ip6' if family is V6 else 'ip'} kube-proxy {chain} "
    return [ln[len(head) :] for ln in dump.splitlines() if ln.startswith(head)]


def reject_invalid_ports(family: IPFamily) -> str:
    ip = "ip6" if family is V6 else "ip"
    return f'{ip} daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"'


def drop_unallocated(family: IPFamily, *cidrs: str) -> str:
    ip = "ip6" if family is V6 else "ip"
    comment = 'comment "Drop traffic to unallocated ClusterIPs"'
    return f"{ip} daddr {{ {' , '.join(cidrs)} }} drop {comment}"


def test_service_cidrs_from_the_cluster_state_drop_unallocated_cluster_ips_per_family() -> None:
    objects = [
        *many_services(2),
        service_cidr(["10.96.0.0/16", "fd00:10:96::/112"]),
        service_cidr(["10.100.0.0/24"], name="extra"),
    ]
    h = Harness(objects, families=(V4, V6), service_cidrs=())
    h.sync()
    assert family_rules(h.dump(V4), V4, "cluster-ips-check") == [
        reject_invalid_ports(V4),
        drop_unallocated(V4, "10.96.0.0/16", "10.100.0.0/24"),
    ]
    assert family_rules(h.dump(V6), V6, "cluster-ips-check") == [
        reject_invalid_ports(V6),
        drop_unallocated(V6, "fd00:10:96::/112"),
    ]
    # A family without a ServiceCIDR of its own gets no drop rule.
    v4_only = Harness([*many_services(1), service_cidr(["fd00:10:96::/112"])], service_cidrs=())
    v4_only.sync()
    assert family_rules(v4_only.dump(), V4, "cluster-ips-check") == [reject_invalid_ports(V4)]


def test_a_service_cidr_change_on_a_partial_sync_backend_rewrites_cluster_ips_check() -> None:
    h = Harness(many_services(3), families=(V4, V6), service_cidrs=())
    h.sync()
    assert not h.sync().full  # settled: partial syncs from here on
    assert family_rules(h.dump(V4), V4, "cluster-ips-check") == [reject_invalid_ports(V4)]

    h.feed([service_cidr(["10.96.0.0/16", "fd00:10:96::/112"])])
    r = h.sync()
    assert r.full and all(plan.full for plan in r.plans)
    assert "flush chain ip kube-proxy cluster-ips-check" in commands_of(r)
    assert "flush chain ip6 kube-proxy cluster-ips-check" in commands_of(r)
    assert family_rules(h.dump(V4), V4, "cluster-ips-check") == [
        reject_invalid_ports(V4),
        drop_unallocated(V4, "10.96.0.0/16"),
    ]
    assert family_rules(h.dump(V6), V6, "cluster-ips-check") == [
        reject_invalid_ports(V6),
        drop_unallocated(V6, "fd00:10:96::/112"),
    ]

    # The same object again (a relist, a touched file): nothing to rewrite.
    h.feed([service_cidr(["10.96.0.0/16", "fd00:10:96::/112"])])
    r = h.sync()
    assert not r.full and not [ln for ln in commands_of(r) if "cluster-ips-check" in ln]

    # Replaced by an IPv4-only range: the IPv6 rule goes, the IPv4 one follows the new range.
    h.feed([service_cidr(["10.97.0.0/16"])])
    assert h.sync().full
    assert family_rules(h.dump(V4), V4, "cluster-ips-check") == [
        reject_invalid_ports(V4),
        drop_unallocated(V4, "10.97.0.0/16"),
    ]
    assert family_rules(h.dump(V6), V6, "cluster-ips-check") == [reject_invalid_ports(V6)]

    h.cluster.delete_service_cidr("kubernetes")
    assert h.sync().full
    assert family_rules(h.dump(V4), V4, "cluster-ips-check") == [reject_invalid_ports(V4)]
    assert not h.sync().full


def test_cleanup_removes_both_tables() -> None:
    h = Harness(many_services(2), families=(V4, V6))
    h.sync()
    assert set(h.kernel.tables) == {("ip", "kube-proxy"), ("ip6", "kube-proxy")}
    h.backend.cleanup()
    assert h.kernel.tables == {}
    assert h.sync().full  # programs everything again


def test_dual_stack_is_one_transaction() -> None:
    h = Harness(many_services(2), families=(V4, V6))
    h.sync()
    assert len(h.kernel.applied()) == 1
    text = h.kernel.applied()[0]
    assert "add table ip kube-proxy" in text and "add table ip6 kube-proxy" in text


def test_listing_parser() -> None:
    text = (
        "table ip nat {\n\tchain POSTROUTING {\n\t}\n}\n"
        "table ip kube-proxy {\n\tchain services {\n\t}\n"
        "\tchain service-X-ns/a/tcp/ {\n\t}\n\tset cluster-ips {\n\t\ttype ipv4_addr\n\t}\n"
        "\tmap service-ips {\n\t}\n}\n"
        "table ip6 kube-proxy {\n\tchain services {\n\t}\n}\n"
    )
    found = parse_listing(text)
    assert found["ip"].chains == {"services", "service-X-ns/a/tcp/"}
    assert found["ip"].sets == {"cluster-ips"} and found["ip"].maps == {"service-ips"}
    assert found["ip6"].chains == {"services"}
