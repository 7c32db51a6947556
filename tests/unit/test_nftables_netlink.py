"""Partial syncs go to the kernel as netlink messages that kubeplex encodes itself (nft's
cache fetch costs O(chains^2) per call). The encoding is checked here against the grammar
without root, and against nft itself in a throw-away network namespace with root: the same
table, listed by nft, whichever way the partial syncs went.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kits.nft_messages import assert_encoded_as_nft
from kits.nftables_kit import (
    GOLDEN,
    NODE,
    UPSTREAM,
    Harness,
    assert_as_one_nft_transaction,
    assert_same_table,
    kernel_harness,
    kernel_table,
    many_services,
    web_service,
)
from kits.render_kit import V4, V6, endpoint_slice, ep, port, service, svc1

from kubeplex.backends.nftables import names as N
from kubeplex.backends.nftables.kernel import NftKernel
from kubeplex.core.model.errors import BackendError


def test_netlink_compiles_partial_transactions() -> None:
    from kubeplex.backends.nftables import netlink

    h = Harness(many_services(), families=(V4, V6))
    h.sync()
    h.feed(
        [
            endpoint_slice(
                "ns7", "web", [ep("10.0.7.1", NODE), ep("10.0.7.2", "n2"), ep("10.0.7.9", "n2")]
            )
        ]
    )
    text = str(h.render())
    messages = netlink.compile_transaction(text)
    # chains (2 added, 2 flushed), 2 + 2 rules, the numgen map and its elements, 1 deleted
    kinds = [m.kind for m in messages]
    assert kinds.count(netlink.MSG_NEWCHAIN) == 2 and kinds.count(netlink.MSG_DELCHAIN) == 1
    assert kinds.count(netlink.MSG_NEWRULE) == 4 and kinds.count(netlink.MSG_NEWSET) == 1
    assert kinds.count(netlink.MSG_NEWSETELEM) == 1 and kinds.count(netlink.MSG_DELRULE) == 3
    assert all(m.line in text for m in messages)
    data, lines = netlink.encode_batch(messages)
    assert len(lines) == len(messages) and len(data) % 4 == 0


@pytest.mark.parametrize(
    "line",
    [
        'add table ip kube-proxy { comment "rules for kube-proxy" ; flags dormant ; }',
        "add chain ip kube-proxy nat-output { type nat hook output priority -100 ; policy drop ; }",
        "add chain ip kube-proxy x { type route hook output priority 0 ; }",
        'add map ip kube-proxy m { type ipv4_addr : ipv4_addr ; comment "x" ; }',
        "delete map ip kube-proxy service-ips { 10.0.0.1 }",
        "add rule ip kube-proxy firewall-X ip saddr != { 10.0.0.0/8 , 192.168.0.0/16 } drop",
        "add rule ip kube-proxy x ct state established accept",
        "add rule ip kube-proxy x mark set 0x1",
        "add rule ip kube-proxy x masquerade",
        "add rule ip kube-proxy x meta l4proto tcp dnat to 10.0.0.1",
        "add rule ip kube-proxy x ip daddr 172.30.0.1 ip saddr != 0.0.0.0/0 jump y",
        "add rule ip kube-proxy x ip6 saddr 10.0.0.1 jump y",
        "add rule ip kube-proxy x numgen random mod 2 vmap { 0 : goto a }",
        "add element ip kube-proxy unknown-map { 10.0.0.1 }",
        "add element ip kube-proxy service-ips { 10.0.0.1 . icmp . 80 : goto x }",
        "add rule ip kube-proxy x counter",
    ],
)
def test_netlink_leaves_the_rest_to_nft(line: str) -> None:
    from kubeplex.backends.nftables import netlink

    with pytest.raises(netlink.Unsupported):
        netlink.compile_transaction(line + "\n")


def test_netlink_path_is_off_for_a_custom_nft() -> None:
    kernel = NftKernel("no-such-netns")
    kernel.nft_cmd = "/bin/false"
    with pytest.raises(BackendError):
        kernel.run("add chain ip kube-proxy x\n")
    assert kernel.last_path == "nft"


def _root_netns() -> Iterator[str]:
    import subprocess
    import uuid

    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces)")
    name = f"kpxnft{uuid.uuid4().hex[:8]}"
    if subprocess.run(["ip", "netns", "add", name], capture_output=True).returncode != 0:
        pytest.skip("cannot create a network namespace")
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


@pytest.fixture
def netns() -> Iterator[str]:
    yield from _root_netns()


@pytest.fixture
def netns2() -> Iterator[str]:
    yield from _root_netns()


def test_netlink_partial_syncs_give_nfts_table(netns: str, netns2: str) -> None:
    import random

    rnd = random.Random(11)
    objects = many_services(12, 2)
    h = kernel_harness(objects, netns)
    kernel = h.backend.kernel
    assert isinstance(kernel, NftKernel)
    h.sync()
    assert kernel.last_path == "netlink"
    for step in range(24):
        i = rnd.randrange(12)
        kind = step % 6
        if kind == 0:
            eps = [
                ep(f"10.0.{i}.{rnd.randrange(1, 6)}", rnd.choice([NODE, "n2"]))
                for _ in range(rnd.randrange(0, 4))
            ]
            h.feed([endpoint_slice(f"ns{i}", "web", eps)])
        elif kind == 1:
            h.cluster.delete_service(f"ns{i}", "web")
        elif kind == 2:
            spec: dict[str, Any] = {"type": "NodePort", "externalTrafficPolicy": "Local"}
            spec["sessionAffinity"] = "ClientIP"
            h.feed([web_service(i, [port(node_port=30000 + i)], **spec)])
        elif kind == 3:
            h.feed(
                [
                    web_service(
                        i,
                        [port(), port(81, "p81", "UDP")],
                        externalIPs=[f"192.168.99.{i}"],
                        internalTrafficPolicy="Local",
                    )
                ]
            )
        elif kind == 4:
            h.feed(
                [
                    service(
                        f"ns{i}",
                        "web6",
                        f"fd00:30::{i + 1}",
                        [port(node_port=31000 + i)],
                        type="NodePort",
                        sessionAffinity="ClientIP" if rnd.random() < 0.5 else "None",
                    ),
                    endpoint_slice(
                        f"ns{i}",
                        "web6",
                        [ep(f"fd00:10:{i}::{j + 1}", NODE) for j in range(rnd.randrange(1, 4))],
                        family="IPv6",
                    ),
                ]
            )
        else:
            h.feed(objects[1 + 2 * i : 3 + 2 * i])
        r = h.sync()
        assert not r.full, step
        if str(r).count("\n") > 1:
            assert kernel.last_path == "netlink", (step, str(r))
        if step % 6 == 5 or step == 23:
            assert_as_one_nft_transaction(h, netns, netns2)


FULL_SYNC_GOLDENS = sorted(
    p for p in GOLDEN.glob("*.txt") if "full sync" in p.read_text().splitlines()[0]
)


@pytest.mark.parametrize("golden", FULL_SYNC_GOLDENS, ids=lambda p: p.stem)
def test_netlink_encodes_full_syncs_as_nft_does(golden: Path, netns: str) -> None:
    """Every message kubeplex sends for a full sync is the one nft 1.0.x sends for the same
    text, byte for byte (see assert_encoded_as_nft)."""
    from kubeplex.backends.nftables import netlink

    text = golden.read_text()
    try:
        ours = netlink.compile_transaction(text)
    except netlink.Unsupported as err:
        # Only a set of several source ranges is nft's (it merges and sorts intervals).
        assert " saddr != { " in str(err) and " , " in str(err), err
        return
    assert_encoded_as_nft(ours, text, netns)


def _variant_objects() -> list[dict[str, Any]]:
    """Services of every kind a full sync writes: NodePort with Local policy, affinity, a
    LoadBalancer with one source range, dual-stack, no endpoints."""
    return [
        *many_services(3, 2),
        svc1(
            "LoadBalancer",
            ports=[port()],
            loadBalancerSourceRanges=["203.0.113.0/25"],
            ingress=["1.2.3.4"],
            externalTrafficPolicy="Local",
        ),
        endpoint_slice("ns1", "svc1", [ep("10.180.0.1", NODE), ep("10.180.0.2", "n2")]),
        web_service(20, [port(node_port=30020)], type="NodePort", sessionAffinity="ClientIP"),
        endpoint_slice("ns20", "web", [ep("10.0.20.1", NODE), ep("10.0.20.2", "n2")]),
        web_service(21, [port(), port(53, "dns", "UDP")]),
        service("ns22", "web6", "fd00:30::22", [port(node_port=31022)], type="NodePort"),
        endpoint_slice("ns22", "web6", [ep("fd00:10:22::1", NODE)], family="IPv6"),
    ]


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"nftables": {"masqueradeAll": True}},
        {"detectLocalMode": "BridgeInterface", "detectLocal": {"bridgeInterface": "cbr0"}},
        {"detectLocalMode": "InterfaceNamePrefix", "detectLocal": {"interfaceNamePrefix": "veth"}},
        {"nodePortAddresses": ["0.0.0.0/0", "::/0"]},
        {"nodePortAddresses": ["primary"]},
    ],
    ids=["upstream", "masquerade-all", "bridge", "prefix", "all-addresses", "primary"],
)
def test_netlink_encodes_config_variants_as_nft_does(fields: dict[str, Any], netns: str) -> None:
    """The same byte-for-byte comparison with nft as for the goldens, for the rule shapes that
    configuration options select (local detection, masquerade-all, NodePort addresses), both
    families. (Partial syncs are compared by listing, in the tests below: nft numbers the sets
    of a batch after those it read back from the kernel.)"""
    from kubeplex.backends.nftables import netlink

    text = str(Harness(_variant_objects(), {**UPSTREAM, **fields}, families=(V4, V6)).sync())
    assert_encoded_as_nft(netlink.compile_transaction(text), text, netns)


def test_a_staged_first_load_over_netlink_gives_nfts_table(
    netns: str, netns2: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first sync in stages (pipelined, anonymous maps named by kubeplex) leaves the table one
    nft transaction writes; later syncs that add anonymous maps (numbered by the kernel around
    those names) keep it so."""
    import kubeplex.backends.nftables as backend_module

    objects = many_services(30, 3)
    objects.append(web_service(30, [port()], sessionAffinity="ClientIP"))
    objects.append(endpoint_slice("ns30", "web", [ep("10.0.30.1", NODE), ep("10.0.30.2", "n2")]))
    monkeypatch.setattr(backend_module, "STAGE_LINES", 50)
    monkeypatch.setattr(backend_module, "STAGE_MIN_LINES", 0)
    h = kernel_harness(objects, netns)
    transactions: list[str] = []
    kernel = h.backend.kernel
    assert isinstance(kernel, NftKernel)
    real_run_netlink = kernel._run_netlink
    monkeypatch.setattr(
        kernel, "_run_netlink", lambda m: transactions.append("x") or real_run_netlink(m)
    )
    assert h.sync().full and len(transactions) > 5 and kernel.last_path == "netlink"
    assert_as_one_nft_transaction(h, netns, netns2)
    for i in (3, 17, 30):
        h.feed(
            [endpoint_slice(f"ns{i}", "web", [ep(f"10.0.{i}.9", NODE), ep(f"10.0.{i}.8", "n2")])]
        )
        assert not h.sync().full
    assert_as_one_nft_transaction(h, netns, netns2)


def test_an_untrusted_full_sync_over_an_existing_table_gives_nfts_table(
    netns: str, netns2: str
) -> None:
    """After a restart or a failure, the whole table is rewritten in one transaction, in the
    order that is cheap for the kernel: chains it holds only flushed, a service's own chains
    before the endpoint chains. The table is the one a single nft transaction writes."""
    objects = many_services(12, 3)
    h = kernel_harness(objects, netns)
    assert h.sync().full
    h.feed(
        [
            endpoint_slice("ns3", "web", [ep("10.0.3.7", NODE), ep("10.0.3.8", "n2")]),
            web_service(40, [port()], sessionAffinity="ClientIP"),
            endpoint_slice("ns40", "web", [ep("10.0.40.1", NODE), ep("10.0.40.2", "n2")]),
        ]
    )
    h.cluster.delete_service("ns5", "web")
    h.backend.invalidate()
    r = h.sync()
    assert r.full
    text = str(r)
    kept = "endpoint-" + N.cached_base("ns0/web/tcp/p80__10.0.0.1/80")
    new = "endpoint-" + N.cached_base("ns3/web/tcp/p80__10.0.3.7/80")
    assert f"flush chain ip kube-proxy {kept}\n" in text
    assert f"add chain ip kube-proxy {kept}\n" not in text
    assert f"add chain ip kube-proxy {new}\n" in text
    first_numgen = text.index(" numgen random ")
    assert text.index("add rule ip kube-proxy endpoint-") > text.rindex(" numgen random ")
    assert text.index("add set ip kube-proxy affinity-") < first_numgen
    assert_as_one_nft_transaction(h, netns, netns2)


def test_netlink_failure_leaves_the_table_and_forces_a_full_sync(netns: str) -> None:
    import subprocess

    h = kernel_harness(many_services(5), netns)
    h.sync()
    before = kernel_table(netns)
    # A chain removed behind kubeplex's back: the partial sync's flush of it fails.
    chain = "endpoint-" + N.hash8("ns1/web/tcp/p80__10.0.1.2/80") + "-ns1/web/tcp/p80__10.0.1.2/80"
    svc = "service-" + N.hash8("ns1/web/tcp/p80") + "-ns1/web/tcp/p80"
    subprocess.run(
        ["ip", "netns", "exec", netns, "nft", "-f", "-"],
        input=f"flush chain ip kube-proxy {svc}\ndelete chain ip kube-proxy {chain}\n",
        text=True,
        check=True,
    )
    damaged = kernel_table(netns)
    h.feed([endpoint_slice("ns1", "web", [ep("10.0.1.1", NODE), ep("10.0.1.7", "n2")])])
    with pytest.raises(BackendError, match="No such file or directory"):
        h.sync()
    assert isinstance(h.backend.kernel, NftKernel) and h.backend.kernel.last_path == "netlink"
    assert kernel_table(netns) == damaged  # nothing of the batch was applied
    r = h.sync()
    assert r.full and "10.0.1.7" in str(kernel_table(netns))
    assert kernel_table(netns) != before


def test_a_big_first_sync_into_empty_tables_goes_in_stages(monkeypatch: pytest.MonkeyPatch) -> None:
    import kubeplex.backends.nftables as backend_module

    monkeypatch.setattr(backend_module, "STAGE_LINES", 40)
    monkeypatch.setattr(backend_module, "STAGE_MIN_LINES", 0)
    h = Harness(many_services(10), families=(V4, V6))
    r = h.sync()
    assert r.full and len(h.kernel.applied()) > 4
    # The elements (what makes the services reachable) come with the last transaction.
    stages = h.kernel.applied()
    assert all("add element" not in t for t in stages[:-1] if "nodeport-ips" not in t)
    assert all("element ip kube-proxy service-ips" not in t for t in stages[:-1])
    assert "add element ip kube-proxy service-ips" in stages[-1]
    # The base chains stay empty until the last transaction: no packet enters the table before.
    base_rules = (
        "add rule ip kube-proxy filter-",
        "add rule ip kube-proxy nat-",
        "rule ip6 kube-proxy nat-",
    )
    assert all(not any(b in t for b in base_rules) for t in stages[:-1])
    assert all(b in stages[-1] for b in base_rules)
    fresh = Harness(many_services(10), families=(V4, V6))
    monkeypatch.setattr(backend_module, "STAGE_LINES", 10**9)
    fresh.sync()
    assert len(fresh.kernel.applied()) == 1
    for fam in (V4, V6):
        assert_same_table(fresh.dump(fam), h.dump(fam))
    # Once the tables exist, a full sync (even one that trusts nothing) is one transaction.
    monkeypatch.setattr(backend_module, "STAGE_LINES", 40)
    h.backend.invalidate()
    before = len(h.kernel.applied())
    assert h.sync().full and len(h.kernel.applied()) == before + 1
    # A failed stage: the next sync is full, finds the tables and rewrites them at once.
    other = Harness(many_services(10))
    real_run, calls = other.kernel.run, []

    def third_fails(text: str) -> None:
        calls.append(text)
        if len(calls) == 3:
            raise BackendError("nft -f failed: simulated")
        real_run(text)

    other.kernel.run = third_fails  # type: ignore[method-assign]
    with pytest.raises(BackendError):
        other.sync()
    assert len(other.kernel.applied()) == 2
    assert other.sync().full and len(other.kernel.applied()) == 3
    fresh = Harness(many_services(10))
    fresh.sync()
    assert_same_table(fresh.dump(), other.dump())
