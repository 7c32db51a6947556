"""``kubeplex migrate``: being built (see the module's owner)."""

from __future__ import annotations

import argparse

from kubeplex.core.cli.shared import EXIT_USAGE, Subparsers, add_common_options


def add_parser(sub: Subparsers, name: str) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(name, help="(not available yet)")
    add_common_options(p)
    return p


def run(args: argparse.Namespace) -> int:
    print("kubeplex migrate: not available yet")
    return EXIT_USAGE
