"""What the commands of ``kubeplex`` that build a backend share: the backend, and a cluster
state from manifests (exit codes, options and the configuration are in ``options``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from kubeplex.core.cli.options import node_name
from kubeplex.core.config.kubeproxy import KubeProxyConfiguration
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import Backend, BackendContext
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.startup.collector import collector_paused

if TYPE_CHECKING:
    from kubeplex.core.sources.manifests import ManifestSource


def make_backend(cfg: KubeProxyConfiguration, netns: str | None) -> Backend:
    """The configured mode's backend, on the node's kernel (in ``netns``)."""
    ctx = BackendContext(config=cfg, node_name=node_name(cfg), netns=netns)
    return plugins.load_backend(cfg.mode, ctx)


def state_from_manifests(
    cfg: KubeProxyConfiguration, path: Path
) -> tuple[ClusterState, ManifestSource]:
    """A cluster state holding the objects of a manifests folder or file, loaded once."""
    # Imported here: a daemon reading the API never needs it, so its start does not pay for it.
    from kubeplex.core.sources.manifests import ManifestSource

    cluster = ClusterState(node_name(cfg))
    source = ManifestSource(path, cluster)
    with collector_paused():  # parsing allocates an object per endpoint, none in a cycle
        source.load()
    return cluster, source
