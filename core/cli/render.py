"""``kubeplex render``: print what the next apply of the configured mode would send.

It reads the node's kernel first, as a sync does (``Backend.observe``), so what the node has
left over (to delete) or lacks (to repair) is in the plan; ``--no-observe`` (or a kernel that
cannot be read, e.g. without root) prints the rules alone, which needs nothing of the node.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from kubeplex.core.cli.options import (
    EXIT_CONFIG,
    EXIT_OK,
    Subparsers,
    add_common_options,
    load_effective_config,
)
from kubeplex.core.cli.printing import echo
from kubeplex.core.cli.shared import make_backend, state_from_manifests
from kubeplex.core.dataplane.backend import Backend
from kubeplex.core.model.graph import ProxyState
from kubeplex.core.startup.collector import collector_paused


def add_parser(sub: Subparsers, name: str) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        name, help="print what the next sync would send (reads the kernel when it may)"
    )
    add_common_options(p)
    p.add_argument("--manifests", type=Path, required=True)
    p.add_argument(
        "--no-observe",
        action="store_true",
        help="do not read the node's kernel first: print the rules alone",
    )
    return p


def observe(backend: Backend, state: ProxyState) -> Any:
    """The backend's observation of the kernel, or None (with a note) if it cannot read it."""
    try:
        return backend.observe(state)
    except Exception as err:  # not root, a tool missing, a plugin's bug: render all the same
        reason = " ".join(str(err).split())[:200] or type(err).__name__  # one line
        print(
            f"kubeplex: cannot read the kernel ({reason}); printing the rules alone, without what "
            "this node has left over or lacks",
            file=sys.stderr,
        )
        return None


def run(args: argparse.Namespace) -> int:
    cfg = load_effective_config(args)
    backend = make_backend(cfg, args.netns)
    cluster, source = state_from_manifests(cfg, args.manifests)
    state = cluster.checkout(full=True)
    observed = None if args.no_observe else observe(backend, state)
    with collector_paused():  # as the daemon renders
        # Leftovers to delete are named as the kernel holds them.
        echo(str(backend.render(state, observed)), end="")
    return EXIT_CONFIG if source.problems or cluster.invalid else EXIT_OK
