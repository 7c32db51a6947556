"""The ``kubeplex`` command line: one dispatch table, a module per command."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping, Sequence

from kubeplex.core.cli import backends, cleanup, lab, render, run, sysctls, version
from kubeplex.core.cli.shared import (
    EXIT_BACKEND,
    EXIT_CONFIG,
    EXIT_OK,
    EXIT_SYNC_FAILED,
    EXIT_USAGE,
    Command,
    add_plugins_option,
)
from kubeplex.core.dataplane import plugins
from kubeplex.core.model.errors import InvalidObject, KubeplexError
from kubeplex.core.sources.manifests import ManifestsUnavailable

__all__ = [
    "COMMANDS",
    "EXIT_BACKEND",
    "EXIT_CONFIG",
    "EXIT_OK",
    "EXIT_SYNC_FAILED",
    "EXIT_USAGE",
    "main",
    "parser",
]

#: Every command, by name, in the order ``--help`` lists them.
COMMANDS: Mapping[str, Command] = {
    "run": run,
    "render": render,
    "cleanup": cleanup,
    "sysctls": sysctls,
    "version": version,
    "backends": backends,
    "lab": lab,
}


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="kubeplex", description="A Python kube-proxy.")
    add_plugins_option(top, default=None)
    sub = top.add_subparsers(dest="command", required=True)
    for name, command in COMMANDS.items():
        command.add_parser(sub, name)
    return top


def _setup_logging(verbosity: int) -> None:
    level = logging.DEBUG if verbosity >= 4 else logging.INFO if verbosity >= 1 else logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    _setup_logging(getattr(args, "verbosity", 0))
    plugins.use_trust_file(getattr(args, "plugins", None))
    try:
        return COMMANDS[args.command].run(args)
    except InvalidObject as err:
        print(f"kubeplex: invalid configuration: {err}", file=sys.stderr)
        return EXIT_CONFIG
    except (FileNotFoundError, ManifestsUnavailable) as err:
        print(f"kubeplex: {err}", file=sys.stderr)
        return EXIT_CONFIG
    except KubeplexError as err:
        print(f"kubeplex: {err}", file=sys.stderr)
        return EXIT_BACKEND
    except BrokenPipeError:  # `kubeplex render | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
