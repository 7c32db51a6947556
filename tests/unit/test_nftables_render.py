"""The nftables backend's transactions, against upstream kube-proxy's nftables mode (no root).

Upstream reference: pkg/proxy/nftables/proxier.go (setupNFTables, syncProxyRules,
writeServiceToEndpointRules) and the expected table dumps in its proxier_test.go
(``baseRules``, TestOverallNFTablesRules, TestSyncProxyRulesRepeated). Ported scenarios use
upstream's fake proxier: node "test-node" (192.168.0.2), clusterCIDR 10.0.0.0/8,
nodePortAddresses 192.168.0.2/32 + 2001:db8::1/128, ServiceCIDR 172.30.0.0/16.

A transaction is checked by running it through ``FakeNft``, a small interpreter of the
commands the backend writes that keeps a table the way knftables' fake does and refuses what
the kernel refuses (a rule naming a missing chain or set, deleting a referenced chain or set,
a flush or delete of something that does not exist). Its dump is compared with upstream's
expected dump after upstream's own normalization (sortNFTablesTransaction); the masquerade mark
is written as real kube-proxy writes it (``0x00004000``; upstream's tests inject ``0x4000``).

Golden files live in tests/unit/golden/nftables/; ``KUBEPLEX_UPDATE_GOLDEN=1 pytest
tests/unit/test_nftables_render.py`` rewrites them (review the diff line by line before committing).
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from kits import render_kit
from kits.render_kit import (
    LAB,
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
    svc1,
)

from kubeplex.backends.nftables import NftablesBackend, node_port_ips
from kubeplex.backends.nftables import names as N
from kubeplex.backends.nftables.kernel import NftKernel
from kubeplex.backends.nftables.listing import TableObjects, parse_listing
from kubeplex.backends.nftables.render import FamilyRenderer, NftablesRendered
from kubeplex.backends.nftables.rules import (
    FamilySettings,
    check_comment,
    go_hex_mark,
    service_objects,
    setup_lines,
)
from kubeplex.core.config.kubeproxy import KubeProxyConfiguration, load_config, with_overrides
from kubeplex.core.config.localdetect import LocalDetector
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import BackendContext
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.errors import BackendError
from kubeplex.core.model.graph import ChangeSet, ServiceGraph
from kubeplex.core.model.types import (
    Endpoint,
    IPFamily,
    NodeInfo,
    Protocol,
    ServicePort,
    ServicePortName,
)
from kubeplex.core.sources.manifests import ManifestSource

NODE = "test-node"
GOLDEN = Path(__file__).parent / "golden" / "nftables"

#: upstream's NewFakeProxier.
UPSTREAM: dict[str, Any] = {
    "mode": "nftables",
    "clusterCIDR": "10.0.0.0/8",
    "nodePortAddresses": [f"{NODE_IP}/32", "2001:db8::1/128"],
}
UPSTREAM_SERVICE_CIDRS = ("172.30.0.0/16", "fd00:10:96::/112")


# --- objects ------------------------------------------------------------------------------------


def config(fields: Mapping[str, Any]) -> KubeProxyConfiguration:
    return render_kit.config(fields, known_modes=plugins.known_modes())


def node_obj(addresses: Sequence[str] = (NODE_IP, "2001:db8::1")) -> dict[str, Any]:
    return render_kit.node_obj(addresses, name=NODE)


# --- a fake nft ---------------------------------------------------------------------------------


class NftRefused(Exception):
    """What the kernel (or nft's parser) would refuse: the whole transaction is rolled back."""


@dataclass
class FakeTable:
    spec: str = ""
    chains: dict[str, str] = field(default_factory=dict)  # name -> spec ("" or "{ ... }")
    rules: dict[str, list[str]] = field(default_factory=dict)
    sets: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (kind, spec)
    elements: dict[str, dict[str, tuple[str, str]]] = field(default_factory=dict)


_REF = re.compile(r"(?:jump|goto) (\S+)")
_SETREF = re.compile(r"@(\S+)")
_ELEM = re.compile(r'^(.*?)(?: comment "([^"]*)")?(?: : (.+))?$')


class FakeNft:
    """Runs transactions of the commands the backend writes; all or nothing, like the kernel."""

    def __init__(self) -> None:
        self.tables: dict[str, FakeTable] = {}
        self.transactions: list[str] = []

    def run(self, text: str) -> None:
        import copy

        saved = copy.deepcopy(self.tables)
        try:
            for line in text.splitlines():
                if line and not line.startswith("#"):
                    self._command(line)
        except (NftRefused, KeyError) as err:
            self.tables = saved
            raise NftRefused(f"{err}") from err
        self.transactions.append(text)

    def _table(self, fam: str) -> FakeTable:
        if fam not in self.tables:
            raise NftRefused(f"no table {fam}")
        return self.tables[fam]

    def _refs_to_chain(self, t: FakeTable, chain: str) -> bool:
        if any(chain in _REF.findall(r) for c, rs in t.rules.items() if c != chain for r in rs):
            return True
        return any(
            v[0].split()[-1:] == [chain] for els in t.elements.values() for v in els.values()
        )

    def _command(self, line: str) -> None:
        words = line.split(" ", 4)
        verb, kind, fam = words[0], words[1], f"{words[2]} {words[3]}"
        rest = words[4] if len(words) > 4 else ""
        if kind == "table":
            if verb == "add":
                self.tables.setdefault(fam, FakeTable(spec=rest))
            elif verb == "delete":
                del self.tables[fam]
            return
        t = self._table(fam)
        name, _, tail = rest.partition(" ")
        if kind == "chain":
            if verb == "add":
                if name not in t.chains or tail:
                    t.chains[name] = tail if tail else t.chains.get(name, "")
                t.rules.setdefault(name, [])
            elif verb == "flush":
                if name not in t.rules:
                    self._missing("chain", name)
                t.rules[name].clear()
            elif verb == "delete":
                if name not in t.chains:
                    self._missing("chain", name)
                if self._refs_to_chain(t, name):
                    raise NftRefused(f"chain {name} is still referenced (EBUSY)")
                del t.chains[name], t.rules[name]
        elif kind in ("set", "map"):
            if verb == "add":
                if name not in t.sets or t.sets[name][1] != tail:
                    t.sets[name] = (kind, tail)
                t.elements.setdefault(name, {})
            elif verb == "flush":
                if name not in t.sets:
                    self._missing(kind, name)
                t.elements[name].clear()
            elif verb == "delete":
                if name not in t.sets:
                    self._missing(kind, name)
                if any(name in _SETREF.findall(r) for rs in t.rules.values() for r in rs):
                    raise NftRefused(f"set {name} is still referenced (EBUSY)")
                del t.sets[name], t.elements[name]
        elif kind == "rule":
            if name not in t.chains:
                self._missing("chain", name)
            for target in _REF.findall(tail):
                if target not in t.chains:
                    self._missing("chain", target)
            for s in _SETREF.findall(tail):
                if s not in t.sets:
                    self._missing("set", s)
            t.rules[name].append(tail)
        elif kind == "element":
            if name not in t.sets:
                self._missing("set", name)
            body = tail.removeprefix("{ ").removesuffix(" }")
            m = _ELEM.match(body)
            assert m is not None
            key, comment, value = m.group(1), m.group(2) or "", m.group(3) or ""
            els = t.elements[name]
            if verb == "add":
                if value.startswith(("goto ", "jump ")) and value.split()[1] not in t.chains:
                    self._missing("chain", value.split()[1])
                if key in els and els[key] != (value, comment):
                    raise NftRefused(f"element {key} of {name} exists with another value")
                els[key] = (value, comment)
            elif verb == "delete":
                if key not in els:
                    self._missing("element", f"{name} {{ {key} }}")
                del els[key]
        else:
            raise NftRefused(f"unknown command {line!r}")

    @staticmethod
    def _missing(kind: str, name: str) -> None:
        raise NftRefused(f"No such file or directory: {kind} {name}")

    def dump(self, fam: str = "ip kube-proxy") -> str:
        """The table as knftables' fake dumps it (one "add" line per object, rule, element)."""
        t = self.tables.get(fam)
        if t is None:
            return ""
        out = [f"add table {fam} {t.spec}".rstrip()]
        for name, spec in t.chains.items():
            out.append(f"add chain {fam} {name} {spec}".rstrip())
        for name, (kind, spec) in t.sets.items():
            out.append(f"add {kind} {fam} {name} {spec}".rstrip())
        for name, rules in t.rules.items():
            out += [f"add rule {fam} {name} {r}" for r in rules]
        for name, els in t.elements.items():
            for key, (value, comment) in els.items():
                note = f' comment "{comment}"' if comment else ""
                verdict = f" : {value}" if value else ""
                out.append(f"add element {fam} {name} {{ {key}{note}{verdict} }}")
        return "\n".join(out) + "\n"

    def objects(self) -> dict[str, TableObjects]:
        out = {}
        for fam, t in self.tables.items():
            out[fam.split()[0]] = TableObjects(
                chains=set(t.chains),
                sets={n for n, (k, _) in t.sets.items() if k == "set"},
                maps={n for n, (k, _) in t.sets.items() if k == "map"},
            )
        return out


class FakeKernel:
    """The backend's kernel seam (NftSeam) on top of a FakeNft."""

    writes = ("run", "run_stages")

    def __init__(self, nft: FakeNft | None = None) -> None:
        self.nft = nft or FakeNft()
        self.listings = 0
        self.refuse: str | None = None  # make run() fail with this message (once)
        self.fail_listing = False  # make the listing of a full sync fail

    def run(self, text: str) -> None:
        if self.refuse is not None:
            message, self.refuse = self.refuse, None
            raise BackendError(message)
        try:
            self.nft.run(text)
        except NftRefused as err:
            raise BackendError(f"nft -f failed: {err}") from err

    def run_stages(self, texts: Sequence[str], empty_tables: bool = True) -> None:
        for text in texts:
            self.run(text)

    def list(self, commands: str, terse: bool = False) -> str:
        """``list tables``, the object names of ``list chains/sets/maps FAMILY``, and ``list
        table FAMILY kube-proxy`` (chains with their rules, sets without elements), in nft's
        format (what the backend parses)."""
        if commands == "list tables\n":
            return "".join(f"table {fam}\n" for fam in self.nft.tables)
        if commands.startswith("list table "):
            return self._list_table(commands, terse)
        assert terse and commands.startswith("list chains "), commands
        self.listings += 1
        if self.fail_listing:
            raise BackendError("nft -t -f - failed (exit 1): simulated")
        wanted = {line.split()[2] for line in commands.splitlines()}
        out = []
        for fam, objs in self.nft.objects().items():
            if fam not in wanted:
                continue
            out.append(f"table {fam} kube-proxy {{\n")
            for kind, found in (("chain", objs.chains), ("set", objs.sets), ("map", objs.maps)):
                out += [f"\t{kind} {name} {{\n\t}}\n" for name in sorted(found)]
            out.append("}\n")
        return "".join(out)


    def _list_table(self, commands: str, terse: bool) -> str:
        assert terse and commands.count("\n") == 1, commands  # one table per nft run
        self.listings += 1
        fam = commands.split()[2]
        t = self.nft.tables.get(f"{fam} kube-proxy")
        if self.fail_listing or t is None:
            raise BackendError("nft -t -f - failed (exit 1): No such file or directory")
        out = [f"table {fam} kube-proxy {{\n"]
        for name, (kind, _) in t.sets.items():
            out.append(f"\t{kind} {name} {{\n\t}}\n")
        for name in t.chains:
            out.append(f"\tchain {name} {{\n")
            out += [f"\t\t{rule}\n" for rule in t.rules.get(name, [])]
            out.append("\t}\n")
        return "".join([*out, "}\n"])


class NoKernel:
    """A kernel seam that must not be used (render is pure)."""

    writes = ("run", "run_stages")

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the kernel was used: {name}")


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


# --- harness ------------------------------------------------------------------------------------


class Harness(RenderHarness[NftablesBackend, NftablesRendered]):
    """ClusterState + NftablesBackend over a FakeNft: render, apply, inspect."""

    def __init__(
        self,
        objects: Iterable[Mapping[str, Any]] = (),
        cfg: Mapping[str, Any] | KubeProxyConfiguration = UPSTREAM,
        families: tuple[IPFamily, ...] = (V4,),
        node: str = NODE,
        service_cidrs: tuple[str, ...] = UPSTREAM_SERVICE_CIDRS,
        kernel: FakeKernel | None = None,
    ) -> None:
        self.kernel: FakeKernel = kernel if kernel is not None else FakeKernel()
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

    def use(self, kernel: FakeKernel) -> None:
        """Program ``kernel`` from now on (the backend's injected seam)."""
        self.kernel = self.backend.kernel = kernel

    def sync(self, full: bool = False) -> NftablesRendered:
        """Observe, render and apply (the backend's real steps, on the fake kernel)."""
        state = self.cluster.checkout(full=full)
        rendered = self.backend.render(state, self.backend.observe(state))
        self.backend.apply(rendered)
        return rendered

    def dump(self, family: IPFamily = V4) -> str:
        return self.kernel.nft.dump("ip6 kube-proxy" if family is V6 else "ip kube-proxy")


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


# --- 1. names -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "hashed"),
    [
        # From upstream's expected dumps.
        ("ns1/svc1/tcp/p80", "ULMVA6XW"),
        ("ns2/svc2/tcp/p80", "42NFTM6N"),
        ("ns3/svc3/tcp/p80", "4AT6LBPK"),
        ("ns4/svc4/tcp/p80", "LAUZTJTB"),
        ("ns5/svc5/tcp/p80", "HVFWP5L3"),
        ("ns2/svc2/tcp/p8080", "MHHHYRWA"),
        ("ns1/svc1/tcp/p80__10.180.0.1/80", "5OJB2KTY"),
        ("ns2/svc2/tcp/p80__10.180.0.2/80", "SGOXE6O3"),
        ("ns4/svc4/tcp/p80__10.180.0.5/80", "5RFCDDV7"),
        ("ns5/svc5/tcp/p80__10.180.0.3/80", "GTK6MW7G"),
        ("ns3/svc3/tcp/p80__10.0.3.2/80", "SWWHDC7X"),
        # The seed's nft listing.
        ("default/web/tcp/", "PFISGYVC"),
    ],
)
def test_hash8_matches_upstream(text: str, hashed: str) -> None:
    import base64
    import hashlib

    assert N.hash8(text) == hashed
    assert base64.b32encode(hashlib.sha256(text.encode()).digest()).decode()[:8] == hashed


def test_chain_names() -> None:
    spn = ServicePortName("ns1", "svc1", "p80", Protocol.TCP)
    assert N.service_chain(spn) == "service-ULMVA6XW-ns1/svc1/tcp/p80"
    assert N.local_chain(spn) == "local-ULMVA6XW-ns1/svc1/tcp/p80"
    assert N.external_chain(spn) == "external-ULMVA6XW-ns1/svc1/tcp/p80"
    assert N.firewall_chain(spn) == "firewall-ULMVA6XW-ns1/svc1/tcp/p80"
    e = Endpoint("10.180.0.1", 80)
    assert N.endpoint_chain(spn, e) == "endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"
    assert N.affinity_set(spn, e) == "affinity-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"
    assert N.service_chain(ServicePortName("default", "web")) == "service-PFISGYVC-default/web/tcp/"
    udp = ServicePortName("kube-system", "dns", "dns", Protocol.UDP)
    assert N.service_chain(udp).endswith("-kube-system/dns/udp/dns")


def test_ipv6_endpoint_names_have_no_colons() -> None:
    spn = ServicePortName("ns1", "svc1", "p80")
    name = N.endpoint_chain(spn, Endpoint("fd00:10:180::2:1", 80))
    assert name.endswith("-ns1/svc1/tcp/p80__fd00.10.180..2.1/80") and ":" not in name
    assert N.hash8("ns1/svc1/tcp/p80__fd00.10.180..2.1/80") in name


def test_long_names_are_truncated_like_upstream() -> None:
    spn = ServicePortName("n" * 63, "s" * 63, "p" * 63)
    base = N.endpoint_base(spn, Endpoint("fd00:1111:2222:3333:4444:5555:6666:7777", 65535))
    assert len(base) == N.BASE_LENGTH_MAX and base.endswith("...")
    assert len(N.ENDPOINT_PREFIX + base) <= N.NAME_LENGTH_MAX
    assert len(N.service_base(spn)) < N.BASE_LENGTH_MAX  # never truncated (205 at most)


def test_service_chain_test() -> None:
    assert N.is_service_chain("service-ULMVA6XW-ns1/svc1/tcp/p80")
    assert not any(N.is_service_chain(c) for c in ("services", "reject-chain", "nat-output"))
    assert N.is_affinity_set("affinity-X-a/b/tcp/__1.2.3.4/80")


# --- 2. the seed lab ----------------------------------------------------------------------------


def lab_harness() -> Harness:
    base = load_config(LAB / "config.yaml", plugins.known_modes())
    cfg = with_overrides(base, mode="nftables", known_modes=plugins.known_modes())
    # No upstream ServiceCIDRs: the lab's own ServiceCIDR comes with its manifests.
    h = Harness(cfg=cfg, families=(V4, V6), node=cfg.hostname_override, service_cidrs=())
    source = ManifestSource(LAB / "manifests", h.cluster)
    source.load()
    assert not source.problems and not h.cluster.invalid
    return h


def test_seed_lab_golden() -> None:
    assert_golden("seed-lab", lab_harness().render(full=True))


def test_seed_lab_applies_and_matches_the_seed() -> None:
    h = lab_harness()
    h.sync(full=True)
    dump = h.dump()
    svc = "service-PFISGYVC-default/web/tcp/"
    # map service-ips { type ipv4_addr . inet_proto . inet_service : verdict ... }
    assert (
        "add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service :"
        ' verdict ; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }'
    ) in dump
    assert f"{{ 10.96.88.59 . tcp . 80 : goto {svc} }}" in elements_of(dump, "service-ips")
    # services: ip daddr . meta l4proto . th dport vmap @service-ips, then NodePorts.
    assert rules_of(dump, "services") == [
        "ip daddr . meta l4proto . th dport vmap @service-ips",
        "ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports",
    ]
    # numgen random mod 3 over the three pods (through endpoint chains, see below).
    numgen = rules_of(dump, svc)[-1]
    assert numgen.startswith("numgen random mod 3 vmap { 0 : goto endpoint-")
    assert [m.split("__")[1] for m in re.findall(r"goto (\S+)", numgen)] == [
        "10.244.1.2/8080",
        "10.244.2.2/8080",
        "10.244.2.3/8080",
    ]
    # Masquerade off-cluster sources (seed: ip saddr != 10.244.0.0/16 ... mark | 0x00004000).
    assert rules_of(dump, svc)[0] == (
        "ip daddr 10.96.88.59 tcp dport 80 ip saddr != 10.244.0.0/16 jump mark-for-masquerade"
    )
    assert rules_of(dump, "mark-for-masquerade") == ["mark set mark or 0x00004000"]
    # "the nodeport-ips set held only the node's primary address"; never localhost.
    assert elements_of(dump, "nodeport-ips") == ["{ 172.18.0.5 }"]
    assert "127.0.0.0/8" not in rules_of(dump, "services")[1]
    assert elements_of(dump, "service-nodeports") == [
        "{ tcp . 30080 : goto external-SXIFFM75-default/web-nodeport/tcp/ }"
    ]
    # Everything in its own tables.
    assert set(h.kernel.nft.tables) == {"ip kube-proxy", "ip6 kube-proxy"}
    # cluster-ips-check rejects unused ports of a ClusterIP, and drops traffic to addresses of
    # the lab's ServiceCIDR "kubernetes" that no Service has.
    assert rules_of(dump, "cluster-ips-check") == [
        'ip daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"',
        'ip daddr { 10.96.0.0/16 } drop comment "Drop traffic to unallocated ClusterIPs"',
    ]
    assert elements_of(dump, "cluster-ips") == ["{ 10.96.88.59 }", "{ 10.96.223.155 }"]


def test_seed_base_chains_hooks_and_priorities() -> None:
    h = lab_harness()
    h.sync(full=True)
    chains = h.kernel.nft.tables["ip kube-proxy"].chains
    assert {c: spec for c, spec in chains.items() if spec and "hook" in spec} == {
        "filter-prerouting-pre-dnat": "{ type filter hook prerouting priority -110 ; }",
        "filter-output-pre-dnat": "{ type filter hook output priority -110 ; }",
        "filter-input": "{ type filter hook input priority 0 ; }",
        "filter-forward": "{ type filter hook forward priority 0 ; }",
        "filter-output": "{ type filter hook output priority 0 ; }",
        "nat-prerouting": "{ type nat hook prerouting priority -100 ; }",
        "nat-output": "{ type nat hook output priority -100 ; }",
        "nat-postrouting": "{ type nat hook postrouting priority 100 ; }",
    }


def test_seed_ipv6_table_serves_nodeports_everywhere_but_localhost() -> None:
    # "primary" with no IPv6 node address leaves IPv6 NodePorts on every local address, as
    # cmd/kube-proxy does (it only turns the node's IPs into /32 and /128 CIDRs).
    h = lab_harness()
    h.sync(full=True)
    dump6 = h.dump(V6)
    assert "nodeport-ips" not in dump6
    assert (
        "add rule ip6 kube-proxy services fib daddr type local ip6 daddr != ::1"
        " meta l4proto . th dport vmap @service-nodeports"
    ) in dump6


# --- 3. scenarios ported from upstream's proxier_test.go ----------------------------------------

UPSTREAM_BASE_RULES = """
add table ip kube-proxy { comment "rules for kube-proxy" ; }

add set ip kube-proxy cluster-ips { type ipv4_addr ; comment "Active ClusterIPs" ; }
add set ip kube-proxy nodeport-ips { type ipv4_addr ; comment "IPs that accept NodePort traffic" ; }

add map ip kube-proxy firewall-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "destinations that are subject to LoadBalancerSourceRanges" ; }
add map ip kube-proxy no-endpoint-nodeports { type inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to service nodeports with no endpoints" ; }
add map ip kube-proxy no-endpoint-services { type ipv4_addr . inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to services with no endpoints" ; }
add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }
add map ip kube-proxy service-nodeports { type inet_proto . inet_service : verdict ; comment "NodePort traffic" ; }

add chain ip kube-proxy cluster-ips-check
add chain ip kube-proxy filter-prerouting-pre-dnat { type filter hook prerouting priority -110 ; }
add chain ip kube-proxy filter-output-pre-dnat { type filter hook output priority -110 ; }
add chain ip kube-proxy filter-forward { type filter hook forward priority 0 ; }
add chain ip kube-proxy filter-input { type filter hook input priority 0 ; }
add chain ip kube-proxy filter-output { type filter hook output priority 0 ; }
add chain ip kube-proxy firewall-check
add chain ip kube-proxy mark-for-masquerade
add chain ip kube-proxy masquerading
add chain ip kube-proxy nat-output { type nat hook output priority -100 ; }
add chain ip kube-proxy nat-postrouting { type nat hook postrouting priority 100 ; }
add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }
add chain ip kube-proxy nodeport-endpoints-check
add chain ip kube-proxy reject-chain { comment "helper for @no-endpoint-services / @no-endpoint-nodeports" ; }
add chain ip kube-proxy services
add chain ip kube-proxy service-endpoints-check

add rule ip kube-proxy cluster-ips-check ip daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"
add rule ip kube-proxy cluster-ips-check ip daddr { 172.30.0.0/16 } drop comment "Drop traffic to unallocated ClusterIPs"
add rule ip kube-proxy filter-prerouting-pre-dnat ct state new jump firewall-check
add rule ip kube-proxy filter-forward ct state new jump service-endpoints-check
add rule ip kube-proxy filter-forward ct state new jump cluster-ips-check
add rule ip kube-proxy filter-input ct state new jump nodeport-endpoints-check
add rule ip kube-proxy filter-input ct state new jump service-endpoints-check
add rule ip kube-proxy filter-output ct state new jump service-endpoints-check
add rule ip kube-proxy filter-output-pre-dnat ct state new jump firewall-check
add rule ip kube-proxy filter-output ct state new jump cluster-ips-check
add rule ip kube-proxy firewall-check ip daddr . meta l4proto . th dport vmap @firewall-ips
add rule ip kube-proxy mark-for-masquerade mark set mark or 0x4000
add rule ip kube-proxy masquerading mark and 0x4000 == 0 return
add rule ip kube-proxy masquerading mark set mark xor 0x4000
add rule ip kube-proxy masquerading masquerade fully-random
add rule ip kube-proxy nat-output jump services
add rule ip kube-proxy nat-postrouting jump masquerading
add rule ip kube-proxy nat-prerouting jump services
add rule ip kube-proxy nodeport-endpoints-check ip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports
add rule ip kube-proxy reject-chain reject
add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips
add rule ip kube-proxy services ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports

add element ip kube-proxy nodeport-ips { 192.168.0.2 }
add rule ip kube-proxy service-endpoints-check ip daddr . meta l4proto . th dport vmap @no-endpoint-services
"""  # noqa: E501 - upstream's lines, verbatim

UPSTREAM_OVERALL = """
# svc1
add chain ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80
add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 ip daddr 172.30.0.41 tcp dport 80 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 }

add chain ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80
add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 ip saddr 10.180.0.1 jump mark-for-masquerade
add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 meta l4proto tcp dnat to 10.180.0.1:80

add element ip kube-proxy cluster-ips { 172.30.0.41 }
add element ip kube-proxy service-ips { 172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }

# svc2
add chain ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80
add rule ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80 ip daddr 172.30.0.42 tcp dport 80 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80 }
add chain ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 ip saddr 10.0.0.0/8 goto service-42NFTM6N-ns2/svc2/tcp/p80 comment "short-circuit pod traffic"
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local jump mark-for-masquerade comment "masquerade local traffic"
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local goto service-42NFTM6N-ns2/svc2/tcp/p80 comment "short-circuit local traffic"
add chain ip kube-proxy endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80
add rule ip kube-proxy endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80 ip saddr 10.180.0.2 jump mark-for-masquerade
add rule ip kube-proxy endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80 meta l4proto tcp dnat to 10.180.0.2:80

add element ip kube-proxy cluster-ips { 172.30.0.42 }
add element ip kube-proxy service-ips { 172.30.0.42 . tcp . 80 : goto service-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy service-ips { 192.168.99.22 . tcp . 80 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy service-ips { 1.2.3.4 . tcp . 80 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy service-nodeports { tcp . 3001 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }

add element ip kube-proxy no-endpoint-nodeports { tcp . 3001 comment "ns2/svc2:p80" : drop }
add element ip kube-proxy no-endpoint-services { 1.2.3.4 . tcp . 80 comment "ns2/svc2:p80" : drop }
add element ip kube-proxy no-endpoint-services { 192.168.99.22 . tcp . 80 comment "ns2/svc2:p80" : drop }

# svc3
add chain ip kube-proxy service-4AT6LBPK-ns3/svc3/tcp/p80
add rule ip kube-proxy service-4AT6LBPK-ns3/svc3/tcp/p80 ip daddr 172.30.0.43 tcp dport 80 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-4AT6LBPK-ns3/svc3/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-UEIP74TE-ns3/svc3/tcp/p80__10.180.0.3/80 }
add chain ip kube-proxy external-4AT6LBPK-ns3/svc3/tcp/p80
add rule ip kube-proxy external-4AT6LBPK-ns3/svc3/tcp/p80 jump mark-for-masquerade
add rule ip kube-proxy external-4AT6LBPK-ns3/svc3/tcp/p80 goto service-4AT6LBPK-ns3/svc3/tcp/p80
add chain ip kube-proxy endpoint-UEIP74TE-ns3/svc3/tcp/p80__10.180.0.3/80
add rule ip kube-proxy endpoint-UEIP74TE-ns3/svc3/tcp/p80__10.180.0.3/80 ip saddr 10.180.0.3 jump mark-for-masquerade
add rule ip kube-proxy endpoint-UEIP74TE-ns3/svc3/tcp/p80__10.180.0.3/80 meta l4proto tcp dnat to 10.180.0.3:80

add element ip kube-proxy cluster-ips { 172.30.0.43 }
add element ip kube-proxy service-ips { 172.30.0.43 . tcp . 80 : goto service-4AT6LBPK-ns3/svc3/tcp/p80 }
add element ip kube-proxy service-nodeports { tcp . 3003 : goto external-4AT6LBPK-ns3/svc3/tcp/p80 }

# svc4
add chain ip kube-proxy service-LAUZTJTB-ns4/svc4/tcp/p80
add rule ip kube-proxy service-LAUZTJTB-ns4/svc4/tcp/p80 ip daddr 172.30.0.44 tcp dport 80 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-LAUZTJTB-ns4/svc4/tcp/p80 numgen random mod 2 vmap { 0 : goto endpoint-UNZV3OEC-ns4/svc4/tcp/p80__10.180.0.4/80 , 1 : goto endpoint-5RFCDDV7-ns4/svc4/tcp/p80__10.180.0.5/80 }
add chain ip kube-proxy external-LAUZTJTB-ns4/svc4/tcp/p80
add rule ip kube-proxy external-LAUZTJTB-ns4/svc4/tcp/p80 jump mark-for-masquerade
add rule ip kube-proxy external-LAUZTJTB-ns4/svc4/tcp/p80 goto service-LAUZTJTB-ns4/svc4/tcp/p80
add chain ip kube-proxy endpoint-5RFCDDV7-ns4/svc4/tcp/p80__10.180.0.5/80
add rule ip kube-proxy endpoint-5RFCDDV7-ns4/svc4/tcp/p80__10.180.0.5/80 ip saddr 10.180.0.5 jump mark-for-masquerade
add rule ip kube-proxy endpoint-5RFCDDV7-ns4/svc4/tcp/p80__10.180.0.5/80 meta l4proto tcp dnat to 10.180.0.5:80
add chain ip kube-proxy endpoint-UNZV3OEC-ns4/svc4/tcp/p80__10.180.0.4/80
add rule ip kube-proxy endpoint-UNZV3OEC-ns4/svc4/tcp/p80__10.180.0.4/80 ip saddr 10.180.0.4 jump mark-for-masquerade
add rule ip kube-proxy endpoint-UNZV3OEC-ns4/svc4/tcp/p80__10.180.0.4/80 meta l4proto tcp dnat to 10.180.0.4:80

add element ip kube-proxy cluster-ips { 172.30.0.44 }
add element ip kube-proxy service-ips { 172.30.0.44 . tcp . 80 : goto service-LAUZTJTB-ns4/svc4/tcp/p80 }
add element ip kube-proxy service-ips { 192.168.99.33 . tcp . 80 : goto external-LAUZTJTB-ns4/svc4/tcp/p80 }

# svc5
add set ip kube-proxy affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 { type ipv4_addr ; flags dynamic,timeout ; timeout 10800s ; }
add chain ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80
add rule ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80 ip daddr 172.30.0.45 tcp dport 80 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80 ip saddr @affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 goto endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80
add rule ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 }
add chain ip kube-proxy external-HVFWP5L3-ns5/svc5/tcp/p80
add rule ip kube-proxy external-HVFWP5L3-ns5/svc5/tcp/p80 jump mark-for-masquerade
add rule ip kube-proxy external-HVFWP5L3-ns5/svc5/tcp/p80 goto service-HVFWP5L3-ns5/svc5/tcp/p80

add chain ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80
add rule ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 ip saddr 10.180.0.3 jump mark-for-masquerade
add rule ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 update @affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 { ip saddr }
add rule ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 meta l4proto tcp dnat to 10.180.0.3:80

add chain ip kube-proxy firewall-HVFWP5L3-ns5/svc5/tcp/p80
add rule ip kube-proxy firewall-HVFWP5L3-ns5/svc5/tcp/p80 ip saddr != { 203.0.113.0/25 } drop

add element ip kube-proxy cluster-ips { 172.30.0.45 }
add element ip kube-proxy service-ips { 172.30.0.45 . tcp . 80 : goto service-HVFWP5L3-ns5/svc5/tcp/p80 }
add element ip kube-proxy service-ips { 5.6.7.8 . tcp . 80 : goto external-HVFWP5L3-ns5/svc5/tcp/p80 }
add element ip kube-proxy service-nodeports { tcp . 3002 : goto external-HVFWP5L3-ns5/svc5/tcp/p80 }
add element ip kube-proxy firewall-ips { 5.6.7.8 . tcp . 80 : goto firewall-HVFWP5L3-ns5/svc5/tcp/p80 }

# svc6
add element ip kube-proxy cluster-ips { 172.30.0.46 }
add element ip kube-proxy no-endpoint-services { 172.30.0.46 . tcp . 80 comment "ns6/svc6:p80" : goto reject-chain }
"""  # noqa: E501 - upstream's lines, verbatim


def overall_objects() -> list[dict[str, Any]]:
    """TestOverallNFTablesRules: ClusterIP, LB (Local), NodePort, ExternalIP, LB with source
    ranges and affinity, and a Service without endpoints."""
    return render_kit.overall_objects(
        node_obj(),
        NODE,
        sessionAffinity="ClientIP",
        sessionAffinityConfig={"clientIP": {"timeoutSeconds": 10800}},
    )


def test_upstream_overall_golden() -> None:
    assert_golden("upstream-overall", render(overall_objects()))


def test_upstream_overall_table() -> None:
    h = Harness(overall_objects())
    h.sync()
    assert_same_table(UPSTREAM_BASE_RULES + UPSTREAM_OVERALL, h.dump())
    # A second full sync (no base-chain re-creation this time) leaves the same table.
    h.sync(full=True)
    assert_same_table(UPSTREAM_BASE_RULES + UPSTREAM_OVERALL, h.dump())


def test_v1_33_overall_table_item_for_item() -> None:
    """The whole table of kube-proxy 1.33's TestOverallNFTablesRules (a golden file of its
    expected dump), item for item: every chain, rule, set, map and element."""
    expected = (GOLDEN / "v1.33-overall-table.txt").read_text()
    h = Harness(overall_objects())
    h.sync()
    assert_same_table(expected, h.dump())
    assert len(normalized(expected)) == len(normalized(h.dump()))


def test_first_sync_recreates_base_chains_once() -> None:
    h = Harness(overall_objects())
    first = lines_of(h.sync())
    assert "delete chain ip kube-proxy nat-prerouting" in first
    assert "add chain ip kube-proxy nat-prerouting" in first
    second = lines_of(h.sync(full=True))
    assert not any(line.startswith("delete chain ip kube-proxy nat-") for line in second)


def _svc(
    ns: str, name: str, prt: str, ip: str, pnum: int, h: str, eps: Sequence[tuple[str, str]]
) -> str:
    """Upstream's dump of a ClusterIP service with endpoints (name hashes as upstream's)."""
    chain = f"service-{h}-{ns}/{name}/tcp/{prt}"
    epc = [(f"endpoint-{eh}-{ns}/{name}/tcp/{prt}__{eip}/{pnum}", eip) for eh, eip in eps]
    vmap = " , ".join(f"{i} : goto {c}" for i, (c, _) in enumerate(epc))
    out = [
        f"add element ip kube-proxy cluster-ips {{ {ip} }}",
        f"add element ip kube-proxy service-ips {{ {ip} . tcp . {pnum} : goto {chain} }}",
        f"add chain ip kube-proxy {chain}",
        f"add rule ip kube-proxy {chain} ip daddr {ip} tcp dport {pnum} ip saddr != 10.0.0.0/8"
        " jump mark-for-masquerade",
        f"add rule ip kube-proxy {chain} numgen random mod {len(epc)} vmap {{ {vmap} }}",
    ]
    for c, eip in epc:
        out += [
            f"add chain ip kube-proxy {c}",
            f"add rule ip kube-proxy {c} ip saddr {eip} jump mark-for-masquerade",
            f"add rule ip kube-proxy {c} meta l4proto tcp dnat to {eip}:{pnum}",
        ]
    return "\n".join(out) + "\n"


def _no_endpoints(ns: str, name: str, prt: str, ip: str) -> str:
    return (
        f"add element ip kube-proxy cluster-ips {{ {ip} }}\n"
        f"add element ip kube-proxy no-endpoint-services {{ {ip} . tcp . 80 comment"
        f' "{ns}/{name}:{prt}" : goto reject-chain }}\n'
    )


SVC1 = _svc("ns1", "svc1", "p80", "172.30.0.41", 80, "ULMVA6XW", [("5TPGNJF2", "10.0.1.1")])
SVC2 = _svc("ns2", "svc2", "p8080", "172.30.0.42", 8080, "MHHHYRWA", [("7RVP4LUQ", "10.0.2.1")])
SVC3 = _svc("ns3", "svc3", "p80", "172.30.0.43", 80, "4AT6LBPK", [("2OCDJSZQ", "10.0.3.1")])
SVC3B = _svc("ns3", "svc3", "p80", "172.30.0.43", 80, "4AT6LBPK", [("SWWHDC7X", "10.0.3.2")])
SVC3C = _svc(
    "ns3",
    "svc3",
    "p80",
    "172.30.0.43",
    80,
    "4AT6LBPK",
    [("SWWHDC7X", "10.0.3.2"), ("TQ2QKHCZ", "10.0.3.3")],
)
SVC4 = _svc("ns4", "svc4", "p80", "172.30.0.44", 80, "LAUZTJTB", [("WAHRBT2B", "10.0.4.1")])


def _cluster_ip(ns: str, name: str, ip: str, prt: str = "p80", pnum: int = 80) -> dict[str, Any]:
    return service(ns, name, ip, [port(pnum, prt)], type="ClusterIP")


def _slice(
    ns: str, name: str, ips: Sequence[str], prt: str = "p80", pnum: int = 80
) -> dict[str, Any]:
    return endpoint_slice(ns, name, [ep(ip) for ip in ips], [port(pnum, prt)])


def _touches_only(rendered: NftablesRendered, *services: str) -> None:
    """Every command of a partial transaction is about one of ``services`` (ns/name)."""
    pattern = "|".join(re.escape(s) for s in services)
    for line in lines_of(rendered):
        if line.startswith("#"):
            continue
        assert re.search(rf"-(?:{pattern})/", line) or re.search(r"\{ 172\.30\.0\.4\d[ }]", line), (
            line
        )


def _commands(rendered: NftablesRendered) -> list[str]:
    return [ln for ln in lines_of(rendered) if ln and not ln.startswith("#")]


def test_upstream_sync_proxy_rules_repeated() -> None:
    """TestSyncProxyRulesRepeated, step by step: partial syncs leave upstream's table.

    Upstream flushes chains that are no longer needed and deletes them a second later; this
    kernel (>= 6.2) takes the deletion in the same transaction, so they are gone at once.
    """
    h = Harness(
        [
            node_obj(),
            _cluster_ip("ns1", "svc1", "172.30.0.41"),
            _cluster_ip("ns2", "svc2", "172.30.0.42", "p8080", 8080),
            _slice("ns1", "svc1", ["10.0.1.1"]),
            _slice("ns2", "svc2", ["10.0.2.1"], "p8080", 8080),
        ]
    )
    h.sync()
    assert_same_table(UPSTREAM_BASE_RULES + SVC1 + SVC2, h.dump())

    # Add a new service and its endpoints.
    h.feed([_cluster_ip("ns3", "svc3", "172.30.0.43"), _slice("ns3", "svc3", ["10.0.3.1"])])
    r = h.sync()
    assert not r.full
    assert_same_table(UPSTREAM_BASE_RULES + SVC1 + SVC2 + SVC3, h.dump())
    # 2 elements, 2 chains (add + flush + 2 rules each): upstream's 10 operations.
    assert len(_commands(r)) == 10
    _touches_only(r, "ns3/svc3")

    # Delete a service: its elements go, its chains are flushed and deleted.
    h.cluster.delete_service("ns2", "svc2")
    r = h.sync()
    assert_same_table(UPSTREAM_BASE_RULES + SVC1 + SVC3, h.dump())
    assert _commands(r) == [
        "delete element ip kube-proxy cluster-ips { 172.30.0.42 }",
        "delete element ip kube-proxy service-ips { 172.30.0.42 . tcp . 8080 }",
        "flush chain ip kube-proxy endpoint-7RVP4LUQ-ns2/svc2/tcp/p8080__10.0.2.1/8080",
        "flush chain ip kube-proxy service-MHHHYRWA-ns2/svc2/tcp/p8080",
        "delete chain ip kube-proxy endpoint-7RVP4LUQ-ns2/svc2/tcp/p8080__10.0.2.1/8080",
        "delete chain ip kube-proxy service-MHHHYRWA-ns2/svc2/tcp/p8080",
    ]

    # Add a service without endpoints: 2 elements.
    h.feed([_cluster_ip("ns4", "svc4", "172.30.0.44")])
    r = h.sync()
    no_eps = _no_endpoints("ns4", "svc4", "p80", "172.30.0.44")
    assert_same_table(UPSTREAM_BASE_RULES + SVC1 + SVC3 + no_eps, h.dump())
    assert len(_commands(r)) == 2

    # Its endpoints arrive: one element out, one in, two chains (upstream's 10 operations).
    h.feed([_slice("ns4", "svc4", ["10.0.4.1"])])
    r = h.sync()
    assert_same_table(UPSTREAM_BASE_RULES + SVC1 + SVC3 + SVC4, h.dump())
    assert len(_commands(r)) == 10
    _touches_only(r, "ns4/svc4")

    # Change an endpoint: the service chain and the new endpoint chain are written, the old
    # endpoint chain is flushed and deleted.
    h.feed([_slice("ns3", "svc3", ["10.0.3.2"])])
    r = h.sync()
    assert_same_table(UPSTREAM_BASE_RULES + SVC1 + SVC3B + SVC4, h.dump())
    assert len(_commands(r)) == 10
    _touches_only(r, "ns3/svc3")

    # Add an endpoint: the unchanged endpoint chain is left alone (upstream rewrites it too).
    h.feed([_slice("ns3", "svc3", ["10.0.3.2", "10.0.3.3"])])
    r = h.sync()
    assert_same_table(UPSTREAM_BASE_RULES + SVC1 + SVC3C + SVC4, h.dump())
    assert len(_commands(r)) == 8
    assert not any(
        ln.startswith(("flush chain", "add rule")) and "-SWWHDC7X-" in ln.split()[4]
        for ln in _commands(r)
    )

    # Empty a service's endpoints: element swap, three chains flushed and deleted.
    h.feed([_slice("ns3", "svc3", [])])
    r = h.sync()
    no_eps3 = _no_endpoints("ns3", "svc3", "p80", "172.30.0.43")
    assert_same_table(UPSTREAM_BASE_RULES + SVC1 + no_eps3 + SVC4, h.dump())
    assert len(_commands(r)) == 2 + 3 + 3

    # And back: everything is written again.
    h.feed([_slice("ns3", "svc3", ["10.0.3.2", "10.0.3.3"])])
    r = h.sync()
    assert_same_table(UPSTREAM_BASE_RULES + SVC1 + SVC3C + SVC4, h.dump())
    assert len(_commands(r)) == 2 + 3 * 4
    # Nothing pending: a sync without changes writes nothing.
    assert _commands(h.sync()) == []


def test_upstream_no_endpoints_reject() -> None:
    """TestNoEndpointsReject: cluster IP, external IP, NodePort and LB IP all go to reject."""
    h = Harness(
        [
            node_obj(),
            svc1("LoadBalancer", externalIPs=["192.168.99.11"], ingress=["1.2.3.4"]),
        ]
    )
    assert_golden("upstream-no-endpoints", h.sync())
    dump = h.dump()
    assert elements_of(dump, "no-endpoint-services") == [
        '{ 172.30.0.41 . tcp . 80 comment "ns1/svc1:p80" : goto reject-chain }',
        '{ 192.168.99.11 . tcp . 80 comment "ns1/svc1:p80" : goto reject-chain }',
        '{ 1.2.3.4 . tcp . 80 comment "ns1/svc1:p80" : goto reject-chain }',
    ]
    assert elements_of(dump, "no-endpoint-nodeports") == [
        '{ tcp . 3001 comment "ns1/svc1:p80" : goto reject-chain }'
    ]
    assert elements_of(dump, "service-ips") == [] and "service-ULMVA6XW" not in dump


def test_upstream_external_traffic_policy_local() -> None:
    """TestExternalTrafficPolicyLocal: external traffic goes to the local endpoint only,
    unmasqueraded; pod and node traffic is short-circuited to the cluster chain."""
    h = Harness(render_kit.etp_local_objects(node_obj(), NODE))
    assert_golden("upstream-etp-local", h.sync())
    dump = h.dump()
    ext = "external-ULMVA6XW-ns1/svc1/tcp/p80"
    assert rules_of(dump, ext) == [
        "ip saddr 10.0.0.0/8 goto service-ULMVA6XW-ns1/svc1/tcp/p80"
        ' comment "short-circuit pod traffic"',
        'fib saddr type local jump mark-for-masquerade comment "masquerade local traffic"',
        "fib saddr type local goto service-ULMVA6XW-ns1/svc1/tcp/p80"
        ' comment "short-circuit local traffic"',
        "goto local-ULMVA6XW-ns1/svc1/tcp/p80",
    ]
    local = rules_of(dump, "local-ULMVA6XW-ns1/svc1/tcp/p80")
    assert local == [
        "numgen random mod 1 vmap { 0 : goto endpoint-"
        + N.hash8("ns1/svc1/tcp/p80__10.180.2.1/80")
        + "-ns1/svc1/tcp/p80__10.180.2.1/80 }"
    ]
    assert "mod 2" in rules_of(dump, "service-ULMVA6XW-ns1/svc1/tcp/p80")[-1]
    assert elements_of(dump, "no-endpoint-services") == []


def test_external_traffic_policy_local_without_local_endpoints_drops() -> None:
    h = Harness(
        [
            node_obj(),
            svc1("NodePort", externalTrafficPolicy="Local"),
            endpoint_slice("ns1", "svc1", [ep("10.180.0.1", "other-node")]),
        ]
    )
    r = h.sync()
    dump = h.dump()
    assert elements_of(dump, "no-endpoint-nodeports") == [
        '{ tcp . 3001 comment "ns1/svc1:p80" : drop }'
    ]
    # The external chain still short-circuits pod and node traffic, but has no final goto.
    assert rules_of(dump, "external-ULMVA6XW-ns1/svc1/tcp/p80")[-1].endswith(
        'comment "short-circuit local traffic"'
    )
    assert r.plans[0].no_local_endpoints == {"internal": 0, "external": 1}


def test_upstream_internal_traffic_policy_local() -> None:
    h = Harness(
        [
            node_obj(),
            service("ns1", "svc1", "172.30.1.1", [port()], internalTrafficPolicy="Local"),
            endpoint_slice("ns1", "svc1", [ep("10.0.1.1", NODE), ep("10.0.1.2", "host1")]),
        ]
    )
    assert_golden("upstream-itp-local", h.sync())
    dump = h.dump()
    local = "local-" + N.hash8("ns1/svc1/tcp/p80") + "-ns1/svc1/tcp/p80"
    assert elements_of(dump, "service-ips") == [f"{{ 172.30.1.1 . tcp . 80 : goto {local} }}"]
    assert rules_of(dump, local)[0] == (
        "ip daddr 172.30.1.1 tcp dport 80 ip saddr != 10.0.0.0/8 jump mark-for-masquerade"
    )
    assert "service-" + N.hash8("ns1/svc1/tcp/p80") not in dump


def test_internal_traffic_policy_local_without_local_endpoints_drops() -> None:
    h = Harness(
        [
            node_obj(),
            service("ns1", "svc1", "172.30.1.1", [port()], internalTrafficPolicy="Local"),
            endpoint_slice("ns1", "svc1", [ep("10.0.1.2", "host1")]),
        ]
    )
    r = h.sync()
    assert elements_of(h.dump(), "no-endpoint-services") == [
        '{ 172.30.1.1 . tcp . 80 comment "ns1/svc1:p80" : drop }'
    ]
    assert r.plans[0].no_local_endpoints == {"internal": 1, "external": 0}


def test_upstream_load_balancer_source_ranges_allow_the_node() -> None:
    """TestLoadBalancer: the source ranges include the node IP, so the LB IPs are allowed as
    sources too; NodePorts are not subject to the ranges."""
    h = Harness(render_kit.lb_source_ranges_objects(node_obj()))
    assert_golden("upstream-loadbalancer", h.sync())
    dump = h.dump()
    fw = "firewall-ULMVA6XW-ns1/svc1/tcp/p80"
    assert rules_of(dump, fw) == [
        "ip saddr != { 192.168.0.0/24 , 203.0.113.0/25 , 1.2.3.4 , 5.6.7.8 } drop"
    ]
    assert elements_of(dump, "firewall-ips") == [
        f"{{ 1.2.3.4 . tcp . 80 : goto {fw} }}",
        f"{{ 5.6.7.8 . tcp . 80 : goto {fw} }}",
    ]
    assert elements_of(dump, "service-nodeports") == [
        "{ tcp . 3001 : goto external-ULMVA6XW-ns1/svc1/tcp/p80 }"
    ]


def test_source_ranges_without_the_node_ip_do_not_allow_the_vips() -> None:
    h = Harness(
        [
            node_obj(),
            svc1(
                "LoadBalancer",
                ports=[port()],
                loadBalancerSourceRanges=["203.0.113.0/25"],
                ingress=["1.2.3.4"],
            ),
            endpoint_slice("ns1", "svc1", [ep("10.180.0.1")]),
        ]
    )
    h.sync()
    assert rules_of(h.dump(), "firewall-ULMVA6XW-ns1/svc1/tcp/p80") == [
        "ip saddr != { 203.0.113.0/25 } drop"
    ]


def test_upstream_ipv6_nodeports_on_every_address() -> None:
    """TestNodePorts "ipv6" (no nodePortAddresses at the proxier, i.e. ::/0 in the config):
    fib daddr type local, never ::1."""
    h = Harness(
        [
            node_obj(),
            service("ns1", "svc1", "fd00:172:30::41", [port(node_port=3001)], type="NodePort"),
            endpoint_slice(
                "ns1",
                "svc1",
                [ep("fd00:10:180::1"), ep("fd00:10:180::2:1", NODE)],
                family="IPv6",
            ),
        ],
        {"mode": "nftables", "clusterCIDR": "fd00:10::/64", "nodePortAddresses": ["::/0"]},
        families=(V6,),
    )
    assert_golden("upstream-ipv6-nodeports", h.sync())
    dump = h.dump(V6)
    assert (
        "add rule ip6 kube-proxy services fib daddr type local ip6 daddr != ::1"
        " meta l4proto . th dport vmap @service-nodeports"
    ) in dump
    assert (
        "add rule ip6 kube-proxy nodeport-endpoints-check ip6 daddr != ::1"
        " meta l4proto . th dport vmap @no-endpoint-nodeports"
    ) in dump
    assert "nodeport-ips" not in dump
    ep_chain = "endpoint-" + N.hash8("ns1/svc1/tcp/p80__fd00.10.180..2.1/80")
    assert f"add rule ip6 kube-proxy {ep_chain}-ns1/svc1/tcp/p80__fd00.10.180..2.1/80" in dump
    assert "meta l4proto tcp dnat to [fd00:10:180::2:1]:80" in dump
    masq = "ip6 daddr fd00:172:30::41 tcp dport 80 ip6 saddr != fd00:10::/64"
    masq += " jump mark-for-masquerade"
    assert masq in dump
    assert "add element ip6 kube-proxy cluster-ips { fd00:172:30::41 }" in dump
    # The IPv6 ServiceCIDR drop rule.
    assert "ip6 daddr { fd00:10:96::/112 } drop" in dump


def test_upstream_cluster_ip_general() -> None:
    """TestClusterIPGeneral: TCP, UDP and SCTP ports of one Service share its cluster-ips
    element; each port has its own service-ips element and chain."""
    ports = [
        port(80, "http"),
        port(443, "https"),
        port(53, "dns-udp", "UDP"),
        port(53, "dns-tcp"),
        port(53, "dns-sctp", "SCTP"),
    ]
    slice_ports = [
        port(80, "http"),
        port(8443, "https"),
        port(53, "dns-udp", "UDP"),
        port(5353, "dns-tcp"),
        port(53, "dns-sctp", "SCTP"),
    ]
    h = Harness(
        [
            node_obj(),
            service("ns2", "svc2", "172.30.0.42", ports),
            endpoint_slice(
                "ns2", "svc2", [ep("10.180.0.1", NODE), ep("10.180.2.1", "node2")], slice_ports
            ),
        ]
    )
    assert_golden("upstream-cluster-ip-general", h.sync())
    dump = h.dump()
    assert elements_of(dump, "cluster-ips") == ["{ 172.30.0.42 }"]
    assert sorted(elements_of(dump, "service-ips")) == sorted(
        f"{{ 172.30.0.42 . {proto} . {p} : goto service-{N.hash8(f'ns2/svc2/{proto}/{name}')}"
        f"-ns2/svc2/{proto}/{name} }}"
        for proto, p, name in [
            ("tcp", 80, "http"),
            ("tcp", 443, "https"),
            ("udp", 53, "dns-udp"),
            ("tcp", 53, "dns-tcp"),
            ("sctp", 53, "dns-sctp"),
        ]
    )
    assert "meta l4proto tcp dnat to 10.180.2.1:5353" in dump
    assert "meta l4proto sctp dnat to 10.180.0.1:53" in dump
    assert "meta l4proto udp dnat to 10.180.0.1:53" in dump
    # Removing one port keeps the shared cluster-ips element.
    h.feed([service("ns2", "svc2", "172.30.0.42", ports[:-1])])
    r = h.sync()
    assert elements_of(h.dump(), "cluster-ips") == ["{ 172.30.0.42 }"]
    assert "delete element ip kube-proxy cluster-ips { 172.30.0.42 }" not in lines_of(r)
    # Removing the Service removes it.
    h.cluster.delete_service("ns2", "svc2")
    r = h.sync()
    assert "delete element ip kube-proxy cluster-ips { 172.30.0.42 }" in lines_of(r)
    assert elements_of(h.dump(), "cluster-ips") == []


READY = {"ready": True, "serving": True, "terminating": False}
TERMINATING = {"ready": False, "serving": True, "terminating": True}
GONE = {"ready": False, "serving": False, "terminating": True}


def terminating_objects(policy: str, endpoints: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return render_kit.terminating_objects(node_obj(), policy, endpoints)


@pytest.mark.parametrize(
    ("golden", "policy", "endpoints", "local", "cluster"),
    [
        (
            "upstream-terminating-local-ready",
            "Local",
            [
                ep("10.0.1.1", NODE, **READY),
                ep("10.0.1.2", NODE, **READY),
                ep("10.0.1.3", NODE, **TERMINATING),
                ep("10.0.1.4", NODE, **GONE),
                ep("10.0.1.5", "host-1", **READY),
            ],
            ["10.0.1.1", "10.0.1.2"],
            ["10.0.1.1", "10.0.1.2", "10.0.1.5"],
        ),
        (
            "upstream-terminating-local-only-terminating",
            "Local",
            [
                ep("10.0.1.2", NODE, **TERMINATING),
                ep("10.0.1.3", NODE, **TERMINATING),
                ep("10.0.1.4", NODE, **GONE),
                ep("10.0.1.5", "host-1", **READY),
            ],
            ["10.0.1.2", "10.0.1.3"],
            ["10.0.1.5"],
        ),
        (
            "upstream-terminating-cluster-only-terminating",
            "Cluster",
            [
                ep("10.0.1.2", NODE, **TERMINATING),
                ep("10.0.1.3", NODE, **TERMINATING),
                ep("10.0.1.4", "another-host", **GONE),
                ep("10.0.1.5", "another-host", **TERMINATING),
            ],
            None,
            ["10.0.1.2", "10.0.1.3", "10.0.1.5"],
        ),
    ],
)
def test_upstream_terminating_endpoints(
    golden: str,
    policy: str,
    endpoints: list[dict[str, Any]],
    local: list[str] | None,
    cluster: list[str],
) -> None:
    h = Harness(terminating_objects(policy, endpoints))
    assert_golden(golden, h.sync())
    dump = h.dump()
    base = N.hash8("ns1/svc1/tcp/") + "-ns1/svc1/tcp/"

    def targets(chain: str) -> list[str]:
        numgen = [r for r in rules_of(dump, chain) if r.startswith("numgen")]
        return [t.split("__")[1].split("/")[0] for t in re.findall(r"goto (\S+)", numgen[0])]

    assert targets("service-" + base) == cluster
    if local is not None:
        assert targets("local-" + base) == local
    # Affinity: one set per reachable endpoint, with upstream's timeout.
    sets = [ln for ln in dump.splitlines() if ln.startswith("add set ip kube-proxy affinity-")]
    assert len(sets) == len(set(cluster) | set(local or [])) and all(
        "timeout 10800s" in s for s in sets
    )


def test_session_affinity_rules_and_timeout_change() -> None:
    objs = [
        node_obj(),
        svc1(
            ports=[port()],
            sessionAffinity="ClientIP",
            sessionAffinityConfig={"clientIP": {"timeoutSeconds": 60}},
        ),
        endpoint_slice("ns1", "svc1", [ep("10.180.0.1"), ep("10.180.0.2")]),
    ]
    h = Harness(objs)
    h.sync()
    dump = h.dump()
    svc = "service-ULMVA6XW-ns1/svc1/tcp/p80"
    e1 = "5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"
    assert rules_of(dump, svc)[1] == f"ip saddr @affinity-{e1} goto endpoint-{e1}"
    assert rules_of(dump, f"endpoint-{e1}")[1] == f"update @affinity-{e1} {{ ip saddr }}"
    assert (
        f"add set ip kube-proxy affinity-{e1}"
        " { type ipv4_addr ; flags dynamic,timeout ; timeout 60s ; }" in dump
    )
    # A new timeout re-adds the sets (nothing else of the service changes).
    objs[1]["spec"]["sessionAffinityConfig"]["clientIP"]["timeoutSeconds"] = 120
    h.feed([objs[1]])
    r = h.sync()
    assert all(line.startswith("add set ") and "timeout 120s" in line for line in _commands(r))
    assert len(_commands(r)) == 2
    # Affinity off: the sets go, after the chains that used them are rewritten.
    del objs[1]["spec"]["sessionAffinity"], objs[1]["spec"]["sessionAffinityConfig"]
    h.feed([objs[1]])
    r = h.sync()
    cmds = _commands(r)
    assert f"delete set ip kube-proxy affinity-{e1}" in cmds
    assert cmds.index(f"flush chain ip kube-proxy {svc}") < cmds.index(
        f"delete set ip kube-proxy affinity-{e1}"
    )
    assert "affinity-" not in h.dump()


def test_masquerade_all() -> None:
    h = Harness(
        [*overall_objects()[:2], overall_objects()[7]],
        {**UPSTREAM, "nftables": {"masqueradeAll": True}},
    )
    h.sync()
    assert rules_of(h.dump(), "service-ULMVA6XW-ns1/svc1/tcp/p80")[0] == (
        "ip daddr 172.30.0.41 tcp dport 80 jump mark-for-masquerade"
    )


def local_nodeport_objects() -> list[dict[str, Any]]:
    """A NodePort Service with Local policy and its one endpoint on this node."""
    return [
        node_obj(),
        svc1("NodePort", externalTrafficPolicy="Local"),
        endpoint_slice("ns1", "svc1", [ep("10.180.0.1", NODE)]),
    ]


@pytest.mark.parametrize(
    ("fields", "not_local", "local"),
    [
        ({"clusterCIDR": "10.0.0.0/8"}, "ip saddr != 10.0.0.0/8", "ip saddr 10.0.0.0/8"),
        (
            {"detectLocalMode": "BridgeInterface", "detectLocal": {"bridgeInterface": "cbr0"}},
            'iifname != "cbr0"',
            'iifname "cbr0"',
        ),
        (
            {
                "detectLocalMode": "InterfaceNamePrefix",
                "detectLocal": {"interfaceNamePrefix": "veth"},
            },
            'iifname != "veth*"',
            'iifname "veth*"',
        ),
    ],
)
def test_detect_local_modes(fields: dict[str, Any], not_local: str, local: str) -> None:
    h = Harness(local_nodeport_objects(), {"mode": "nftables", **fields})
    h.sync()
    dump = h.dump()
    assert rules_of(dump, "service-ULMVA6XW-ns1/svc1/tcp/p80")[0] == (
        f"ip daddr 172.30.0.41 tcp dport 80 {not_local} jump mark-for-masquerade"
    )
    assert rules_of(dump, "external-ULMVA6XW-ns1/svc1/tcp/p80")[0] == (
        f'{local} goto service-ULMVA6XW-ns1/svc1/tcp/p80 comment "short-circuit pod traffic"'
    )


def test_no_local_detector_means_no_masquerade_and_no_pod_short_circuit() -> None:
    h = Harness(local_nodeport_objects(), {"mode": "nftables"})
    h.sync()
    dump = h.dump()
    assert rules_of(dump, "service-ULMVA6XW-ns1/svc1/tcp/p80")[0].startswith("numgen")
    assert rules_of(dump, "external-ULMVA6XW-ns1/svc1/tcp/p80")[0].startswith("fib saddr")


@pytest.mark.parametrize(
    ("bit", "mark"), [(14, "0x00004000"), (0, "0x00000001"), (31, "0x80000000")]
)
def test_masquerade_bit(bit: int, mark: str) -> None:
    assert go_hex_mark(bit) == mark
    h = Harness([node_obj()], {**UPSTREAM, "nftables": {"masqueradeBit": bit}})
    h.sync()
    assert rules_of(h.dump(), "masquerading") == [
        f"mark and {mark} == 0 return",
        f"mark set mark xor {mark}",
        "masquerade fully-random",
    ]


def test_udp_service() -> None:
    h = Harness(
        [
            node_obj(),
            service("kube-system", "dns", "172.30.0.10", [port(53, "dns", "UDP")]),
            endpoint_slice("kube-system", "dns", [ep("10.180.0.9")], [port(53, "dns", "UDP")]),
        ]
    )
    h.sync()
    dump = h.dump()
    chain = "service-" + N.hash8("kube-system/dns/udp/dns") + "-kube-system/dns/udp/dns"
    assert elements_of(dump, "service-ips") == [f"{{ 172.30.0.10 . udp . 53 : goto {chain} }}"]
    assert "meta l4proto udp dnat to 10.180.0.9:53" in dump


# --- 4. nodePortAddresses ------------------------------------------------------------------------


def test_node_port_ips() -> None:
    node = NodeInfo(NODE, addresses=("192.168.0.2", "192.168.1.2", "2001:db8::1"))
    assert node_port_ips(["primary"], node, V4) == ("192.168.0.2",)
    assert node_port_ips(["primary"], node, V6) == ("2001:db8::1",)
    assert node_port_ips(["primary"], NodeInfo(NODE, addresses=("192.168.0.2",)), V6) is None
    assert node_port_ips([], node, V4) is None
    assert node_port_ips(["0.0.0.0/0"], node, V4) is None
    assert node_port_ips(["192.168.0.0/16"], node, V4) == ("192.168.0.2", "192.168.1.2")
    assert node_port_ips(["192.168.0.0/16"], node, V6) is None  # no IPv6 CIDR: everywhere
    assert node_port_ips(["10.0.0.0/8"], node, V4) == ()  # matches nothing: no NodePorts


def test_localhost_never_gets_node_ports() -> None:
    s = FamilySettings(V4, node_port_ips=("127.0.0.1", "192.168.0.2"))
    text = "".join(setup_lines(s, recreate_base_chains=False))
    assert "add element ip kube-proxy nodeport-ips { 192.168.0.2 }" in text
    assert "127.0.0.1" not in text


def test_node_port_addresses_match_all_deletes_the_set() -> None:
    h = Harness([node_obj()], {**UPSTREAM, "nodePortAddresses": ["0.0.0.0/0"]})
    h.sync()
    dump = h.dump()
    assert "nodeport-ips" not in dump
    assert rules_of(dump, "services")[1] == (
        "fib daddr type local ip daddr != 127.0.0.0/8"
        " meta l4proto . th dport vmap @service-nodeports"
    )


def test_nftables_mode_defaults_node_port_addresses_to_primary() -> None:
    cfg = config({"mode": "nftables"})
    assert cfg.node_port_addresses == ("primary",)


# --- 5. partial syncs ----------------------------------------------------------------------------


def web_service(i: int, ports: Sequence[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    """ns{i}/web, the i-th Service of many_services() (its cluster IP follows from i)."""
    return service(f"ns{i}", "web", f"172.30.{i // 200}.{i % 200 + 1}", ports, **spec)


def many_services(n: int = 40, endpoints: int = 3) -> list[dict[str, Any]]:
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
    cmds = _commands(r)
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
        fresh.use(FakeKernel())
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
    assert h.kernel.listings == 2  # leftovers are looked for on full syncs only
    assert "10.0.1.7" in h.dump()
    assert not h.sync().full and h.kernel.listings == 2


def test_full_sync_removes_leftovers_found_in_the_kernel() -> None:
    h = Harness(many_services(3))
    h.sync()
    # Left by an earlier run: a service chain, an affinity set, an old-version base chain and
    # map that reference each other.
    h.kernel.nft.run(
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
    cmds = _commands(r)
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
    t = h.kernel.nft.tables["ip kube-proxy"]
    left = {c for c in t.chains if "ns1/web" in c}
    assert left and all(t.rules[c] == [] for c in left)
    renderer = h.backend.renderers[V4]
    assert renderer.pending_chain_deletes == left
    h.sync()  # nothing changed: only the pending deletions run
    assert not any("ns1/web" in c for c in h.kernel.nft.tables["ip kube-proxy"].chains)
    assert renderer.pending_chain_deletes == set()


def test_periodic_full_sync_rewrites_only_what_changed_or_went_missing() -> None:
    h = Harness(many_services(5), families=(V4, V6))
    first = _commands(h.sync())
    assert sum(line.startswith("add rule ip kube-proxy endpoint-") for line in first) == 30
    # A full sync with a trustworthy record: the fixed objects and every element again
    # (flushed and refilled), but no unchanged service chain.
    r = h.sync(full=True)
    cmds = _commands(r)
    assert r.full and not any("/web/" in ln for ln in cmds if "chain" in ln.split()[1])
    assert not any(ln.startswith("add rule") and "/web/" in ln.split()[4] for ln in cmds)
    assert "flush map ip kube-proxy service-ips" in cmds
    assert sum(ln.startswith("add element ip kube-proxy service-ips") for ln in cmds) == 5
    # A chain deleted behind kubeplex's back (and its reference) is found missing and re-added.
    chain = "endpoint-" + N.hash8("ns3/web/tcp/p80__10.0.3.2/80") + "-ns3/web/tcp/p80__10.0.3.2/80"
    svc = "service-" + N.hash8("ns3/web/tcp/p80") + "-ns3/web/tcp/p80"
    h.kernel.nft.run(f"flush chain ip kube-proxy {svc}\ndelete chain ip kube-proxy {chain}\n")
    assert not h.sync().full  # a partial sync trusts its record
    cmds = _commands(h.sync(full=True))
    assert f"add chain ip kube-proxy {chain}" in cmds
    # The flushed service chain is noticed too (its rules are listed) and written again.
    assert f"flush chain ip kube-proxy {svc}" in cmds
    assert sum(ln.startswith(f"add rule ip kube-proxy {svc} ") for ln in cmds) == 2
    # A table flushed behind kubeplex's back is rebuilt by the next full sync.
    h.kernel.nft.tables.clear()
    h.sync(full=True)
    fresh = Harness(many_services(5), families=(V4, V6))
    fresh.sync()
    for fam in (V4, V6):
        assert_same_table(fresh.dump(fam), h.dump(fam))


def test_full_sync_without_a_record_rewrites_everything() -> None:
    h = Harness(many_services(5))
    h.sync()
    h.backend.invalidate()
    cmds = _commands(h.sync())
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
    assert "flush chain ip kube-proxy cluster-ips-check" in _commands(r)
    assert "flush chain ip6 kube-proxy cluster-ips-check" in _commands(r)
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
    assert not r.full and not [ln for ln in _commands(r) if "cluster-ips-check" in ln]

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
    assert set(h.kernel.nft.tables) == {"ip kube-proxy", "ip6 kube-proxy"}
    h.backend.cleanup()
    assert h.kernel.nft.tables == {}
    assert h.sync().full  # programs everything again


def test_dual_stack_is_one_transaction() -> None:
    h = Harness(many_services(2), families=(V4, V6))
    h.sync()
    assert len(h.kernel.nft.transactions) == 1
    text = h.kernel.nft.transactions[0]
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


# --- 6. injection -------------------------------------------------------------------------------


def _settings(**kw: Any) -> FamilySettings:
    return replace(FamilySettings(V4, local=LocalDetector("cidr", "10.0.0.0/8")), **kw)


def _graph(svc: ServicePort, eps: tuple[Endpoint, ...]) -> ServiceGraph:
    return ServiceGraph.build(V4, NodeInfo(NODE), {svc.name: svc}, {svc.name: eps})


SPN = ServicePortName("ns1", "svc1", "p80")
EVIL = " }\nflush ruleset\nadd rule ip kube-proxy services { "


@pytest.mark.parametrize(
    "svc",
    [
        ServicePort(SPN, V4, "172.30.0.41" + EVIL, 80),
        ServicePort(SPN, V4, "172.30.0.41", 80, external_ips=("192.168.99.1" + EVIL,)),
        ServicePort(SPN, V4, "172.30.0.41", 80, load_balancer_vips=("1.2.3.4" + EVIL,)),
        ServicePort(
            SPN,
            V4,
            "172.30.0.41",
            80,
            load_balancer_vips=("1.2.3.4",),
            load_balancer_source_ranges=("10.0.0.0/8" + EVIL,),
        ),
        ServicePort(ServicePortName("ns1", 'svc1" drop'), V4, "172.30.0.41", 80),
        ServicePort(ServicePortName("ns1\nflush ruleset", "svc1"), V4, "172.30.0.41", 80),
        ServicePort(ServicePortName("ns1", "svc1", "p80 }"), V4, "172.30.0.41", 80),
    ],
)
def test_service_fields_cannot_inject(svc: ServicePort) -> None:
    with pytest.raises(BackendError, match="refusing"):
        service_objects(
            svc, _graph(svc, (Endpoint("10.1.1.1", 80),)).categorized(svc.name), _settings()
        )


def test_endpoint_ip_cannot_inject() -> None:
    svc = ServicePort(SPN, V4, "172.30.0.41", 80)
    graph = _graph(svc, (Endpoint("10.1.1.1\nflush ruleset", 80),))
    with pytest.raises(BackendError, match="refusing"):
        service_objects(svc, graph.categorized(SPN), _settings())


@pytest.mark.parametrize(
    "settings",
    [
        _settings(local=LocalDetector("interface", 'cbr0" accept')),
        _settings(local=LocalDetector("interface", "veth\n+")),
        _settings(local=LocalDetector("cidr", "10.0.0.0/8 accept")),
    ],
)
def test_local_detector_cannot_inject(settings: FamilySettings) -> None:
    svc = ServicePort(SPN, V4, "172.30.0.41", 80)
    with pytest.raises(BackendError, match="refusing"):
        service_objects(svc, _graph(svc, (Endpoint("10.1.1.1", 80),)).categorized(SPN), settings)


@pytest.mark.parametrize(
    "settings",
    [
        _settings(node_port_ips=("192.168.0.2" + EVIL,)),
        _settings(service_cidrs=("172.30.0.0/16" + EVIL,)),
    ],
)
def test_family_settings_cannot_inject(settings: FamilySettings) -> None:
    with pytest.raises((BackendError, ValueError)):
        setup_lines(settings, recreate_base_chains=False)


@pytest.mark.parametrize("text", ['a" accept', "a\nflush ruleset", "a;b", "a\\", "a'", "a{"])
def test_comment_check(text: str) -> None:
    with pytest.raises(BackendError, match="unsafe"):
        check_comment(text)


def test_renderer_skips_a_service_it_cannot_write_and_keeps_its_old_objects() -> None:
    good = ServicePort(ServicePortName("ns1", "good"), V4, "172.30.0.41", 80)
    bad_name = ServicePortName("ns1", "bad")
    bad = ServicePort(bad_name, V4, "172.30.0.42", 80)
    eps = {good.name: (Endpoint("10.1.1.1", 80),), bad_name: (Endpoint("10.1.1.2", 80),)}
    r = FamilyRenderer(_settings())
    plan = r.render(
        ServiceGraph.build(V4, NodeInfo(NODE), {good.name: good, bad_name: bad}, eps),
        ChangeSet(full=True),
    )
    r.commit(plan)
    assert not plan.errors
    evil = replace(bad, cluster_ip="172.30.0.42" + EVIL)
    graph = ServiceGraph.build(V4, NodeInfo(NODE), {good.name: good, bad_name: evil}, eps)
    plan = r.render(graph, ChangeSet(services=frozenset({bad_name})))
    assert list(map(str, plan.errors)) == ["ns1/bad"] and plan.transaction() == ""
    plan = r.render(graph, ChangeSet(full=True))
    text = plan.transaction()
    assert "flush ruleset" not in text
    assert "172.30.0.42 . tcp . 80" in text  # the last good objects stay
    assert "172.30.0.41 . tcp . 80" in text


def test_cluster_state_rejects_what_could_inject() -> None:
    h = Harness(
        [
            node_obj(),
            service("ns1", "good", "172.30.0.41", [port()]),
            endpoint_slice("ns1", "good", [ep("10.180.0.1")]),
            service("ns1", "evil", "172.30.0.42 } ; flush ruleset", [port()]),
            endpoint_slice("ns2", "x", [ep("10.180.0.1\nflush ruleset")]),
        ]
    )
    assert len(h.cluster.invalid) == 2
    text = str(h.sync())
    assert "flush ruleset" not in text and "172.30.0.41 . tcp . 80" in text


# --- 7. the backend ------------------------------------------------------------------------------


def test_backend_registration_and_capabilities() -> None:
    assert "nftables" in plugins.available()
    backend = plugins.load_backend("nftables", BackendContext(config(UPSTREAM), NODE))
    assert isinstance(backend, NftablesBackend)
    assert backend.required_tools == ("nft",)
    assert "localhost-nodeports" not in backend.capabilities
    assert {
        "session-affinity",
        "sctp",
        "ipv6",
        "load-balancer-source-ranges",
    } <= backend.capabilities
    assert any("kube-proxy" in line for line in backend.describe())


def test_render_is_pure() -> None:
    # No kernel is touched by render: a backend without any kernel renders fine.
    backend = NftablesBackend(BackendContext(config(UPSTREAM), NODE, (V4,), kernel=NoKernel()))
    cluster = ClusterState(NODE, (V4,))
    for obj in overall_objects():
        {
            "Service": cluster.set_service,
            "EndpointSlice": cluster.set_endpoint_slice,
            "Node": cluster.set_node,
        }[obj["kind"]](obj)
    assert "service-ULMVA6XW-ns1/svc1/tcp/p80" in str(backend.render(cluster.checkout(full=True)))


# --- 8. the netlink path -------------------------------------------------------------------------
#
# Partial syncs go to the kernel as netlink messages that kubeplex encodes itself (nft's cache
# fetch costs O(chains^2) per call). The encoding is checked here against the grammar without
# root, and against nft itself in a throw-away network namespace with root: the same table,
# listed by nft, whichever way the partial syncs went.


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


def kernel_table(ns: str, family: str = "ip") -> dict[str, list[str]]:
    """``nft list table`` by object, in a form independent of creation order: each chain's
    rules in order, each set's or map's lines with its elements sorted."""
    import subprocess

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
    import unittest.mock

    import kubeplex.backends.nftables as backend_module

    kernel = NftKernel(netns2)
    kernel.use_netlink = False
    fresh = kernel_harness([], netns2, kernel)
    fresh.cluster = h.cluster
    kernel.run("flush ruleset\n")
    with unittest.mock.patch.object(backend_module, "STAGE_MIN_LINES", 10**9):
        fresh.sync(full=True)
    for fam in ("ip", "ip6"):
        assert kernel_table(netns2, fam) == kernel_table(netns, fam), fam


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


def assert_encoded_as_nft(messages: list[Any], text: str, netns: str) -> None:
    """``messages`` (netlink.compile_transaction of ``text``) are what nft sends for ``text``:
    byte for byte, but for the padding nft leaves uninitialized and the order of a set's
    elements (nft's --debug=mnl dump, taken applying ``text`` in ``netns``)."""
    from kits.nft_messages import canonical, nft_messages

    from kubeplex.backends.nftables import netlink

    theirs = nft_messages(netns, text)
    assert len(messages) == len(theirs)
    mine = [((netlink.NFNL_SUBSYS_NFTABLES << 8) | m.kind, m.body) for m in messages]
    nfts = [(kind, canonical(body)) for kind, body in theirs]
    assert _element_runs_sorted(mine) == _element_runs_sorted(nfts)


def _element_runs_sorted(messages: list[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
    """nft reorders consecutive elements of one set among themselves: compare such runs as
    sorted lists (a set's elements have no order)."""
    out: list[tuple[int, bytes]] = []
    run: list[tuple[int, bytes]] = []
    for kind, body in [*messages, (-1, b"")]:
        if run and (kind != run[0][0] or body[:40] != run[0][1][:40]):
            out += sorted(run) if run[0][0] & 0xFF == 12 else run
            run = []
        run.append((kind, body))
    return out


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
    assert r.full and len(h.kernel.nft.transactions) > 4
    # The elements (what makes the services reachable) come with the last transaction.
    stages = h.kernel.nft.transactions
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
    assert len(fresh.kernel.nft.transactions) == 1
    for fam in (V4, V6):
        assert_same_table(fresh.dump(fam), h.dump(fam))
    # Once the tables exist, a full sync (even one that trusts nothing) is one transaction.
    monkeypatch.setattr(backend_module, "STAGE_LINES", 40)
    h.backend.invalidate()
    before = len(h.kernel.nft.transactions)
    assert h.sync().full and len(h.kernel.nft.transactions) == before + 1
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
    assert len(other.kernel.nft.transactions) == 2
    assert other.sync().full and len(other.kernel.nft.transactions) == 3
    fresh = Harness(many_services(10))
    fresh.sync()
    assert_same_table(fresh.dump(), other.dump())


def test_cleanup_failures_reach_the_metric() -> None:
    """nftables_cleanup_failures_total counts stale chains that could not be deleted and
    listings of the table that failed (no leftovers removed), per family, through the next
    successful sync's samples."""
    from kubeplex.core.daemon.metrics import ProxyMetrics
    from kubeplex.core.daemon.proxier import Proxier

    h = Harness(many_services(3))
    metrics = ProxyMetrics(h.backend, process_collectors=False)
    proxier = Proxier(h.cluster, h.backend)
    proxier.listeners.append(metrics.sync_listener)
    name = "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total"
    assert proxier.sync()
    assert not metrics.value(name, {"ip_family": "IPv4"})  # (unset: never counted)
    # A listing that fails on a full sync.
    h.kernel.fail_listing = True
    assert proxier.sync(full=True)
    assert metrics.value(name, {"ip_family": "IPv4"}) == 1
    h.kernel.fail_listing = False
    # Stale chains whose deletion the kernel refuses (kept for the next sync).
    renderer = h.backend.renderers[V4]
    renderer.pending_chain_deletes = {"endpoint-GONE"}
    h.feed([endpoint_slice("ns1", "web", [ep("10.0.1.7", NODE)])])
    h.kernel.refuse = "nft -f failed: Device or resource busy"
    assert proxier.sync()
    assert metrics.value(name, {"ip_family": "IPv4"}) == 2
    assert renderer.pending_chain_deletes == {"endpoint-GONE"}
    renderer.pending_chain_deletes.clear()
    assert proxier.sync(full=True)  # nothing failed: nothing counted
    assert metrics.value(name, {"ip_family": "IPv4"}) == 2
