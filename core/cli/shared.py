"""What the commands of ``kubeplex`` share: exit codes, options and the configuration (from
``options``, importable from here too), the backend and a cluster state from manifests."""

from __future__ import annotations

from pathlib import Path

from kubeplex.core.cli.options import EXIT_BACKEND as EXIT_BACKEND
from kubeplex.core.cli.options import EXIT_CONFIG as EXIT_CONFIG
from kubeplex.core.cli.options import EXIT_OK as EXIT_OK
from kubeplex.core.cli.options import EXIT_SYNC_FAILED as EXIT_SYNC_FAILED
from kubeplex.core.cli.options import EXIT_USAGE as EXIT_USAGE
from kubeplex.core.cli.options import Command as Command
from kubeplex.core.cli.options import Subparsers as Subparsers
from kubeplex.core.cli.options import add_common_options as add_common_options
from kubeplex.core.cli.options import add_plugins_option as add_plugins_option
from kubeplex.core.cli.options import add_verbosity_option as add_verbosity_option
from kubeplex.core.cli.options import load_effective_config as load_effective_config
from kubeplex.core.cli.options import node_name as node_name
from kubeplex.core.cli.options import reporting_errors as reporting_errors
from kubeplex.core.config.kubeproxy import KubeProxyConfiguration
from kubeplex.core.daemon.collector import collector_paused
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import Backend, BackendContext
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.sources.manifests import ManifestSource


def make_backend(cfg: KubeProxyConfiguration, netns: str | None) -> Backend:
    """The configured mode's backend, on the node's kernel (in ``netns``)."""
    ctx = BackendContext(config=cfg, node_name=node_name(cfg), netns=netns)
    return plugins.load_backend(cfg.mode, ctx)


def state_from_manifests(
    cfg: KubeProxyConfiguration, path: Path
) -> tuple[ClusterState, ManifestSource]:
    """A cluster state holding the objects of a manifests folder or file, loaded once."""
    cluster = ClusterState(node_name(cfg))
    source = ManifestSource(path, cluster)
    with collector_paused():  # parsing allocates an object per endpoint, none in a cycle
        source.load()
    return cluster, source
