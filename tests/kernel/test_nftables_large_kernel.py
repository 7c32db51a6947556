"""Services with thousands of endpoints in nftables mode, in the kernel (root, namespaces).

A Service's ``numgen ... vmap`` holds one element per endpoint; from some 700 endpoints on
(depending on name lengths) its element list no longer fits one netlink attribute (a 16-bit
length) and goes in several NEWSETELEM messages, as nft sends it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from kits.dataplane_kit import shared_dataplane
from kits.nft_messages import assert_encoded_as_nft
from kits.nftables_kit import NODE, Harness, node_obj, web_service
from kits.render_kit import V4, ep
from kits.render_kit import endpoint_slice as slice_of

from kubeplex.backends.nftables import names as N
from kubeplex.backends.nftables import netlink
from kubeplex.testing.dataplane import DataplaneCluster, endpoint, endpoint_slice, service
from kubeplex.testing.netlab import CLIENT_POD, NODE1, NODE2, WEB_A, WEB_B, tally

pytestmark = pytest.mark.kernel

BIG = "big"
BIG_VIP = "10.96.7.7"
WEB_VIP = "10.96.88.59"


def big_service_objects(n: int) -> list[dict[str, Any]]:
    eps = [ep(f"10.{100 + i // 62500}.{i // 250 % 250}.{i % 250 + 1}", NODE) for i in range(n)]
    return [
        node_obj(),
        web_service(0, [{"name": "p80", "port": 80, "protocol": "TCP"}]),
        slice_of("ns0", "web", eps),
    ]


@pytest.mark.parametrize("endpoints", [100, 800, 2000])
def test_a_large_services_messages_are_nfts(endpoints: int, netns: str) -> None:
    """Byte for byte what nft 1.0.6 sends, the numgen map's elements split where nft splits
    them (an element that does not fit starts the next message, its number skipped)."""
    text = str(Harness(big_service_objects(endpoints), families=(V4,)).sync())
    ours = netlink.compile_transaction(text)
    setelems = [m for m in ours if m.kind == netlink.MSG_NEWSETELEM and len(m.body) > 1000]
    assert len(setelems) == -(-endpoints * 88 // 65531)  # 88-byte elements here
    assert all(len(m.body) < 65536 + 64 for m in setelems)
    assert_encoded_as_nft(ours, text, netns)


@pytest.fixture(scope="module")
def shared() -> Iterator[DataplaneCluster]:
    yield from shared_dataplane("nftables")


def big_service(dp: DataplaneCluster, n: int) -> list[dict[str, Any]]:
    """Service ``big`` with ``n`` endpoints (addresses no pod has: no traffic goes to them), in
    slices of 1,000 as the API server's EndpointSlice controller writes them."""
    ips = [f"10.{200 + i // 62500}.{i // 250 % 250}.{i % 250 + 1}" for i in range(n)]
    slices = [
        endpoint_slice(
            BIG, [endpoint(ip, NODE2) for ip in ips[k : k + 1000]], 8080, name=f"big-{k}"
        )
        for k in range(0, n, 1000)
    ]
    return [service(BIG, BIG_VIP, 80, target_port=8080), *slices]


def kernel_rules(dp: DataplaneCluster, node: str, chain: str) -> str:
    ns = dp.agent(node).netns
    return subprocess.run(
        ["ip", "netns", "exec", ns, "nft", "list", "chain", "ip", "kube-proxy", chain],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_a_3000_endpoint_service_syncs_and_the_others_work(dp: DataplaneCluster) -> None:
    web = [
        service("web", WEB_VIP, 80, target_port=8080),
        endpoint_slice("web", dp.endpoints(WEB_A, WEB_B), port=8080),
    ]
    dp.set(*big_service(dp, 3000), *web)
    dp.sync_or_raise()
    chain = "service-" + N.hash8(f"default/{BIG}/tcp/") + f"-default/{BIG}/tcp/"
    rules = kernel_rules(dp, NODE1, chain)
    assert "numgen random mod 3000 vmap" in rules
    assert rules.count("goto endpoint-") == 3000
    counts = tally(dp.lab.http(CLIENT_POD, WEB_VIP, 80, count=20))
    assert counts[WEB_A] + counts[WEB_B] == 20, counts
    # A partial sync that changes the big Service goes through as well.
    dp.set(*big_service(dp, 2999))
    dp.sync_or_raise()
    assert "numgen random mod 2999 vmap" in kernel_rules(dp, NODE1, chain)
