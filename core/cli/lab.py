"""``kubeplex lab``: the seed article's kind cluster, built from network namespaces in seconds.

Two nodes with three agnhost-like pods and a client pod, programmed by kubeplex from the
embedded manifests; then it shows what a reader of the articles wants to see, in any mode:
what the kernel holds for the Service (``Backend.inspect``: where traffic enters, the
endpoints and their shares), per-endpoint counters after N requests, a conntrack entry, and
the NodePort client IP.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from importlib.resources import files
from pathlib import Path

from kubeplex.core.cli.options import EXIT_OK, Subparsers
from kubeplex.core.cli.printing import echo
from kubeplex.core.config.kubeproxy import KubeProxyConfiguration, load_config, with_overrides
from kubeplex.core.daemon.proxier import Proxier
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import BackendContext, EndpointView, ProgrammedService
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.types import ServicePortName
from kubeplex.core.sources.manifests import ManifestSource

CLUSTER_IP = "10.96.88.59"
#: The NodePort Service's ClusterIP (web-nodeport: the same three pods).
NODEPORT_CLUSTER_IP = "10.96.223.155"
NODEPORT = 30080
#: The Service behind CLUSTER_IP (one unnamed port).
WEB = ServicePortName("default", "web")


def lab_dir() -> Path:
    return Path(str(files("kubeplex.testing") / "lab"))


def add_parser(sub: Subparsers, name: str) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        name, help="build a two-node namespace cluster and program it with kubeplex"
    )
    p.add_argument("--mode", help="dataplane to program (default: the lab configuration's)")
    p.add_argument("--requests", type=int, default=300, help="requests to send to the ClusterIP")
    p.add_argument("--down", action="store_true", help="remove everything the lab made")
    p.add_argument("--prefix", help=argparse.SUPPRESS)  # a lab of its own (tests)
    return p


def program_node(
    cfg: KubeProxyConfiguration,
    node: str,
    netns: str,
    manifests: Path,
    *,
    cgroup: Path | None = None,
    bpffs: Path | None = None,
) -> Proxier:
    """Run one full sync of ``node`` inside ``netns`` (with the node's own cgroup and bpffs
    folders where it has them), as ``kubeplex run --once`` would."""
    cfg = replace(cfg, hostname_override=node)
    ctx = BackendContext(cfg, node, netns=netns, cgroup=cgroup, bpffs=bpffs)
    backend = plugins.load_backend(cfg.mode, ctx)
    cluster = ClusterState(node)
    ManifestSource(manifests, cluster).load()
    backend.prepare()
    proxier = Proxier(cluster, backend)
    if not proxier.sync(full=True):
        raise RuntimeError(f"programming {node} failed: {proxier.status.last_error}")
    return proxier


def _show(title: str, text: str) -> None:
    print(f"\n== {title}")
    echo(text.rstrip() or "(nothing)")  # the kernel's listings


def _share(ep: EndpointView) -> str:
    parts = [] if ep.share is None else [f"share {ep.share:.1%}"]
    parts += [] if ep.weight is None else [f"weight {ep.weight}"]
    parts += [] if ep.packets is None else [f"packets {ep.packets}"]
    return f"  {ep.target:<22} {'  '.join(parts)}".rstrip()


def describe_programmed(found: Sequence[ProgrammedService] | None) -> list[str]:
    """Mode-neutral lines of what ``Backend.inspect`` found for one Service port."""
    if found is None:
        return ["(this backend cannot read back what it programmed)"]
    if not found:
        return ["(nothing programmed)"]
    lines: list[str] = []
    for ps in found:
        lines.append(f"{ps.family.value}: where traffic enters")
        lines += [f"  {entry}" for entry in ps.entries] or ["  (no entry)"]
        lines.append(f"{ps.family.value}: endpoints")
        lines += [_share(ep) for ep in ps.endpoints] or ["  (none)"]
        lines.append(f"masquerade: {'marked' if ps.masquerade else 'not marked'}")
        if ps.affinity_seconds is not None:
            lines.append(f"session affinity: {ps.affinity_seconds} s")
        if ps.packets is not None:
            lines.append(f"packets at the entry: {ps.packets}")
        if ps.objects:
            lines.append(f"kernel objects: {', '.join(ps.objects)}")
    return lines


def _packets(found: Sequence[ProgrammedService] | None) -> dict[str, int]:
    """Packets per endpoint target, where the kernel counts them."""
    return {
        ep.target: ep.packets for ps in found or () for ep in ps.endpoints if ep.packets is not None
    }


def _counted(before: dict[str, int], after: dict[str, int]) -> str:
    if not after:
        return "(this mode keeps no per-endpoint counter)"
    return "\n".join(
        f"{n - before.get(target, 0):7d} packets -> {target}" for target, n in sorted(after.items())
    )


def run(args: argparse.Namespace) -> int:
    from kubeplex.testing import netlab  # only the lab needs the namespace helpers

    prefix = args.prefix or netlab.LAB_PREFIX
    if args.down:
        removed = netlab.down_all(prefix)
        print(f"removed {len(removed)} namespaces, the node cgroups and the lab's bpffs")
        return EXIT_OK
    base = load_config(lab_dir() / "config.yaml", known_modes=plugins.known_modes())
    cfg = with_overrides(base, mode=args.mode, known_modes=plugins.known_modes())
    lab = netlab.Lab(prefix=prefix).up(replace=True)
    took = lab.timings.get("up", 0.0) * 1000
    print(f"lab up in {took:.0f} ms: namespaces {', '.join(lab.namespaces)}")
    for why in (lab.no_cgroups, lab.no_bpffs):
        if why:
            print(f"the lab runs without them: {why}")
    node_ns = lab.namespace_of(netlab.NODE1)
    proxiers = {
        node: program_node(
            cfg,
            node,
            lab.namespace_of(node),
            lab_dir() / "manifests",
            cgroup=lab.cgroup_of(node),
            bpffs=lab.bpffs_of(node),
        )
        for node in (netlab.NODE1, netlab.NODE2)
    }
    print(f"programmed {netlab.NODE1} and {netlab.NODE2} in mode {cfg.mode}")
    backend = proxiers[netlab.NODE1].backend

    found = backend.inspect(WEB)
    _show(f"what {netlab.NODE1} holds for {WEB}", "\n".join(describe_programmed(found)))

    client = lab.namespace_of(netlab.CLIENT_POD)
    results = lab.http(client, CLUSTER_IP, 80, "/hostname", count=args.requests, timeout=2.0)
    tally = Counter(netlab.tally(results))
    _show(
        f"{args.requests} requests from the client pod to http://{CLUSTER_IP}/hostname",
        "\n".join(f"{n:7d} {body}" for body, n in sorted(tally.items())),
    )
    _show(
        f"what {netlab.NODE1} counted per endpoint of {WEB} for them",
        _counted(_packets(found), _packets(backend.inspect(WEB))),
    )
    results = lab.http(client, NODEPORT_CLUSTER_IP, 80, "/hostname", count=30, timeout=2.0)
    _show(
        f"30 requests from the client pod to http://{NODEPORT_CLUSTER_IP}/hostname (web-nodeport)",
        "\n".join(f"{n:7d} {body}" for body, n in sorted(netlab.tally(results).items())),
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
    external_ip = lab.spec.host(netlab.EXTERNAL).ip
    masqueraded = bool(seen[0].body) and not str(seen[0].body).startswith(f"{external_ip}:")
    _show(
        f"curl http://{node_ip}:{NODEPORT}/clientip from the external host"
        " (externalTrafficPolicy: Cluster)",
        (seen[0].body or seen[0].outcome)
        + ("   <- the node's address: the client IP was masqueraded" if masqueraded else ""),
    )
    print(f"\nThe lab stays up; look around with e.g.\n  ip netns exec {node_ns} bash")
    about = list(backend.describe())
    if about:
        print(f"where mode {cfg.mode}:")
        print("\n".join(f"  {line}" for line in about))
    print(f"and remove it with: kubeplex lab --down{f' --prefix {prefix}' if args.prefix else ''}")
    return EXIT_OK
