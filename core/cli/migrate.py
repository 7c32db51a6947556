"""``kubeplex migrate --to MODE``: switch this node to another mode without a window.

The target mode is programmed first (one full sync, from the same configuration and sources
as ``kubeplex run``); only then are the other modes' artifacts removed, keeping what the
target lists as its own (modes may share chains). Established connections keep flowing:
conntrack holds their NAT, whichever rules made it. ``--check`` compares instead of switching
(``kubeplex.core.cli.preflight``).
"""

from __future__ import annotations

import argparse
import importlib
import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from kubeplex.core.cli import logs
from kubeplex.core.cli.options import (
    EXIT_BACKEND,
    EXIT_OK,
    Subparsers,
    add_common_options,
    load_effective_config,
)
from kubeplex.core.cli.printing import echo
from kubeplex.core.cli.run import serve
from kubeplex.core.config.kubeproxy import with_overrides
from kubeplex.core.daemon.modes import ModeCleanup
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import SyncResult
from kubeplex.core.model.errors import escaped


def add_parser(sub: Subparsers, name: str) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        name, help="switch this node to another mode (target programmed first, then the rest go)"
    )
    add_common_options(p)
    p.add_argument("--to", required=True, metavar="MODE", help="the mode to switch to")
    p.add_argument(
        "--manifests", type=Path, help="folder or file of Service/EndpointSlice/Node YAML"
    )
    p.add_argument(
        "--kubeconfig", type=Path, help="kubeconfig file (overrides clientConnection.kubeconfig)"
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="compare what the current and the target mode program; change nothing",
    )
    p.add_argument("-o", "--output", choices=("text", "json"), default="text")
    return p


class _Switch:
    """Collects what ``serve`` reports of the switch."""

    def __init__(self) -> None:
        self.result: SyncResult | None = None
        self.elapsed = 0.0
        self.cleanups: list[ModeCleanup] = []

    def __call__(self, result: SyncResult, elapsed: float, cleanups: Sequence[ModeCleanup]) -> None:
        self.result, self.elapsed, self.cleanups = result, elapsed, list(cleanups)

    def as_dict(self, mode: str, code: int) -> dict[str, Any]:
        return {
            "to": mode,
            "programmed": self.result is not None,
            "sync_ms": round(self.elapsed * 1000, 1),
            "services_failed": dict(self.result.failed) if self.result else {},
            "modes": [
                {
                    "mode": c.mode,
                    "removed": list(c.removed),
                    "draining": list(c.draining),
                    "skipped": c.skipped,
                    "error": c.error,
                }
                for c in self.cleanups
            ],
            "exit_code": code,
        }

    def lines(self, mode: str) -> list[str]:
        if self.result is None:
            return [f"{mode}: not programmed; nothing else was touched"]
        out = [f"{mode}: programmed (one full sync, {self.elapsed * 1000:.1f} ms)"]
        out += [f"{mode}: service {n} left out: {why}" for n, why in self.result.failed.items()]
        for done in self.cleanups:
            out += done.lines()
        return out


def run(args: argparse.Namespace) -> int:
    if args.check:
        # The other half of the command, in its own module; imported only when asked for.
        preflight = importlib.import_module("kubeplex.core.cli.preflight")
        return int(preflight.run_check(args))
    cfg = load_effective_config(args)
    logs.configure(cfg, args.verbosity)
    cfg = with_overrides(cfg, mode=args.to, known_modes=plugins.known_modes())
    if args.kubeconfig is not None:
        cfg = replace(
            cfg, client_connection=replace(cfg.client_connection, kubeconfig=str(args.kubeconfig))
        )
    switch = _Switch()
    code = serve(cfg, manifests=args.manifests, once=True, netns=args.netns, switched=switch)
    if code == EXIT_OK and any(c.error for c in switch.cleanups):
        code = EXIT_BACKEND  # the node runs the target mode; an old mode's rules are left
    if args.output == "json":
        print(json.dumps(switch.as_dict(cfg.mode, code), indent=2, sort_keys=True))
    else:
        for line in switch.lines(cfg.mode):
            echo(escaped(line))  # leftovers read back from the kernel
    return code
