"""Dataplane behaviour in a namespace cluster: one suite, run once per proxy mode.

Every case is written as traffic outcomes (who answered, refused vs timeout, which client IP
a pod saw). Where a case must look at the kernel's objects (chains, counters, probabilities),
it goes through a small per-mode inspector; a mode without one skips just those checks.

One lab per mode and module; before each test the agents' cleanup runs, the node rulesets and
conntrack tables are flushed and fresh agents are made (``DataplaneCluster.reset``), so tests
do not depend on each other.
"""

from __future__ import annotations

import contextlib
import re
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol, cast

import pytest
from dataplane_kit import shared_dataplane

from kubeplex.core.model.types import IPFamily
from kubeplex.testing.dataplane import (
    WEB_D,
    DataplaneCluster,
    NodeAgent,
    endpoint_slice,
    service,
)
from kubeplex.testing.netlab import (
    CLIENT_POD,
    EXTERNAL,
    NODE1,
    NODE2,
    UDP_PORT,
    WEB_A,
    WEB_B,
    WEB_C,
    Lab,
    ProbeResult,
    tally,
)

pytestmark = pytest.mark.kernel

MODES = ["iptables", "nftables"]

WEB = "web"
WEB_KEY = f"default/{WEB}"
WEB_VIP = "10.96.88.59"
NODEPORT = 30080
CLIENT_IP = "10.244.1.3"
EXTERNAL_IP = "172.18.0.10"
WEBS = (WEB_A, WEB_B, WEB_C)
#: chi-square critical value at p = 0.001 with 2 degrees of freedom (three endpoints).
CHI2_CRIT_2DOF_0001 = 13.82


# ------------------------------------------------------------------------------ per-mode helpers


class Inspector(Protocol):
    """What a mode shows of its kernel objects, for the few cases that must look inside."""

    def service_objects(self, agent: NodeAgent, svc: str) -> set[str]:
        """Names of the per-Service kernel objects of ``ns/name`` (empty: none left)."""
        ...

    def all_objects(self, agent: NodeAgent) -> set[str]:
        """Names of every object of the dataplane on the node (chains, maps, ...)."""
        ...

    def endpoint_objects(self, agent: NodeAgent, svc: str) -> dict[str, str]:
        """Per-endpoint objects of a Service by ``ip:port`` (empty if the mode has none)."""
        ...

    def assert_even_split(self, agent: NodeAgent, svc: str, n: int) -> None:
        """The Service's load balancing gives each of its ``n`` endpoints 1/n."""
        ...

    def zero_counters(self, agent: NodeAgent, svc: str) -> None: ...

    def counter(self, agent: NodeAgent, svc: str) -> int:
        """New connections the Service's load balancer handed to endpoints since zeroing."""
        ...

    def failing_apply(
        self, agent: NodeAgent, tmp_path: Path
    ) -> contextlib.AbstractContextManager[None]:
        """While active, the agent's apply step fails for real (its kernel tool exits 1)."""
        ...

    def leftovers(self, agent: NodeAgent) -> list[str]:
        """What of the dataplane is still on the node (after cleanup: nothing)."""
        ...


def _comment(line: str) -> str:
    tokens = shlex.split(line)
    return tokens[tokens.index("--comment") + 1] if "--comment" in tokens else ""


def _target(line: str) -> str:
    tokens = line.split()
    return tokens[tokens.index("-j") + 1] if "-j" in tokens else ""


def _names_service(comment: str, svc: str) -> bool:
    return re.search(rf"(?:^|\s){re.escape(svc)}(?:$|[\s:])", comment) is not None


class IptablesInspector:
    """iptables mode: chains and rules as ``iptables-save`` prints them."""

    SERVICE_CHAIN_PREFIXES = ("KUBE-SVC-", "KUBE-SVL-", "KUBE-EXT-", "KUBE-FW-", "KUBE-SEP-")
    #: iptables-save's view of upstream's probabilities (the kernel keeps them as u32).
    PROBABILITIES = {
        2: ["0.50000000000"],
        3: ["0.33333333349", "0.50000000000"],
        4: ["0.25000000000", "0.33333333349", "0.50000000000"],
    }

    def __init__(self, lab: Lab) -> None:
        self.lab = lab

    def _save(self, agent: NodeAgent, *args: str) -> str:
        return str(self.lab.exec(agent.node, ["iptables-save", *args]).stdout)

    def _nat_rules(self, agent: NodeAgent) -> list[str]:
        return [ln for ln in self._save(agent, "-t", "nat").splitlines() if ln.startswith("-A ")]

    def service_chain(self, agent: NodeAgent, svc: str) -> str:
        for line in self._nat_rules(agent):
            if line.startswith("-A KUBE-SERVICES ") and _comment(line) == f"{svc} cluster IP":
                return _target(line)
        raise AssertionError(f"no KUBE-SERVICES rule for {svc} on {agent.node}")

    def service_objects(self, agent: NodeAgent, svc: str) -> set[str]:
        return {
            line.split()[1]
            for line in self._nat_rules(agent)
            if line.split()[1].startswith(self.SERVICE_CHAIN_PREFIXES)
            and _names_service(_comment(line), svc)
        }

    def all_objects(self, agent: NodeAgent) -> set[str]:
        return set(re.findall(r"^:(\S+) ", self._save(agent), re.MULTILINE))

    def endpoint_objects(self, agent: NodeAgent, svc: str) -> dict[str, str]:
        chain = self.service_chain(agent, svc)
        out = {}
        for line in self._nat_rules(agent):
            if line.startswith(f"-A {chain} ") and _target(line).startswith("KUBE-SEP-"):
                out[_comment(line).rsplit(" -> ", 1)[-1]] = _target(line)
        return out

    def _probabilities(self, agent: NodeAgent, svc: str) -> tuple[list[str], int]:
        chain = self.service_chain(agent, svc)
        jumps = [
            line
            for line in self._nat_rules(agent)
            if line.startswith(f"-A {chain} ") and _target(line).startswith("KUBE-SEP-")
        ]
        probs = [
            ln.split("--probability ", 1)[1].split()[0] for ln in jumps if "--probability" in ln
        ]
        return probs, len(jumps)

    def assert_even_split(self, agent: NodeAgent, svc: str, n: int) -> None:
        probs, jumps = self._probabilities(agent, svc)
        assert jumps == n
        assert probs == self.PROBABILITIES[n]  # and the last jump is unconditional

    def zero_counters(self, agent: NodeAgent, svc: str) -> None:
        self.lab.exec(agent.node, ["iptables", "-t", "nat", "-Z", self.service_chain(agent, svc)])

    def counter(self, agent: NodeAgent, svc: str) -> int:
        chain = self.service_chain(agent, svc)
        total = 0
        for line in self._save(agent, "-c", "-t", "nat").splitlines():
            m = re.match(rf"\[(\d+):\d+\] -A {re.escape(chain)} ", line)
            if m and _target(line).startswith("KUBE-SEP-"):
                total += int(m.group(1))
        return total

    @contextlib.contextmanager
    def failing_apply(self, agent: NodeAgent, tmp_path: Path) -> Iterator[None]:
        # Replaces the tool, not the kernel: iptables-restore is swapped for a script that
        # reads its input and exits 1, as a restore rejected by the kernel would.
        script = tmp_path / "iptables-restore-fails"
        script.write_text(
            '#!/bin/sh\ncat >/dev/null\necho "simulated restore failure" >&2\nexit 1\n'
        )
        script.chmod(0o755)
        kernel = cast(Any, agent.backend)._kernels[IPFamily.IPv4]
        original = kernel.restore_cmd
        kernel.restore_cmd = str(script)
        try:
            yield
        finally:
            kernel.restore_cmd = original

    def leftovers(self, agent: NodeAgent) -> list[str]:
        # KUBE-FIREWALL is kubelet's chain: kube-proxy writes the same rule into it (IPv4 with
        # localhost NodePorts) but, like upstream, leaves the chain to kubelet on cleanup.
        kubelet = re.compile(r"^:KUBE-FIREWALL |^-A KUBE-FIREWALL |-j KUBE-FIREWALL$")
        return [
            ln for ln in self._save(agent).splitlines() if "KUBE-" in ln and not kubelet.search(ln)
        ]


class NftablesInspector:
    """nftables mode: the ``ip kube-proxy`` table as ``nft list`` prints it.

    Upstream's rules carry no counters; ``zero_counters`` inserts an anonymous ``counter``
    rule at the head of the Service's chain and ``counter`` reads it back. A sync that rewrites
    (flushes) that chain takes the counter with it, exactly as iptables-restore zeroes a
    rewritten chain's counters.
    """

    TAG = "kubeplex-inspector"
    KINDS = ("service", "local", "external", "firewall", "endpoint", "affinity")
    _OBJECT = re.compile(r"^\s*(chain|set|map) (\S+) \{$", re.MULTILINE)
    _NUMGEN = re.compile(r"numgen random mod (\d+) vmap \{ (.*) \}")

    def __init__(self, lab: Lab) -> None:
        self.lab = lab

    def _nft(self, agent: NodeAgent, *args: str) -> str:
        return str(self.lab.exec(agent.node, ["nft", *args]).stdout)

    def _table(self, agent: NodeAgent) -> str:
        return self._nft(agent, "list", "table", "ip", "kube-proxy")

    def _owned(self, name: str, svc: str) -> bool:
        kinds = "|".join(self.KINDS)
        return re.match(rf"^(?:{kinds})-[A-Z2-7]{{8}}-{re.escape(svc)}/", name) is not None

    def _rules(self, agent: NodeAgent, chain: str, *flags: str) -> list[str]:
        text = self._nft(agent, *flags, "list", "chain", "ip", "kube-proxy", chain)
        return [ln.strip() for ln in text.splitlines() if ln.startswith("\t\t")]

    def service_chain(self, agent: NodeAgent, svc: str) -> str:
        found = [
            n
            for kind, n in self._OBJECT.findall(self._table(agent))
            if kind == "chain" and n.startswith("service-") and self._owned(n, svc)
        ]
        assert len(found) == 1, (svc, found)
        return found[0]

    def _numgen(self, agent: NodeAgent, svc: str) -> tuple[int, list[tuple[int, str]]]:
        for rule in self._rules(agent, self.service_chain(agent, svc)):
            m = self._NUMGEN.search(rule)
            if m:
                entries = []
                for entry in m.group(2).split(","):
                    index, verdict = entry.split(":", 1)
                    entries.append((int(index), verdict.split()[-1]))
                return int(m.group(1)), entries
        raise AssertionError(f"no numgen rule for {svc} on {agent.node}")

    def service_objects(self, agent: NodeAgent, svc: str) -> set[str]:
        return {n for _, n in self._OBJECT.findall(self._table(agent)) if self._owned(n, svc)}

    def all_objects(self, agent: NodeAgent) -> set[str]:
        return {n for _, n in self._OBJECT.findall(self._table(agent))}

    def endpoint_objects(self, agent: NodeAgent, svc: str) -> dict[str, str]:
        out = {}
        for _, chain in self._numgen(agent, svc)[1]:
            ip, port = chain.rsplit("__", 1)[1].rsplit("/", 1)
            out[f"{ip}:{port}"] = chain
        return out

    def assert_even_split(self, agent: NodeAgent, svc: str, n: int) -> None:
        mod, entries = self._numgen(agent, svc)
        assert mod == n, (mod, entries)
        assert [i for i, _ in entries] == list(range(n)), entries
        targets = [t for _, t in entries]
        assert len(set(targets)) == n and all(t.startswith("endpoint-") for t in targets)

    def zero_counters(self, agent: NodeAgent, svc: str) -> None:
        chain = self.service_chain(agent, svc)
        for rule in self._rules(agent, chain, "-a"):
            if f'"{self.TAG}"' in rule:
                handle = rule.rsplit("# handle ", 1)[1]
                self._nft(agent, "delete", "rule", "ip", "kube-proxy", chain, "handle", handle)
        self._nft(
            agent,
            "insert",
            "rule",
            "ip",
            "kube-proxy",
            chain,
            "counter",
            "comment",
            f'"{self.TAG}"',
        )

    def counter(self, agent: NodeAgent, svc: str) -> int:
        for rule in self._rules(agent, self.service_chain(agent, svc)):
            m = re.search(r"counter packets (\d+) ", rule)
            if m and f'"{self.TAG}"' in rule:
                return int(m.group(1))
        return 0  # the chain was rewritten since zero_counters

    @contextlib.contextmanager
    def failing_apply(self, agent: NodeAgent, tmp_path: Path) -> Iterator[None]:
        # Replaces the tool, not the kernel: nft is swapped for a script that reads its input
        # and exits 1, as a transaction rejected by the kernel would.
        script = tmp_path / "nft-fails"
        script.write_text(
            '#!/bin/sh\ncat >/dev/null\necho "simulated restore failure" >&2\nexit 1\n'
        )
        script.chmod(0o755)
        kernel = cast(Any, agent.backend)._kernel
        original = kernel.nft_cmd
        kernel.nft_cmd = str(script)
        try:
            yield
        finally:
            kernel.nft_cmd = original

    def leftovers(self, agent: NodeAgent) -> list[str]:
        return [ln for ln in self._nft(agent, "list", "tables").splitlines() if "kube-proxy" in ln]


INSPECTORS: dict[str, Callable[[Lab], Inspector]] = {
    "iptables": IptablesInspector,
    "nftables": NftablesInspector,
}


def inspector_for(dp: DataplaneCluster) -> Inspector | None:
    cls = INSPECTORS.get(dp.mode)
    return cls(dp.lab) if cls is not None else None


# ------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module", params=MODES)
def shared(request: pytest.FixtureRequest) -> Iterator[DataplaneCluster]:
    """One lab per mode for the module."""
    yield from shared_dataplane(request.param)


@pytest.fixture
def inspector(dp: DataplaneCluster) -> Inspector:
    found = inspector_for(dp)
    if found is None:
        pytest.skip(f"no kernel inspector for mode {dp.mode} yet")
    return found


# -------------------------------------------------------------------------------------- helpers


def ip_of(dp: DataplaneCluster, pod: str) -> str:
    return str(dp.lab.spec.pod(pod).ip)


def host_ip(dp: DataplaneCluster, node: str) -> str:
    return str(dp.lab.spec.node(node).host_ip)


def web(
    dp: DataplaneCluster,
    pods: tuple[str, ...] = WEBS,
    *,
    name: str = WEB,
    vip: str = WEB_VIP,
    **svc: Any,
) -> list[dict[str, Any]]:
    """Service ``name`` (port 80) and its EndpointSlice of ``pods`` on 8080."""
    return [
        service(name, vip, 80, target_port=8080, **svc),
        endpoint_slice(name, dp.endpoints(*pods), port=8080),
    ]


def synced(dp: DataplaneCluster, *objects: dict[str, Any]) -> None:
    dp.set(*objects)
    dp.sync_or_raise()


def hosts(results: list[ProbeResult]) -> set[str]:
    """The client addresses pods reported for /clientip requests (without the port)."""
    return {(r.body or "").rsplit(":", 1)[0] for r in results}


def all_ok(results: list[ProbeResult]) -> bool:
    return all(r.ok for r in results)


# ---------------------------------------------------------------------------------------- cases


def test_clusterip_spreads_evenly_over_endpoints(dp: DataplaneCluster) -> None:
    synced(dp, *web(dp))
    results = dp.lab.http(CLIENT_POD, WEB_VIP, 80, count=300)
    counts = tally(results)
    assert sum(counts[w] for w in WEBS) == 300, counts
    chi2 = sum((counts[w] - 100) ** 2 / 100 for w in WEBS)
    assert chi2 < CHI2_CRIT_2DOF_0001, (chi2, counts)


def test_scale_to_four_endpoints_and_back(dp: DataplaneCluster) -> None:
    look = inspector_for(dp)
    node1 = dp.agent(NODE1)
    synced(dp, *web(dp))
    if look:
        look.assert_even_split(node1, WEB_KEY, 3)

    dp.set(endpoint_slice(WEB, dp.endpoints(*WEBS, WEB_D), port=8080))
    dp.sync_or_raise()
    if look:
        look.assert_even_split(node1, WEB_KEY, 4)
        web_d_obj = look.endpoint_objects(node1, WEB_KEY).get(f"{ip_of(dp, WEB_D)}:8080")
        assert web_d_obj is not None
    counts = tally(dp.lab.http(CLIENT_POD, WEB_VIP, 80, count=80))
    assert set(counts) == {*WEBS, WEB_D}, counts

    dp.set(endpoint_slice(WEB, dp.endpoints(*WEBS), port=8080))
    assert dp.sync()
    assert node1.last_result is not None and not node1.last_result.full
    if look:
        look.assert_even_split(node1, WEB_KEY, 3)
        assert web_d_obj not in look.all_objects(node1)
    counts = tally(dp.lab.http(CLIENT_POD, WEB_VIP, 80, count=60))
    assert set(counts) == set(WEBS), counts


def test_nodeport_cluster_policy_from_other_node_and_external_host(dp: DataplaneCluster) -> None:
    synced(dp, *web(dp, type="NodePort", node_port=NODEPORT))
    node1_ip, node2_ip = host_ip(dp, NODE1), host_ip(dp, NODE2)

    from_external = dp.lab.http(EXTERNAL, node1_ip, NODEPORT, count=12)
    assert all_ok(from_external), tally(from_external)
    assert {WEB_B, WEB_C} & set(tally(from_external))  # forwarded to the other node too
    assert all_ok(dp.lab.http(EXTERNAL, node2_ip, NODEPORT, count=6))
    from_node2 = dp.lab.http(NODE2, node1_ip, NODEPORT, count=6)
    assert all_ok(from_node2), tally(from_node2)
    # Cluster policy masquerades: the pods never see the external client's address.
    seen = dp.lab.http(EXTERNAL, node1_ip, NODEPORT, "/clientip", count=6)
    assert all_ok(seen) and EXTERNAL_IP not in hosts(seen), seen


def test_nodeport_local_policy_keeps_client_ip_and_drops_without_local_endpoint(
    dp: DataplaneCluster,
) -> None:
    # The only endpoint is web-a on kind-worker: kind-worker2 has no local endpoint.
    synced(
        dp,
        *web(dp, (WEB_A,), type="NodePort", node_port=NODEPORT, external_traffic_policy="Local"),
    )
    seen = dp.lab.http(EXTERNAL, host_ip(dp, NODE1), NODEPORT, "/clientip", count=3)
    assert all_ok(seen) and hosts(seen) == {EXTERNAL_IP}, seen
    [dropped] = dp.lab.http(EXTERNAL, host_ip(dp, NODE2), NODEPORT, timeout=1.0)
    assert dropped.outcome == "timeout", dropped  # dropped, not refused
    # The node with the endpoint still answers after the other one dropped.
    assert tally(dp.lab.http(EXTERNAL, host_ip(dp, NODE1), NODEPORT, count=2)) == {WEB_A: 2}


def test_service_without_endpoints_is_refused_at_once(dp: DataplaneCluster) -> None:
    synced(
        dp,
        service("empty", "10.96.0.30", 80, target_port=8080),
        # A slice whose only endpoint is neither ready nor serving counts as no endpoints.
        service("notready", "10.96.0.31", 80, target_port=8080),
        endpoint_slice("notready", dp.endpoints(WEB_A, ready=False), port=8080),
    )
    for vip in ("10.96.0.30", "10.96.0.31"):
        [r] = dp.lab.http(CLIENT_POD, vip, 80, timeout=3.0)
        assert r.outcome == "refused", (vip, r)
        assert r.ms < 500, (vip, r)  # an immediate ICMP reject, not the 3 s timeout


def test_session_affinity_client_ip_sticks_to_one_backend(dp: DataplaneCluster) -> None:
    synced(dp, *web(dp, session_affinity="ClientIP", affinity_timeout=60))
    counts = tally(dp.lab.http(CLIENT_POD, WEB_VIP, 80, count=30))
    assert len(counts) == 1 and next(iter(counts)) in WEBS and sum(counts.values()) == 30, counts


def test_hairpin_pod_reaches_itself_through_its_service(dp: DataplaneCluster) -> None:
    synced(dp, *web(dp, (WEB_A,), name="self", vip="10.96.0.20"))
    assert tally(dp.lab.http(WEB_A, "10.96.0.20", 80, count=3)) == {WEB_A: 3}
    seen = dp.lab.http(WEB_A, "10.96.0.20", 80, "/clientip", count=3)
    # Masqueraded: with its own address as source, the reply would never be un-NATed.
    assert all_ok(seen) and ip_of(dp, WEB_A) not in hosts(seen), seen


def test_internal_traffic_policy_local_uses_only_local_endpoints(dp: DataplaneCluster) -> None:
    synced(dp, *web(dp, internal_traffic_policy="Local"))
    assert tally(dp.lab.http(CLIENT_POD, WEB_VIP, 80, count=20)) == {WEB_A: 20}
    # On kind-worker2 the local endpoints are web-b and web-c.
    counts = tally(dp.lab.http(WEB_B, WEB_VIP, 80, count=20))
    assert set(counts) <= {WEB_B, WEB_C} and sum(counts.values()) == 20, counts


def test_conntrack_shows_the_dnat_tuple(dp: DataplaneCluster) -> None:
    synced(dp, *web(dp))
    [r] = dp.lab.http(CLIENT_POD, WEB_VIP, 80)
    assert r.ok and r.body in WEBS, r
    out = dp.lab.exec(NODE1, ["conntrack", "-L", "-p", "tcp", "-d", WEB_VIP]).stdout
    pattern = re.compile(
        rf"src={re.escape(CLIENT_IP)} dst={re.escape(WEB_VIP)} sport=\d+ dport=80 "
        rf"src=(\S+) dst={re.escape(CLIENT_IP)} sport=8080 "
    )
    replies = {m.group(1) for m in pattern.finditer(out)}
    # The original tuple goes to the ClusterIP, the expected reply comes from the chosen pod.
    assert replies and replies <= {ip_of(dp, w) for w in WEBS}, out
    assert ip_of(dp, r.body or "") in replies, out


def test_partial_sync_keeps_counters_of_unchanged_service(
    dp: DataplaneCluster, inspector: Inspector
) -> None:
    node1 = dp.agent(NODE1)
    synced(dp, *web(dp), *web(dp, (WEB_A, WEB_B), name="other", vip="10.96.0.40"))
    inspector.zero_counters(node1, WEB_KEY)
    assert all_ok(dp.lab.http(CLIENT_POD, WEB_VIP, 80, count=30))
    assert inspector.counter(node1, WEB_KEY) == 30

    dp.set(endpoint_slice("other", dp.endpoints(WEB_A), port=8080))
    assert node1.sync(full=False), node1.last_error
    assert node1.last_result is not None and not node1.last_result.full
    assert tally(dp.lab.http(CLIENT_POD, "10.96.0.40", 80, count=6)) == {WEB_A: 6}
    assert inspector.counter(node1, WEB_KEY) == 30  # the unchanged Service was not rewritten


def test_failed_apply_leaves_previous_rules_working(
    dp: DataplaneCluster, inspector: Inspector, tmp_path: Path
) -> None:
    node1 = dp.agent(NODE1)
    synced(dp, *web(dp))
    dp.set(endpoint_slice(WEB, dp.endpoints(WEB_A, WEB_B), port=8080))
    with inspector.failing_apply(node1, tmp_path):
        assert node1.sync() is False
        assert "simulated restore failure" in node1.last_error
        # The old rules (three endpoints) are still in place and still work.
        counts = tally(dp.lab.http(CLIENT_POD, WEB_VIP, 80, count=30))
        assert set(counts) == set(WEBS), counts
    before = len(node1.results)
    assert node1.sync(), node1.last_error
    assert len(node1.results) == before + 1
    assert node1.last_result is not None and node1.last_result.full  # resync from scratch
    counts = tally(dp.lab.http(CLIENT_POD, WEB_VIP, 80, count=30))
    assert set(counts) == {WEB_A, WEB_B}, counts


def test_removed_service_leaves_no_stale_objects(
    dp: DataplaneCluster, inspector: Inspector
) -> None:
    node1 = dp.agent(NODE1)
    synced(dp, *web(dp), *web(dp, name="gone", vip="10.96.0.50"))
    owned = inspector.service_objects(node1, "default/gone")
    assert owned
    assert all_ok(dp.lab.http(CLIENT_POD, "10.96.0.50", 80))

    dp.delete("Service", "default", "gone")
    dp.delete("EndpointSlice", "default", "gone-slice")
    assert dp.sync(), node1.last_error
    assert node1.last_result is not None and not node1.last_result.full
    assert inspector.service_objects(node1, "default/gone") == set()
    assert not owned & inspector.all_objects(node1), owned & inspector.all_objects(node1)
    [r] = dp.lab.http(CLIENT_POD, "10.96.0.50", 80, timeout=0.5)
    assert not r.ok, r
    assert all_ok(dp.lab.http(CLIENT_POD, WEB_VIP, 80, count=3))  # the other one is intact


def test_udp_service_echoes_through_cluster_ip(dp: DataplaneCluster) -> None:
    synced(
        dp,
        service("dns", "10.96.0.10", 53, target_port=UDP_PORT, protocol="UDP"),
        endpoint_slice("dns", dp.endpoints(*WEBS), port=UDP_PORT, protocol="UDP"),
    )
    results = dp.lab.udp(CLIENT_POD, "10.96.0.10", 53, count=9)
    counts = tally(results)
    assert set(counts) <= set(WEBS) and sum(counts.values()) == 9, counts
    seen = dp.lab.udp(CLIENT_POD, "10.96.0.10", 53, payload="clientip", count=3)
    assert all_ok(seen) and hosts(seen) == {CLIENT_IP}, seen


def test_load_balancer_ip_from_external_host(dp: DataplaneCluster) -> None:
    lb_ip = "192.0.2.10"
    synced(dp, *web(dp, type="LoadBalancer", node_port=30081, load_balancer_ips=[lb_ip]))
    dp.lab.add_route(EXTERNAL, f"{lb_ip}/32", host_ip(dp, NODE1))
    try:
        results = dp.lab.http(EXTERNAL, lb_ip, 80, count=9)
        assert all_ok(results), tally(results)
        assert set(tally(results)) <= set(WEBS)
    finally:
        dp.lab.exec(EXTERNAL, ["ip", "route", "del", f"{lb_ip}/32"])


def test_cleanup_removes_everything(dp: DataplaneCluster, inspector: Inspector) -> None:
    synced(dp, *web(dp, type="NodePort", node_port=NODEPORT))
    assert all_ok(dp.lab.http(CLIENT_POD, WEB_VIP, 80))
    for agent in dp.agents.values():
        agent.cleanup()
        assert inspector.leftovers(agent) == [], agent
    [r] = dp.lab.http(CLIENT_POD, WEB_VIP, 80, timeout=0.5)
    assert not r.ok, r


def test_localhost_nodeport_where_the_mode_supports_it(dp: DataplaneCluster) -> None:
    node1 = dp.agent(NODE1)
    if "localhost-nodeports" not in node1.backend.capabilities:
        pytest.skip(f"mode {dp.mode} does not serve NodePorts on 127.0.0.1")
    synced(dp, *web(dp, type="NodePort", node_port=NODEPORT))
    results = dp.lab.http(NODE1, "127.0.0.1", NODEPORT, count=6)
    assert all_ok(results) and set(tally(results)) <= set(WEBS), results


def test_unused_port_of_cluster_ip_is_refused_where_the_mode_rejects_it(
    dp: DataplaneCluster,
) -> None:
    node1 = dp.agent(NODE1)
    if "reject-unused-clusterip-ports" not in node1.backend.capabilities:
        pytest.skip(f"mode {dp.mode} does not reject unused ports of a ClusterIP")
    synced(dp, *web(dp))
    [r] = dp.lab.http(CLIENT_POD, WEB_VIP, 81, timeout=3.0)
    assert r.outcome == "refused" and r.ms < 500, r
    assert all_ok(dp.lab.http(CLIENT_POD, WEB_VIP, 80, count=3))  # the Service port still works
