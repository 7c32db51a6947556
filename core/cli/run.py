"""``kubeplex run``: the proxy daemon (or, with ``--once``, one full sync)."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from kubeplex.core.cli.shared import (
    EXIT_CONFIG,
    EXIT_OK,
    EXIT_SYNC_FAILED,
    Subparsers,
    add_common_options,
    load_effective_config,
    make_backend,
    node_name,
    state_from_manifests,
)
from kubeplex.core.config.kubeproxy import KubeProxyConfiguration
from kubeplex.core.daemon.proxier import Proxier
from kubeplex.core.daemon.runner import SyncRunner
from kubeplex.core.dataplane import plugins
from kubeplex.core.model.errors import KubeplexError
from kubeplex.core.sources.manifests import ManifestSource

if TYPE_CHECKING:
    from kubeplex.core.daemon.operations import Operations
    from kubeplex.core.sources.kubeapi import KubeApiSource

log = logging.getLogger("kubeplex")

#: How long ``run --once`` waits for the initial lists from the API server before giving up.
ONCE_SYNC_TIMEOUT = 60.0
#: How often a daemon still waiting for the API server says so.
SYNC_WAIT_LOG_INTERVAL = 10.0


def add_parser(sub: Subparsers, name: str) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(name, help="run the proxy (daemon)")
    add_common_options(p)
    p.add_argument(
        "--manifests", type=Path, help="folder or file of Service/EndpointSlice/Node YAML"
    )
    p.add_argument(
        "--once", action="store_true", help="one full sync, then exit (non-zero if it failed)"
    )
    p.add_argument(
        "--kubeconfig", type=Path, help="kubeconfig file (overrides clientConnection.kubeconfig)"
    )
    return p


def _start_api_source(cfg: KubeProxyConfiguration) -> KubeApiSource:
    # Imported here: the kubernetes client is only needed (and paid for) without --manifests.
    from kubeplex.core.sources.kubeapi import KubeApiSource

    return KubeApiSource.from_config(cfg, node_name(cfg)).start()


def _wait_for_api_sync(source: KubeApiSource, once: bool, stop: threading.Event) -> bool:
    """Wait until Services, EndpointSlices and the Node are listed; nothing is programmed
    before (a half-listed cluster would delete the rules of every Service not listed yet).
    A daemon waits forever and says so; ``--once`` gives up after ONCE_SYNC_TIMEOUT."""
    started = time.monotonic()
    while not stop.is_set():
        left = ONCE_SYNC_TIMEOUT - (time.monotonic() - started) if once else float("inf")
        if left <= 0:
            log.error(
                "no initial sync from the Kubernetes API at %s within %.0fs (%s): giving up, "
                "nothing was programmed",
                source.host,
                ONCE_SYNC_TIMEOUT,
                source.last_error or "no answer",
            )
            return False
        if source.wait_for_initial_sync(min(left, SYNC_WAIT_LOG_INTERVAL)):
            return True
        log.warning(
            "waiting for the Kubernetes API at %s: initial list of %s not complete yet (%s); "
            "nothing is programmed until it is",
            source.host,
            ", ".join(source.pending),
            source.last_error or "no answer yet",
        )
    return False


def run(args: argparse.Namespace) -> int:
    cfg = load_effective_config(args)
    if args.kubeconfig is not None:
        cfg = replace(
            cfg, client_connection=replace(cfg.client_connection, kubeconfig=str(args.kubeconfig))
        )
    backend = make_backend(cfg, args.netns)
    missing = plugins.missing_requirements(cfg.mode, backend)
    if missing:
        raise KubeplexError(f"mode {cfg.mode}: this node lacks what it needs: {'; '.join(missing)}")
    stop = threading.Event()
    runner: SyncRunner | None = None

    def _stop(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()
        if runner is not None:
            runner.stop()

    api: KubeApiSource | None = None
    manifests: ManifestSource | None = None
    if args.manifests is not None:
        cluster, manifests = state_from_manifests(cfg, args.manifests)
    else:
        api = _start_api_source(cfg)
        cluster = api.cluster
        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        if not _wait_for_api_sync(api, args.once, stop):
            api.stop()
            return EXIT_SYNC_FAILED
    ops: Operations | None = None
    try:
        backend.prepare()
        proxier = Proxier(cluster, backend)
        if args.once:
            # Just the rules: no servers, sysctls or conntrack work (nor their imports).
            if not proxier.sync(full=True):
                return EXIT_SYNC_FAILED
            # The rest is programmed; what was skipped is logged, and the exit code says so.
            if manifests is not None and (manifests.problems or cluster.invalid):
                return EXIT_CONFIG
            return EXIT_OK

        # Health and metrics servers, conntrack cleanup and sysctls.
        from kubeplex.core.daemon.operations import start_operations

        ops = start_operations(
            cfg,
            proxier,
            cluster,
            (lambda: api.node_deleting) if api is not None else (lambda: cluster.node.deleting),
            netns=args.netns,
        )

        sync_period, min_sync_period = backend.sync_periods()
        runner = SyncRunner(ops.sync, cluster.changed, min_sync_period, sync_period)
        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        if stop.is_set():
            return EXIT_OK
        if manifests is not None:
            watcher = threading.Thread(
                target=manifests.run, args=(stop,), name="manifests", daemon=True
            )
            watcher.start()
        runner.run()
        return EXIT_OK
    finally:
        if ops is not None:
            ops.stop()
        if api is not None:
            api.stop()
