"""What ``kubeplex explain`` and ``kubeplex migrate --check`` share: the cluster state from
the sources ``run`` reads, what kubeplex would program from it, and the kernel's reading of
it through the active mode's ``inspect``."""

from __future__ import annotations

import argparse
import threading
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from kubeplex.core.cli.shared import state_from_manifests
from kubeplex.core.config.kubeproxy import KubeProxyConfiguration
from kubeplex.core.config.localdetect import local_detector
from kubeplex.core.dataplane.backend import Backend, ProgrammedService
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.errors import KubeplexError
from kubeplex.core.model.expectations import Expectation, expect
from kubeplex.core.model.graph import ProxyState
from kubeplex.core.model.types import IPFamily, ServicePortName

OUTPUTS = ("text", "json")


def add_source_options(p: argparse.ArgumentParser) -> None:
    """``run``'s sources (``--manifests``, else the API through ``--kubeconfig``) and ``-o``."""
    p.add_argument(
        "--manifests", type=Path, help="folder or file of Service/EndpointSlice/Node YAML"
    )
    p.add_argument(
        "--kubeconfig", type=Path, help="kubeconfig file (overrides clientConnection.kubeconfig)"
    )
    p.add_argument("-o", "--output", choices=OUTPUTS, default="text", help="output format")


def load_cluster(cfg: KubeProxyConfiguration, args: argparse.Namespace) -> ClusterState:
    """The cluster state as ``run`` would see it: from ``--manifests``, else from the API
    server (listed once, then the watch is stopped)."""
    manifests: Path | None = getattr(args, "manifests", None)
    if manifests is not None:
        cluster, _ = state_from_manifests(cfg, manifests)
        return cluster
    kubeconfig: Path | None = getattr(args, "kubeconfig", None)
    if kubeconfig is not None:
        cfg = replace(
            cfg, client_connection=replace(cfg.client_connection, kubeconfig=str(kubeconfig))
        )
    # The daemon's own start and wait, so both see the cluster alike.
    from kubeplex.core.cli.run import _start_api_source, _wait_for_api_sync

    api = _start_api_source(cfg)
    try:
        if not _wait_for_api_sync(api, True, threading.Event()):
            raise KubeplexError(f"no initial list from the Kubernetes API at {api.host}")
        return api.cluster
    finally:
        api.stop()


def local_traffic(cfg: KubeProxyConfiguration, state: ProxyState, family: IPFamily) -> str:
    """How pod traffic is told apart in ``family``, in words ("" if it cannot be)."""
    detector = local_detector(cfg, state.node, family)
    if detector.kind == "cidr":
        return f"from {detector.value}"
    if detector.kind == "interface":
        return f"in through {detector.value}"
    return ""


def masquerade_all(cfg: KubeProxyConfiguration, mode: str) -> bool:
    """``masqueradeAll`` of the configuration section named after ``mode``, if it has one."""
    return bool(getattr(getattr(cfg, mode, None), "masquerade_all", False))


@dataclass(frozen=True)
class PortState:
    """One service port in one family: what kubeplex would program, what the kernel holds."""

    service: ServicePortName
    family: IPFamily
    expectation: Expectation | None
    view: ProgrammedService | None


def expectations_of(
    cfg: KubeProxyConfiguration, state: ProxyState, mode: str, spns: Iterable[ServicePortName]
) -> dict[tuple[ServicePortName, IPFamily], Expectation]:
    out = {}
    wanted = set(spns)
    for family, graph in state.graphs.items():
        every = masquerade_all(cfg, mode)
        local = local_traffic(cfg, state, family)
        for spn in sorted(wanted & set(graph.services)):
            out[spn, family] = expect(graph, spn, masquerade_all=every, local_traffic=local)
    return out


def read_kernel(
    backend: Backend, spns: Iterable[ServicePortName]
) -> dict[tuple[ServicePortName, IPFamily], ProgrammedService] | None:
    """The kernel's views of ``spns`` (None: this mode cannot read its kernel back)."""
    out = {}
    for spn in spns:
        try:
            views = backend.inspect(spn)
        except KubeplexError:
            raise
        except Exception as err:  # not root, a tool missing, a plugin's bug
            reason = " ".join(str(err).split())[:200] or type(err).__name__
            raise KubeplexError(f"cannot read the kernel of mode {backend.mode}: {reason}") from err
        if views is None:
            return None
        for view in views:
            out[spn, view.family] = view
    return out


def port_states(
    cfg: KubeProxyConfiguration,
    state: ProxyState,
    backend: Backend,
    spns: Iterable[ServicePortName],
) -> list[PortState] | None:
    """Every (service port, family) that kubeplex would program or the kernel holds, in
    order; None if the mode cannot read its kernel back."""
    spns = sorted(set(spns))
    expected = expectations_of(cfg, state, backend.mode, spns)
    prime(backend, state)
    views = read_kernel(backend, spns)
    if views is None:
        return None
    families = [f for f in backend.ctx.families if f in state.graphs]
    keys = sorted(set(expected) | set(views), key=lambda k: (k[0], families_order(families, k[1])))
    return [PortState(s, f, expected.get((s, f)), views.get((s, f))) for s, f in keys]


def families_order(families: list[IPFamily], family: IPFamily) -> int:
    return families.index(family) if family in families else len(families)


def served_ports(state: ProxyState) -> set[ServicePortName]:
    """Every service port of every family's graph."""
    return {spn for graph in state.graphs.values() for spn in graph.services}


def prime(backend: Backend, state: ProxyState) -> None:
    """Render ``state`` as the next sync would (observing the kernel; nothing is applied), so
    that a mode whose kernel objects carry no Service names finds a Service's objects in
    ``inspect`` through what it would program for it."""
    try:
        backend.render(state, backend.observe(state))
    except KubeplexError:
        raise
    except Exception as err:  # not root, a tool missing, a plugin's bug
        reason = " ".join(str(err).split())[:200] or type(err).__name__
        raise KubeplexError(f"cannot read the kernel of mode {backend.mode}: {reason}") from err
