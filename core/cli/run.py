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

# Only what reading the configuration and starting the API source need is imported here:
# the daemon's first request to the API server waits for these imports, while the rest
# (the daemon's parts, the backend) is imported in serve() as the lists are on their way.
from kubeplex.core.cli import logs
from kubeplex.core.cli.config_watch import EXIT_CONFIG_CHANGED, ConfigWatch
from kubeplex.core.cli.options import (
    EXIT_CONFIG,
    EXIT_OK,
    EXIT_SYNC_FAILED,
    Subparsers,
    add_common_options,
    add_master_option,
    load_effective_config,
    node_name,
)
from kubeplex.core.config.kubeproxy import KubeProxyConfiguration
from kubeplex.core.model.errors import KubeplexError
from kubeplex.core.startup import codecache
from kubeplex.core.startup.collector import collector_paused, freeze_once

if TYPE_CHECKING:
    from kubeplex.core.daemon.modes import SwitchReport
    from kubeplex.core.daemon.operations import Operations
    from kubeplex.core.daemon.runner import SyncRunner
    from kubeplex.core.dataplane.backend import SyncResult
    from kubeplex.core.model.cluster import ClusterState
    from kubeplex.core.model.graph import ProxyState
    from kubeplex.core.sources.kubeapi import KubeApiSource
    from kubeplex.core.sources.manifests import ManifestSource

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
    add_master_option(p)
    return p


def _start_api_source(cfg: KubeProxyConfiguration, master: str = "") -> KubeApiSource:
    # The source pauses the collector from its start until its lists are complete (then
    # freezes what the start made); before it, the client's imports are made with it off too.
    with collector_paused():
        source = _api_source(cfg, master)
    return source.start()


def _api_source(cfg: KubeProxyConfiguration, master: str) -> KubeApiSource:
    # Imported here: the kubernetes client is only needed (and paid for) without --manifests.
    from kubeplex.core.sources.kubeapi import KubeApiSource

    return KubeApiSource.from_config(cfg, node_name(cfg), master=master)


def _wait_for_api_sync(source: KubeApiSource, once: bool, stop: threading.Event) -> bool:
    """Wait until Services, EndpointSlices and the Node are listed; nothing is programmed
    before (a half-listed cluster would delete the rules of every Service not listed yet).
    A daemon waits forever and says so; ``--once`` gives up after ONCE_SYNC_TIMEOUT.
    Where the address is the ``kubernetes`` Service, which no proxy serves yet on a cluster
    without one, the lines say what to set instead."""
    from kubeplex.core.sources.api_address import kubernetes_service_hint

    hint = kubernetes_service_hint(source.host)
    hint = f"; {hint}" if hint else ""
    started = time.monotonic()
    while not stop.is_set():
        left = ONCE_SYNC_TIMEOUT - (time.monotonic() - started) if once else float("inf")
        if left <= 0:
            log.error(
                "no initial sync from the Kubernetes API at %s within %.0fs (%s): giving up, "
                "nothing was programmed%s",
                source.host,
                ONCE_SYNC_TIMEOUT,
                source.last_error or "no answer",
                hint,
            )
            return False
        if source.wait_for_initial_sync(min(left, SYNC_WAIT_LOG_INTERVAL)):
            return True
        log.warning(
            "waiting for the Kubernetes API at %s: initial list of %s not complete yet (%s); "
            "nothing is programmed until it is%s",
            source.host,
            ", ".join(source.pending),
            source.last_error or "no answer yet",
            hint,
        )
    return False


def _lists_complete(api: KubeApiSource | None, once: bool, stop: threading.Event) -> bool:
    """True once the source's initial lists are complete (at once without a source); a stop
    before then is a failed start, one after it a plain stop."""
    return api is None or api.synced or _wait_for_api_sync(api, once, stop)


class _FirstSync:
    """After each sync: the first ends the start, so it is told at verbosity 0 (as upstream
    tells its start), and the dataclass methods kept at build are no longer looked up."""

    def __init__(self) -> None:
        self.done = False

    def __call__(self, state: ProxyState, result: SyncResult, elapsed: float) -> None:
        codecache.done()
        if self.done:
            return
        self.done = True
        ports = ", ".join(f"{f.value} {len(g.services)}" for f, g in state.graphs.items())
        left_out = f"; {len(result.failed)} left out (errors above)" if result.failed else ""
        log.log(
            logs.NOTICE,
            "first sync done in %.1f ms: service ports %s%s",
            elapsed * 1000,
            ports,
            left_out,
        )


def run(args: argparse.Namespace) -> int:
    # Taken before the file is read: a change made while the daemon starts is seen too.
    watch = ConfigWatch(args.config) if args.config and not args.once else None
    cfg = load_effective_config(args)
    logs.configure(cfg, args.verbosity)
    if args.kubeconfig is not None:
        cfg = replace(
            cfg, client_connection=replace(cfg.client_connection, kubeconfig=str(args.kubeconfig))
        )
    return serve(
        cfg,
        manifests=args.manifests,
        once=args.once,
        netns=args.netns,
        watch=watch,
        master=args.master or "",
    )


def serve(
    cfg: KubeProxyConfiguration,
    *,
    manifests: Path | None = None,
    once: bool = False,
    netns: str | None = None,
    watch: ConfigWatch | None = None,
    master: str = "",
    switched: SwitchReport | None = None,
) -> int:
    """The daemon (``kubeplex run`` and ``kube-proxy``), or with ``once`` one full sync.
    With ``watch``, a change of the configuration file ends it with EXIT_CONFIG_CHANGED.
    After the first successful sync, the other modes' leftovers are removed (told to
    ``switched``): a node switched to this mode is never without rules."""
    stop = threading.Event()
    runner: SyncRunner | None = None
    config_changed = threading.Event()

    def _stop(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()
        if runner is not None:
            runner.stop()

    def _config_changed(_why: str) -> None:
        config_changed.set()
        stop.set()
        if runner is not None:
            runner.stop()

    def _exit_code() -> int:
        return EXIT_CONFIG_CHANGED if config_changed.is_set() else EXIT_OK

    api: KubeApiSource | None = None
    source: ManifestSource | None = None
    ops: Operations | None = None
    try:
        if manifests is None:
            # The initial lists go out first: loading the backend, its prepare() and the
            # listeners overlap with them. Nothing is synced before they are complete (the
            # cluster's checkout is gated, and the first sync waits for them below).
            api = _start_api_source(cfg, master)
            signal.signal(signal.SIGTERM, _stop)
            signal.signal(signal.SIGINT, _stop)
        # Imported now: with an API source, while its lists are on their way.
        from kubeplex.core.cli.shared import make_backend, state_from_manifests
        from kubeplex.core.daemon.modes import SwitchCleanup
        from kubeplex.core.daemon.process import (
            prepare_process,
            raise_open_files_limit,
            warn_unusable_fields,
        )
        from kubeplex.core.daemon.proxier import Proxier
        from kubeplex.core.daemon.runner import SyncRunner
        from kubeplex.core.dataplane import plugins

        raise_open_files_limit()  # any proxy process, a lab's too (Go's runtime does it)
        if once or netns is not None:
            # One sync, or a lab's proxy inside a namespace: not the node's proxy process,
            # whose OOM score is set (the fields nothing uses are still named).
            warn_unusable_fields(cfg)
        else:
            prepare_process(cfg)
        backend = make_backend(cfg, netns)
        missing = plugins.missing_requirements(cfg.mode, backend)
        if missing:
            raise KubeplexError(
                f"mode {cfg.mode}: this node lacks what it needs: {'; '.join(missing)}"
            )
        log.log(
            logs.NOTICE,
            "running in mode %s on node %s, from %s",
            cfg.mode,
            node_name(cfg),
            f"the Kubernetes API at {api.host}" if api is not None else f"manifests {manifests}",
        )
        if watch is not None:
            watch.start(stop, _config_changed)
        if api is not None:
            cluster: ClusterState = api.cluster
        else:
            assert manifests is not None
            cluster, source = state_from_manifests(cfg, manifests)
            freeze_once()  # what the start made, as after the API's initial lists
        backend.prepare()
        proxier = Proxier(cluster, backend)
        switch = SwitchCleanup(backend, switched)
        if once:
            if not _lists_complete(api, once, stop):
                return EXIT_CONFIG_CHANGED if config_changed.is_set() else EXIT_SYNC_FAILED
            proxier.listeners += [switch, _FirstSync()]
            # Just the rules: no servers, sysctls or conntrack work (nor their imports).
            if not proxier.sync(full=True):
                return EXIT_SYNC_FAILED
            # The rest is programmed; what was skipped is logged, and the exit code says so.
            if source is not None and (source.problems or cluster.invalid):
                return EXIT_CONFIG
            return EXIT_OK

        # Health and metrics servers, conntrack cleanup and sysctls.
        from kubeplex.core.daemon.operations import start_operations

        ops = start_operations(
            cfg,
            proxier,
            cluster,
            (lambda: api.node_deleting) if api is not None else (lambda: cluster.node.deleting),
            netns=netns,
        )
        proxier.listeners.append(switch)  # after the node's own listeners: health first
        proxier.listeners.append(_FirstSync())

        sync_period, min_sync_period = backend.sync_periods()
        runner = SyncRunner(ops.sync, cluster.changed, min_sync_period, sync_period)
        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        if not _lists_complete(api, once, stop):
            return EXIT_CONFIG_CHANGED if config_changed.is_set() else EXIT_SYNC_FAILED
        if stop.is_set():
            return _exit_code()
        if source is not None:
            watcher = threading.Thread(
                target=source.run, args=(stop,), name="manifests", daemon=True
            )
            watcher.start()
        runner.run()
        return _exit_code()
    finally:
        stop.set()  # ends the config watch
        if ops is not None:
            ops.stop()
        if api is not None:
            api.stop()
