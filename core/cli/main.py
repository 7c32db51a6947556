"""The ``kubeplex`` command line: one dispatch table, a module per command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence

from kubeplex.core.cli import (
    backends,
    cleanup,
    explain,
    lab,
    logs,
    migrate,
    render,
    run,
    sysctls,
    version,
)
from kubeplex.core.cli.shared import (
    EXIT_BACKEND,
    EXIT_CONFIG,
    EXIT_OK,
    EXIT_SYNC_FAILED,
    EXIT_USAGE,
    Command,
    add_plugins_option,
    reporting_errors,
)
from kubeplex.core.dataplane import plugins

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
    "migrate": migrate,
    "explain": explain,
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


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    # Before the configuration is read; a command that reads one configures it again.
    logs.configure(None, getattr(args, "verbosity", None))
    plugins.use_trust_file(getattr(args, "plugins", None))
    return reporting_errors("kubeplex", lambda: COMMANDS[args.command].run(args))


if __name__ == "__main__":
    sys.exit(main())
