"""``kubeplex cleanup``: remove the artifacts of every mode (``--mode``: one) from the node, as
upstream's ``kube-proxy --cleanup``, and say what was removed, per mode."""

from __future__ import annotations

import argparse
import sys

from kubeplex.core.cli.options import (
    EXIT_BACKEND,
    EXIT_OK,
    Subparsers,
    add_common_options,
    load_effective_config,
    node_name,
)
from kubeplex.core.cli.printing import echo
from kubeplex.core.config.kubeproxy import KubeProxyConfiguration
from kubeplex.core.daemon.modes import ModeCleanup, cleanup_modes, platform_modes
from kubeplex.core.dataplane.backend import BackendContext
from kubeplex.core.model.errors import KubeplexError, escaped


def add_parser(sub: Subparsers, name: str) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        name, help="remove every rule kubeplex (or kube-proxy) programmed, in every mode"
    )
    add_common_options(p)
    p.add_argument(
        "--mode", metavar="MODE", help="only this mode's artifacts (default: every mode's)"
    )
    return p


def clean(
    cfg: KubeProxyConfiguration, netns: str | None, mode: str | None = None
) -> list[ModeCleanup]:
    """Every mode's cleanup on this node (or ``mode``'s alone)."""
    if mode is not None and mode not in platform_modes():
        raise KubeplexError(
            f"mode {mode!r} is not a mode of this platform "
            f"(the trust list has: {', '.join(platform_modes()) or 'none'})"
        )
    ctx = BackendContext(config=cfg, node_name=node_name(cfg), netns=netns)
    return cleanup_modes(ctx, None if mode is None else [mode])


def run(args: argparse.Namespace) -> int:
    cfg = load_effective_config(args)
    results = clean(cfg, args.netns, args.mode)
    for done in results:
        for line in done.lines():
            # Names read back from the kernel, whoever made them.
            echo(escaped(line), file=sys.stderr if done.error else sys.stdout)
    return EXIT_BACKEND if any(r.error for r in results) else EXIT_OK
