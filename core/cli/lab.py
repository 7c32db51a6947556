"""``kubeplex lab``: the seed article's kind cluster, built from network namespaces in seconds.

Two nodes with three agnhost-like pods and a client pod, programmed by kubeplex from the
embedded manifests; then it shows what a reader of the articles wants to see: a Service's chain
path, per-endpoint counters after N requests, a conntrack entry, and the NodePort client IP.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from dataclasses import replace
from importlib.resources import files
from pathlib import Path
from typing import Any

from kubeplex.core.config.kubeproxy import KubeProxyConfiguration, load_config, with_overrides
from kubeplex.core.daemon.proxier import Proxier
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import BackendContext
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.sources.manifests import ManifestSource

CLUSTER_IP = "10.96.88.59"
NODEPORT = 30080


def lab_dir() -> Path:
    return Path(str(files("kubeplex.testing") / "lab"))


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "lab", help="build a two-node namespace cluster and program it with kubeplex"
    )
    p.add_argument("--mode", default="iptables", help="dataplane to program (default iptables)")
    p.add_argument("--requests", type=int, default=300, help="requests to send to the ClusterIP")
    p.add_argument("--down", action="store_true", help="remove everything the lab made")
    p.set_defaults(handler=run_lab)


def program_node(cfg: KubeProxyConfiguration, node: str, netns: str, manifests: Path) -> Proxier:
    """Run one full sync of ``node`` inside ``netns``, as ``kubeplex run --once`` would."""
    cfg = replace(cfg, hostname_override=node)
    backend = plugins.load_backend(cfg.mode, BackendContext(cfg, node, netns=netns))
    cluster = ClusterState(node)
    ManifestSource(manifests, cluster).load()
    backend.prepare()
    proxier = Proxier(cluster, backend)
    if not proxier.sync(full=True):
        raise RuntimeError(f"programming {node} failed: {proxier.status.last_error}")
    return proxier


def _show(title: str, text: str) -> None:
    print(f"\n== {title}")
    print(text.rstrip() or "(nothing)")


def run_lab(args: argparse.Namespace) -> int:
    from kubeplex.testing import netlab  # only the lab needs the namespace helpers

    if args.down:
        removed = netlab.down_all(netlab.LAB_PREFIX)
        print(f"removed {len(removed)} namespaces")
        return 0
    base = load_config(lab_dir() / "config.yaml", known_modes=plugins.known_modes())
    cfg = with_overrides(base, mode=args.mode, known_modes=plugins.known_modes())
    lab = netlab.Lab(prefix=netlab.LAB_PREFIX).up(replace=True)
    took = lab.timings.get("up", 0.0) * 1000
    print(f"lab up in {took:.0f} ms: namespaces {', '.join(lab.namespaces)}")
    node_ns = lab.namespace_of(netlab.NODE1)
    for node in (netlab.NODE1, netlab.NODE2):
        program_node(cfg, node, lab.namespace_of(node), lab_dir() / "manifests")
    print(f"programmed {netlab.NODE1} and {netlab.NODE2} in mode {cfg.mode}")

    if cfg.mode == "iptables":
        _iptables_trace(lab, node_ns)
    elif cfg.mode == "nftables":
        _show(
            "nft list table ip kube-proxy",
            lab.exec(node_ns, ["nft", "list", "table", "ip", "kube-proxy"]).stdout,
        )

    client = lab.namespace_of(netlab.CLIENT_POD)
    results = lab.http(client, CLUSTER_IP, 80, "/hostname", count=args.requests, timeout=2.0)
    tally = Counter(netlab.tally(results))
    _show(
        f"{args.requests} requests from the client pod to http://{CLUSTER_IP}/hostname",
        "\n".join(f"{n:7d} {body}" for body, n in sorted(tally.items())),
    )
    if cfg.mode == "iptables":
        svc_chain = _svc_chain(lab, node_ns)
        _show(
            f"iptables -t nat -L {svc_chain} -n -v",
            lab.exec(node_ns, ["iptables", "-t", "nat", "-L", svc_chain, "-n", "-v"]).stdout,
        )
    _show(
        f"conntrack -L -d {CLUSTER_IP}",
        "\n".join(
            lab.exec(
                node_ns, ["conntrack", "-L", "-d", CLUSTER_IP], check=False
            ).stdout.splitlines()[:3]
        ),
    )
    external = lab.namespace_of(netlab.EXTERNAL)
    node_ip = lab.spec.node(netlab.NODE1).host_ip
    seen = lab.http(external, node_ip, NODEPORT, "/clientip", count=1)
    _show(
        f"curl http://{node_ip}:{NODEPORT}/clientip from the external host"
        " (externalTrafficPolicy: Cluster)",
        (seen[0].body or seen[0].outcome)
        + "   <- the node's address: the client IP was masqueraded",
    )
    print("\nThe lab stays up; look around with e.g.")
    if cfg.mode == "nftables":
        print(f"  ip netns exec {node_ns} nft list table ip kube-proxy | grep default/web")
    else:
        print(f"  ip netns exec {node_ns} iptables-save -t nat | grep default/web")
    print("and remove it with: kubeplex lab --down")
    return 0


def _svc_chain(lab: Any, node_ns: str) -> str:
    save = lab.exec(node_ns, ["iptables", "-t", "nat", "-S", "KUBE-SERVICES"]).stdout
    line = next(ln for ln in save.splitlines() if CLUSTER_IP in ln)
    found = re.search(r"KUBE-SVC-[A-Z0-9]+", line)
    assert found is not None
    # Zeroed before the requests, so the counters show just this run.
    return found.group(0)


def _iptables_trace(lab: Any, node_ns: str) -> None:
    """The seed's trace.sh: KUBE-SERVICES line, the KUBE-SVC chain, one KUBE-SEP DNAT."""

    def save(*args: str) -> str:
        return str(lab.exec(node_ns, ["iptables", "-t", "nat", "-S", *args]).stdout)

    services = [ln for ln in save("KUBE-SERVICES").splitlines() if CLUSTER_IP in ln]
    svc = _svc_chain(lab, node_ns)
    svc_rules = [ln for ln in save(svc).splitlines() if ln.startswith("-A")]
    sep = re.search(r"KUBE-SEP-[A-Z0-9]+", "\n".join(svc_rules))
    dnat = [ln for ln in save(sep.group(0)).splitlines() if "DNAT" in ln] if sep else []
    _show("chain path of default/web (iptables-save)", "\n".join(services + svc_rules + dnat))
    lab.exec(node_ns, ["iptables", "-t", "nat", "-Z", svc])
