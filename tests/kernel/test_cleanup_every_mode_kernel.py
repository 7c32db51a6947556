"""``kubeplex cleanup`` on a node where both netfilter modes left their rules: every mode's
artifacts go (KUBE-FIREWALL too, where no kubelet shares it), each mode says what it removed,
``--mode`` restricts it to one, and nothing kubeplex did not create is touched: foreign
iptables rules (KUBE-looking names among them) and a foreign nft table stay through every
step."""

from __future__ import annotations

import subprocess

import pytest
from kits.cli_kit import LAB, in_netns, kubeplex

from kubeplex.core.config.kubeproxy import load_config, with_overrides
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import BackendContext
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.sources.manifests import ManifestSource

pytestmark = pytest.mark.kernel

NODE = "kind-worker"
FOREIGN_IPTABLES = """*filter
:FOREIGN-FW - [0:0]
:KUBE-MYTHING - [0:0]
:KUBE-SVC-NOTOURS0000000 - [0:0]
-A INPUT -p tcp --dport 22 -m comment --comment "foreign ssh" -j FOREIGN-FW
-A INPUT -s 10.9.9.9/32 -j KUBE-MYTHING
-A FOREIGN-FW -j ACCEPT
-A KUBE-MYTHING -j ACCEPT
-A KUBE-SVC-NOTOURS0000000 -j RETURN
COMMIT
*nat
:FOREIGN-NAT - [0:0]
-A PREROUTING -d 10.9.9.9/32 -j FOREIGN-NAT
-A FOREIGN-NAT -j RETURN
COMMIT
"""
FOREIGN_NFT = """table inet foreign {
    set allowed { type ipv4_addr; elements = { 10.9.9.9 } }
    chain input { type filter hook input priority 0; ip saddr @allowed counter accept; }
}
"""
ARGS = ("--config", str(LAB / "config.yaml"))


def foreign(netns: str) -> tuple[list[str], str]:
    lines = [
        ln
        for tool in ("iptables-save", "ip6tables-save")
        for ln in in_netns(netns, tool).splitlines()
        if any(w in ln for w in ("FOREIGN", "MYTHING", "NOTOURS"))
    ]
    table = in_netns(netns, "nft", "list", "table", "inet", "foreign")
    return sorted(line.split(" [")[0] for line in lines), table


def program_nftables(netns: str) -> None:
    """The nftables mode's rules beside the iptables mode's (no switch cleanup in between)."""
    cfg = with_overrides(
        load_config(LAB / "config.yaml"), mode="nftables", known_modes=plugins.known_modes()
    )
    backend = plugins.load_backend("nftables", BackendContext(cfg, NODE, netns=netns))
    cluster = ClusterState(NODE, backend.ctx.families)
    ManifestSource(LAB / "manifests", cluster).load()
    backend.sync(cluster.checkout(full=True))


def test_cleanup_removes_every_mode_and_nothing_foreign(netns: str) -> None:
    subprocess.run(
        ["ip", "netns", "exec", netns, "iptables-restore", "--noflush"],
        input=FOREIGN_IPTABLES, text=True, check=True,
    )  # fmt: skip
    subprocess.run(
        ["ip", "netns", "exec", netns, "nft", "-f", "-"], input=FOREIGN_NFT, text=True, check=True
    )
    before = foreign(netns)
    run = kubeplex("run", *ARGS, "--netns", netns, "--manifests", str(LAB / "manifests"), "--once")
    assert run.returncode == 0, run.stderr
    program_nftables(netns)
    assert "KUBE-FIREWALL" in in_netns(netns, "iptables-save", "-t", "filter")
    assert foreign(netns) == before

    only = kubeplex("cleanup", *ARGS, "--netns", netns, "--mode", "nftables")
    assert only.returncode == 0, only.stderr
    assert only.stdout.startswith("nftables: removed nftables table ip kube-proxy\n")
    assert all(line.startswith("nftables: ") for line in only.stdout.splitlines())
    assert "KUBE-SERVICES" in in_netns(netns, "iptables-save", "-t", "nat")
    assert "kube-proxy" not in in_netns(netns, "nft", "list", "tables")
    assert foreign(netns) == before

    program_nftables(netns)
    done = kubeplex("cleanup", *ARGS, "--netns", netns)
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert "iptables: removed iptables filter chain KUBE-FIREWALL" in out
    assert "iptables: removed iptables filter jump INPUT -> KUBE-FIREWALL" in out
    assert "iptables: removed sysctl net.ipv4.conf.all.route_localnet=1" in out
    assert "nftables: removed nftables table ip kube-proxy" in out
    assert "nftables: removed nftables table ip6 kube-proxy" in out
    assert in_netns(netns, "sysctl", "-n", "net.ipv4.conf.all.route_localnet").strip() == "0"
    for tool in ("iptables-save", "ip6tables-save"):
        ours = [
            ln
            for ln in in_netns(netns, tool).splitlines()
            if "KUBE-" in ln and "MYTHING" not in ln and "NOTOURS" not in ln
        ]
        assert not ours, ours
    tables = in_netns(netns, "nft", "list", "tables")
    assert "kube-proxy" not in tables and "table inet foreign" in tables
    assert foreign(netns) == before

    again = kubeplex("cleanup", *ARGS, "--netns", netns)
    assert again.returncode == 0
    assert "removed" not in again.stdout
    assert "iptables: nothing to remove" in again.stdout.splitlines()
    assert "nftables: nothing to remove" in again.stdout.splitlines()
    assert foreign(netns) == before
