"""``kubeplex sysctls``: write the conntrack sysctls of a configuration, and more, then exit."""

from __future__ import annotations

import argparse
import logging
import re
import subprocess
from pathlib import Path

from kubeplex.core.cli.options import EXIT_OK, Subparsers, add_plugins_option, add_verbosity_option
from kubeplex.core.config.kubeproxy import load_config
from kubeplex.core.dataplane import plugins
from kubeplex.core.model.errors import KubeplexError

log = logging.getLogger("kubeplex")


def add_parser(sub: Subparsers, name: str) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        name,
        help="write the conntrack sysctls of a configuration, and more, then exit",
        description="Write the conntrack sysctls `run` would write for this configuration (for "
        "this node's CPUs), then each --set; a key is written only if it differs. Used by the "
        "Helm chart's privileged init container.",
    )
    p.add_argument("--config", type=Path, required=True, help="KubeProxyConfiguration file")
    p.add_argument(
        "--set",
        type=sysctl_assignment,
        action="append",
        default=[],
        dest="sysctls",
        metavar="NAME=VALUE",
        help="one more integer sysctl, e.g. net.ipv4.ip_forward=1 (repeatable)",
    )
    p.add_argument(
        "--netns", help="write the keys of this network namespace (a name in /run/netns or a path)"
    )
    p.add_argument(
        "--load-module",
        action="append",
        default=[],
        dest="modules",
        metavar="MODULE",
        type=module_name,
        help="load this kernel module first (repeatable): some keys exist only once their "
        "module is loaded, e.g. ip_vs for net.ipv4.vs.*",
    )
    add_verbosity_option(p)
    add_plugins_option(p)
    return p


def module_name(text: str) -> str:
    """``--load-module NAME``: a kernel module name as modprobe takes it."""
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", text):
        raise argparse.ArgumentTypeError(f"{text!r}: not a kernel module name")
    return text


def load_modules(modules: list[str]) -> None:
    """``modprobe`` each module (already loaded or built in: nothing happens)."""
    for name in modules:
        try:
            proc = subprocess.run(
                ["modprobe", "--", name], capture_output=True, text=True, check=False
            )
        except OSError as err:
            raise KubeplexError(f"cannot load kernel module {name}: {err}") from err
        if proc.returncode != 0:
            why = " ".join(proc.stderr.split()) or f"modprobe exited {proc.returncode}"
            raise KubeplexError(f"cannot load kernel module {name}: {why}")
        log.info("loaded kernel module %s", name)


def sysctl_assignment(text: str) -> tuple[str, int]:
    """``--set NAME=VALUE``: the key under /proc/sys and the integer value.

    NAME is dotted as sysctl(8) takes it, a slash standing for a dot inside one part
    (``net.ipv4.conf.eth0/100.rp_filter`` is ``net/ipv4/conf/eth0.100/rp_filter``).
    """
    name, sep, value = text.partition("=")
    name = name.strip()
    parts = [part.replace("/", ".") for part in name.split(".")]
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=VALUE")
    if len(parts) < 2 or any(p in ("", ".", "..") or "\0" in p for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r}: {name!r} is not a sysctl name")
    try:
        number = int(value.strip(), 10)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: the value must be an integer, got {value!r}"
        ) from None
    return "/".join(parts), number


def run(args: argparse.Namespace) -> int:
    # Imported here: only this command and the daemon's operations write sysctls.
    from kubeplex.core.daemon import sysctls

    cfg = load_config(args.config, known_modes=plugins.known_modes())
    load_modules(args.modules)
    settings = sysctls.conntrack_settings(cfg.conntrack)
    settings += [sysctls.SysctlSetting(key, value, "--set") for key, value in args.sysctls]
    try:
        report = sysctls.write_sysctls(settings, netns=args.netns)
    except OSError as err:  # only when the namespace cannot be entered: nothing was written
        raise KubeplexError(f"cannot enter network namespace {args.netns}: {err}") from err
    for name, before, after in report.changed:
        print(f"set {name} = {after} (was {before})")
    for name, why in report.skipped:
        log.warning("left %s alone: %s", name, why)
    report.raise_for_errors()
    return EXIT_OK
