"""What every ``kubeplex`` command shares and may need before anything else is imported: exit
codes, options, the configuration. Cheap to import: the daemon's first request to the API
server waits for it (what builds a backend or a cluster state is in ``shared``)."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeAlias

from kubeplex.core.cli.printing import printable
from kubeplex.core.config.kubeproxy import (
    KubeProxyConfiguration,
    default_config,
    load_config,
    with_overrides,
)
from kubeplex.core.dataplane.entrypoints import KnownModes
from kubeplex.core.dataplane.trustfile import ENV_VAR, SYSTEM_TRUST_FILE
from kubeplex.core.model.errors import InputUnavailable, InvalidObject, KubeplexError

# Exit codes a script can act on.
EXIT_OK = 0
EXIT_SYNC_FAILED = 1
EXIT_USAGE = 2
EXIT_CONFIG = 3
EXIT_BACKEND = 4


def reporting_errors(prog: str, command: Callable[[], int]) -> int:
    """Run ``command``; an error it raises is one line on stderr and its exit code."""
    try:
        return command()
    except InvalidObject as err:
        print(f"{prog}: invalid configuration: {printable(str(err))}", file=sys.stderr)
        return EXIT_CONFIG
    except (FileNotFoundError, InputUnavailable) as err:
        print(f"{prog}: {printable(str(err))}", file=sys.stderr)
        return EXIT_CONFIG
    except KubeplexError as err:
        # Its own lines (a trust-list snippet to paste), whatever it quotes escaped.
        print(f"{prog}: {printable(str(err))}", file=sys.stderr)
        return EXIT_BACKEND
    except BrokenPipeError:  # `kubeplex render | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


def add_common_options(p: argparse.ArgumentParser, config_required: bool = False) -> None:
    """The options of every command that builds a backend from a configuration."""
    p.add_argument(
        "--config", type=Path, required=config_required, help="KubeProxyConfiguration file"
    )
    p.add_argument("--hostname-override", help="node name (default: the hostname)")
    p.add_argument(
        "--proxy-mode", help="overrides mode (one of the backends `kubeplex backends` lists)"
    )
    p.add_argument("--cluster-cidr", help="overrides clusterCIDR (comma-separated, one per family)")
    add_verbosity_option(p)
    # Programs the rules inside a network namespace (used by the lab and the kernel tests).
    p.add_argument("--netns", help=argparse.SUPPRESS)
    add_plugins_option(p)


def add_master_option(p: argparse.ArgumentParser) -> None:
    """kube-proxy's ``--master``: where the API server is, for a node whose pods cannot reach
    it through the ``kubernetes`` Service yet (no proxy has programmed it)."""
    p.add_argument(
        "--master",
        metavar="URL",
        help="The address of the Kubernetes API server (overrides any value in kubeconfig); "
        "without a kubeconfig, a pod's service account is sent to it",
    )


def add_verbosity_option(p: argparse.ArgumentParser) -> None:
    # None when not given: then the configuration's logging.verbosity applies, as upstream.
    p.add_argument(
        "-v", "--v", type=int, default=None, dest="verbosity", help="log verbosity (0-5)"
    )


def add_plugins_option(p: argparse.ArgumentParser, default: object = argparse.SUPPRESS) -> None:
    """``--plugins FILE``: the trust list (plugins.toml) to use instead of the default one."""
    p.add_argument(
        "--plugins",
        type=Path,
        default=default,
        metavar="FILE",
        help=f"trust list of backends (default: ${ENV_VAR}, "
        f"{SYSTEM_TRUST_FILE} if present, else the packaged plugins.toml)",
    )


def load_effective_config(args: argparse.Namespace) -> KubeProxyConfiguration:
    """The configuration file (or the defaults) with the command line's overrides."""
    modes = KnownModes()
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


#: What ``sub.add_parser`` is called on (argparse's subparsers action).
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


class Command(Protocol):
    """A module of one ``kubeplex`` command (see ``kubeplex.core.cli.main.COMMANDS``)."""

    def add_parser(self, sub: Subparsers, name: str) -> argparse.ArgumentParser:
        """Add the command's parser, called ``name``, to ``sub``."""
        ...

    def run(self, args: argparse.Namespace) -> int:
        """Run the command; returns the exit code."""
        ...
