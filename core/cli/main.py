"""The ``kubeplex`` command line."""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from kubeplex.core.config.kubeproxy import (
    KubeProxyConfiguration,
    default_config,
    load_config,
    with_overrides,
)
from kubeplex.core.daemon.proxier import Proxier, collector_paused
from kubeplex.core.daemon.runner import SyncRunner
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import Backend, BackendContext
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.errors import InvalidObject, KubeplexError
from kubeplex.core.sources.manifests import ManifestSource, ManifestsUnavailable
from kubeplex.core.version import __version__

if TYPE_CHECKING:
    from kubeplex.core.daemon.operations import Operations
    from kubeplex.core.sources.kubeapi import KubeApiSource

log = logging.getLogger("kubeplex")

# Exit codes a script can act on.
EXIT_OK = 0
EXIT_SYNC_FAILED = 1
EXIT_USAGE = 2
EXIT_CONFIG = 3
EXIT_BACKEND = 4


def _common(p: argparse.ArgumentParser, config_required: bool = False) -> None:
    p.add_argument(
        "--config", type=Path, required=config_required, help="KubeProxyConfiguration file"
    )
    p.add_argument("--hostname-override", help="node name (default: the hostname)")
    p.add_argument("--proxy-mode", help="overrides mode: iptables, nftables, ipvs, kernelspace")
    p.add_argument("--cluster-cidr", help="overrides clusterCIDR (comma-separated, one per family)")
    p.add_argument("-v", "--v", type=int, default=0, dest="verbosity", help="log verbosity (0-5)")
    # Programs the rules inside a network namespace (used by the lab and the kernel tests).
    p.add_argument("--netns", help=argparse.SUPPRESS)
    add_plugins_option(p)


def add_plugins_option(p: argparse.ArgumentParser, default: object = argparse.SUPPRESS) -> None:
    """``--plugins FILE``: the trust list (plugins.toml) to use instead of the default one."""
    p.add_argument(
        "--plugins",
        type=Path,
        default=default,
        metavar="FILE",
        help=f"trust list of backends (default: ${plugins.ENV_VAR}, "
        f"{plugins.SYSTEM_TRUST_FILE} if present, else the packaged plugins.toml)",
    )


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="kubeplex", description="A Python kube-proxy.")
    add_plugins_option(top, default=None)
    sub = top.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the proxy (daemon)")
    _common(run)
    run.add_argument(
        "--manifests", type=Path, help="folder or file of Service/EndpointSlice/Node YAML"
    )
    run.add_argument(
        "--once", action="store_true", help="one full sync, then exit (non-zero if it failed)"
    )
    run.add_argument(
        "--kubeconfig", type=Path, help="kubeconfig file (overrides clientConnection.kubeconfig)"
    )

    render = sub.add_parser("render", help="print what the selected mode would program (no root)")
    _common(render)
    render.add_argument("--manifests", type=Path, required=True)

    cleanup = sub.add_parser("cleanup", help="remove every rule the selected mode programmed")
    _common(cleanup)

    sysctl = sub.add_parser(
        "sysctls",
        help="write the conntrack sysctls of a configuration, and more, then exit",
        description="Write the conntrack sysctls `run` would write for this configuration (for "
        "this node's CPUs), then each --set; a key is written only if it differs. Used by the "
        "Helm chart's privileged init container.",
    )
    sysctl.add_argument("--config", type=Path, required=True, help="KubeProxyConfiguration file")
    sysctl.add_argument(
        "--set",
        type=sysctl_assignment,
        action="append",
        default=[],
        dest="sysctls",
        metavar="NAME=VALUE",
        help="one more integer sysctl, e.g. net.ipv4.ip_forward=1 (repeatable)",
    )
    sysctl.add_argument(
        "--netns", help="write the keys of this network namespace (a name in /run/netns or a path)"
    )
    sysctl.add_argument(
        "-v", "--v", type=int, default=0, dest="verbosity", help="log verbosity (0-5)"
    )
    add_plugins_option(sysctl)

    sub.add_parser("version", help="print the version")

    from kubeplex.core.cli import backends as backends_cmd
    from kubeplex.core.cli import lab  # the lab pulls in the test-lab helpers

    backends_cmd.add_parser(sub)
    lab.add_parser(sub)
    return top


def _setup_logging(verbosity: int) -> None:
    level = logging.DEBUG if verbosity >= 4 else logging.INFO if verbosity >= 1 else logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def load_effective_config(args: argparse.Namespace) -> KubeProxyConfiguration:
    modes = plugins.known_modes()
    cfg = load_config(args.config, known_modes=modes) if args.config else default_config()
    return with_overrides(
        cfg,
        hostname_override=args.hostname_override,
        mode=args.proxy_mode,
        cluster_cidr=args.cluster_cidr,
        known_modes=modes,
    )


def node_name(cfg: KubeProxyConfiguration) -> str:
    return (cfg.hostname_override or socket.gethostname()).strip().lower()


def make_backend(cfg: KubeProxyConfiguration, netns: str | None) -> Backend:
    ctx = BackendContext(config=cfg, node_name=node_name(cfg), netns=netns)
    return plugins.load_backend(cfg.mode, ctx)


def _state_from_manifests(
    cfg: KubeProxyConfiguration, path: Path
) -> tuple[ClusterState, ManifestSource]:
    cluster = ClusterState(node_name(cfg))
    source = ManifestSource(path, cluster)
    with collector_paused():  # parsing allocates an object per endpoint, none in a cycle
        source.load()
    return cluster, source


def cmd_render(args: argparse.Namespace) -> int:
    cfg = load_effective_config(args)
    backend = make_backend(cfg, None)
    cluster, source = _state_from_manifests(cfg, args.manifests)
    state = cluster.checkout(full=True)
    with collector_paused():  # as the daemon renders
        sys.stdout.write(str(backend.render(state)))
    return EXIT_CONFIG if source.problems or cluster.invalid else EXIT_OK


def sysctl_assignment(text: str) -> tuple[str, int]:
    """``--set NAME=VALUE``: the key under /proc/sys and the integer value.

    NAME is dotted as sysctl(8) takes it, a slash standing for a dot inside one part
    (``net.ipv4.conf.eth0/100.rp_filter`` is ``net/ipv4/conf/eth0.100/rp_filter``).
    """
    name, sep, value = text.partition("=")
    name = name.strip()
    parts = [part.replace("/", ".") for part in name.split(".")]
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=VALUE")
    if len(parts) < 2 or any(p in ("", ".", "..") or "\0" in p for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r}: {name!r} is not a sysctl name")
    try:
        number = int(value.strip(), 10)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: the value must be an integer, got {value!r}"
        ) from None
    return "/".join(parts), number


def cmd_sysctls(args: argparse.Namespace) -> int:
    # Imported here: only this command and the daemon's operations write sysctls.
    from kubeplex.core.daemon import sysctls

    cfg = load_config(args.config, known_modes=plugins.known_modes())
    settings = sysctls.conntrack_settings(cfg.conntrack)
    settings += [sysctls.SysctlSetting(key, value, "--set") for key, value in args.sysctls]
    try:
        report = sysctls.write_sysctls(settings, netns=args.netns)
    except OSError as err:  # only when the namespace cannot be entered: nothing was written
        raise KubeplexError(f"cannot enter network namespace {args.netns}: {err}") from err
    for name, before, after in report.changed:
        print(f"set {name} = {after} (was {before})")
    for name, why in report.skipped:
        log.warning("left %s alone: %s", name, why)
    report.raise_for_errors()
    return EXIT_OK


def cmd_cleanup(args: argparse.Namespace) -> int:
    cfg = load_effective_config(args)
    make_backend(cfg, args.netns).cleanup()
    return EXIT_OK


#: How long ``run --once`` waits for the initial lists from the API server before giving up.
ONCE_SYNC_TIMEOUT = 60.0
#: How often a daemon still waiting for the API server says so.
SYNC_WAIT_LOG_INTERVAL = 10.0


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


def cmd_run(args: argparse.Namespace) -> int:
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
        cluster, manifests = _state_from_manifests(cfg, args.manifests)
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

        sync_period, min_sync_period = cfg.sync_periods()
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


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    _setup_logging(getattr(args, "verbosity", 0))
    plugins.use_trust_file(getattr(args, "plugins", None))
    try:
        if args.command == "version":
            print(f"kubeplex {__version__}")
            return EXIT_OK
        if args.command == "render":
            return cmd_render(args)
        if args.command == "cleanup":
            return cmd_cleanup(args)
        if args.command == "run":
            return cmd_run(args)
        if args.command == "sysctls":
            return cmd_sysctls(args)
        return int(args.handler(args))
    except InvalidObject as err:
        print(f"kubeplex: invalid configuration: {err}", file=sys.stderr)
        return EXIT_CONFIG
    except (FileNotFoundError, ManifestsUnavailable) as err:
        print(f"kubeplex: {err}", file=sys.stderr)
        return EXIT_CONFIG
    except KubeplexError as err:
        print(f"kubeplex: {err}", file=sys.stderr)
        return EXIT_BACKEND


if __name__ == "__main__":
    sys.exit(main())
