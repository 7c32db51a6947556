"""``python -m kubeplex.testing.vm [--timeout S] [--keep-log F] -- CMD ARGS...``

Runs CMD in a fresh VM (see the package's docstring) and exits with its status: 124 when it
timed out, 125 when the VM stopped without reporting it. Timings go to stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from kubeplex.testing.vm.runner import VM_FAILED_STATUS, VmError, run_in_vm, vm_unavailable


def _env_item(text: str) -> tuple[str, str]:
    """``NAME=VALUE``, or ``NAME`` for the host's value of NAME."""
    name, eq, value = text.partition("=")
    if not name:
        raise argparse.ArgumentTypeError(f"bad --env {text!r}")
    if not eq:
        if name not in os.environ:
            raise argparse.ArgumentTypeError(f"--env {name}: not set here")
        value = os.environ[name]
    return name, value


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m kubeplex.testing.vm")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds from launch (600)")
    p.add_argument("--keep-log", metavar="F", help="write the guest's console log to F")
    p.add_argument(
        "--env",
        type=_env_item,
        action="append",
        default=[],
        metavar="NAME[=VALUE]",
        help="pass a variable to the command (repeatable; PATH is always passed)",
    )
    p.add_argument("--share", metavar="DIR", help="folder shared read-write (default: here)")
    p.add_argument("--memory", type=int, default=None, metavar="MB", help="guest memory")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    ns = p.parse_args(argv)
    if ns.command[:1] == ["--"]:
        ns.command = ns.command[1:]
    if not ns.command:
        p.error("no command given (after --)")
    return ns


def main(argv: Sequence[str] | None = None) -> int:
    ns = _parse(argv)
    reason = vm_unavailable()
    if reason:
        print(f"kubeplex-vm: cannot run: {reason}", file=sys.stderr)
        return VM_FAILED_STATUS
    extra = {"memory_mb": ns.memory} if ns.memory else {}
    try:
        result = run_in_vm(
            ns.command,
            timeout=ns.timeout,
            env=dict(ns.env),
            share=ns.share,
            keep_log=ns.keep_log,
            **extra,
        )
    except VmError as exc:
        print(f"kubeplex-vm: {exc}", file=sys.stderr)
        return VM_FAILED_STATUS
    boot = f"{result.boot_seconds:.1f} s" if result.boot_seconds is not None else "-"
    ran = f"{result.command_seconds:.1f} s" if result.command_seconds is not None else "-"
    print(
        f"kubeplex-vm: kernel {result.release}, boot {boot}, command {ran}, "
        f"total {result.total_seconds:.1f} s, status {result.returncode}",
        file=sys.stderr,
    )
    if result.message and result.log_tail:
        print(f"kubeplex-vm: end of the console log:\n{result.log_tail}", file=sys.stderr)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
