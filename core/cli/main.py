"""The ``kubeplex`` command line: one dispatch table, a module per command."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import cast

from kubeplex.core.cli import logs
from kubeplex.core.cli.options import (
    EXIT_BACKEND,
    EXIT_CONFIG,
    EXIT_OK,
    EXIT_SYNC_FAILED,
    EXIT_USAGE,
    Command,
    add_plugins_option,
    reporting_errors,
)
from kubeplex.core.dataplane.trustfile import use_trust_file
from kubeplex.core.startup import codecache
from kubeplex.core.startup.collector import collector_paused

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
_NAMES = ("run", "render", "cleanup", "migrate", "explain", "sysctls", "version", "backends", "lab")
_MODULES = {name: f"kubeplex.core.cli.{name}" for name in _NAMES}


class _Commands(Mapping[str, Command]):
    """The command modules by name, each imported when first looked up: a command's start
    (the daemon's first request to the API server) does not wait for the others' imports."""

    def __getitem__(self, name: str) -> Command:
        return cast(Command, importlib.import_module(_MODULES[name]))

    def __iter__(self) -> Iterator[str]:
        return iter(_MODULES)

    def __len__(self) -> int:
        return len(_MODULES)


COMMANDS: Mapping[str, Command] = _Commands()


def parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line; with ``command``, only that command's (the others not imported)."""
    top = argparse.ArgumentParser(prog="kubeplex", description="A Python kube-proxy.")
    add_plugins_option(top, default=None)
    sub = top.add_subparsers(dest="command", required=True)
    for name in [command] if command is not None else COMMANDS:
        COMMANDS[name].add_parser(sub, name)
    return top


def _command_in(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names, if plainly (after nothing but ``--plugins FILE``); None
    otherwise (``--help``, a typo, an abbreviated option): then the whole parser decides."""
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--plugins":
            skip = True
        elif not arg.startswith("--plugins="):
            return arg if arg in _MODULES else None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # The command's module is imported with the collector off: a start's imports make tens of
    # thousands of objects that all live on, and passes over them would find nothing to free.
    with collector_paused():
        args = parser(_command_in(argv)).parse_args(argv)
    # Before the configuration is read; a command that reads one configures it again.
    logs.configure(None, getattr(args, "verbosity", None))
    use_trust_file(getattr(args, "plugins", None))
    try:
        return reporting_errors("kubeplex", lambda: COMMANDS[args.command].run(args))
    finally:
        codecache.done()


if __name__ == "__main__":
    sys.exit(main())
