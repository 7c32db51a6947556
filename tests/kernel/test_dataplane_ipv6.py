"""ip6tables chain names in the dual-stack namespace cluster (iptables mode).

The IPv6 and dual-stack behaviour of every mode (spreading, rejects, NodePorts, traffic
policies, hairpin, UDP) is the conformance kit's (tests/kernel/test_conformance.py); what stays
here is iptables' own: upstream's hashed chain names, as ``ip6tables-save`` shows them.
"""

from __future__ import annotations

import base64
import hashlib
import shlex
from collections.abc import Iterator

import pytest
from kits.dataplane_kit import shared_dataplane

from kubeplex.core.model.types import IPFamily
from kubeplex.testing.dataplane import DataplaneCluster, endpoint_slice, service
from kubeplex.testing.netlab import NODE1, WEB_A, WEB_B, WEB_C

pytestmark = pytest.mark.kernel

V6 = IPFamily.IPv6
WEB = "web"
WEB_VIP = "10.96.88.59"
WEB_VIP6 = "fd00:96::59"
WEBS = (WEB_A, WEB_B, WEB_C)


@pytest.fixture(scope="module")
def shared() -> Iterator[DataplaneCluster]:
    """One dual-stack lab in iptables mode for the module."""
    yield from shared_dataplane("iptables", ipv6=True)


def ip6_of(dp: DataplaneCluster, name: str) -> str:
    return dp.lab.spec.ip_of(name, ipv6=True)


def web(dp: DataplaneCluster) -> list[dict[str, object]]:
    """Dual-stack Service ``web`` and one EndpointSlice per family of the web pods."""
    return [
        service(WEB, WEB_VIP, 80, target_port=8080, secondary_cluster_ip=WEB_VIP6),
        endpoint_slice(WEB, dp.endpoints(*WEBS), port=8080, name=f"{WEB}-v4"),
        endpoint_slice(
            WEB,
            dp.endpoints(*WEBS, family=V6),
            port=8080,
            name=f"{WEB}-v6",
            address_type="IPv6",
        ),
    ]


def upstream_hash(text: str) -> str:
    """upstream kube-proxy's chain suffix: base32(sha256(text)), first 16 characters."""
    return base64.b32encode(hashlib.sha256(text.encode()).digest()).decode()[:16]


def test_ip6tables_chains_use_upstreams_hashed_names(dp: DataplaneCluster) -> None:
    dp.set(*web(dp))
    dp.sync_or_raise()
    svc_chain = "KUBE-SVC-" + upstream_hash("default/webtcp")
    save6 = dp.lab.exec(NODE1, ["ip6tables-save", "-t", "nat"]).stdout
    save4 = dp.lab.exec(NODE1, ["iptables-save", "-t", "nat"]).stdout
    rules6 = [shlex.split(ln) for ln in save6.splitlines() if ln.startswith("-A ")]

    def jumps_of(rules: list[list[str]], chain: str) -> list[list[str]]:
        return [r for r in rules if r[1] == chain and "-j" in r]

    [capture] = [r for r in jumps_of(rules6, "KUBE-SERVICES") if "default/web cluster IP" in r]
    assert capture[capture.index("-d") + 1] == f"{WEB_VIP6}/128", capture
    assert capture[capture.index("-j") + 1] == svc_chain, (capture, save6)
    assert f":{svc_chain} " in save6
    # The same name in both families: it hashes the service port, not an address.
    assert f"-d {WEB_VIP}/32" in save4 and f"-j {svc_chain}" in save4, save4

    # Endpoint chains hash "[ip]:port" for IPv6 (upstream's net.JoinHostPort).
    seps = {
        r[r.index("--comment") + 1].rsplit(" -> ", 1)[-1]: r[r.index("-j") + 1]
        for r in jumps_of(rules6, svc_chain)
        if r[r.index("-j") + 1].startswith("KUBE-SEP-")
    }
    expected = {
        f"[{ip6_of(dp, w)}]:8080": "KUBE-SEP-"
        + upstream_hash(f"default/webtcp[{ip6_of(dp, w)}]:8080")
        for w in WEBS
    }
    assert seps == expected, save6
    for address, chain in expected.items():
        [dnat] = [r for r in jumps_of(rules6, chain) if "DNAT" in r]
        assert dnat[dnat.index("--to-destination") + 1] == address, dnat
