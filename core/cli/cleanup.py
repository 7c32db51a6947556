"""``kubeplex cleanup``: remove every artifact of the configured mode from the node."""

from __future__ import annotations

import argparse

from kubeplex.core.cli.shared import (
    EXIT_OK,
    Subparsers,
    add_common_options,
    load_effective_config,
    make_backend,
)


def add_parser(sub: Subparsers, name: str) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        name, help="remove every rule the selected mode programmed"
    )
    add_common_options(p)
    return p


def run(args: argparse.Namespace) -> int:
    cfg = load_effective_config(args)
    report = make_backend(cfg, args.netns).cleanup()
    for line in report.removed:
        print(f"removed {line}")
    if not report.removed:
        print("nothing to remove")
    return EXIT_OK
