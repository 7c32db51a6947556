"""``kubeplex version``."""

from __future__ import annotations

import argparse

from kubeplex.core.cli.options import EXIT_OK, Subparsers
from kubeplex.core.version import __version__


def add_parser(sub: Subparsers, name: str) -> argparse.ArgumentParser:
    return sub.add_parser(name, help="print the version")


def run(args: argparse.Namespace) -> int:
    print(f"kubeplex {__version__}")
    return EXIT_OK
