"""``kubeplex backends``: every installed or listed backend, its status and capabilities, and
the version of the backend contract this core speaks.

Listed backends are imported and constructed (they are trusted) to prove they load and to ask
their own requirements; an installed backend the trust list does not allow is shown as refused
and never imported.
"""

from __future__ import annotations

import argparse
import json
import socket
from typing import Any

from kubeplex.core.cli.options import EXIT_OK, Subparsers
from kubeplex.core.cli.printing import echo
from kubeplex.core.config.kubeproxy import default_config, with_overrides
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import CONTRACT_VERSION, BackendContext


def add_parser(sub: Subparsers, name: str) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        name, help="list the installed backends: allowed or refused, requirements, etc."
    )
    p.add_argument(
        "--plugins",
        type=str,
        default=argparse.SUPPRESS,
        metavar="FILE",
        help="trust list of backends (default: the one `kubeplex run` would use)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return p


def _context(mode: str) -> BackendContext:
    """What a backend is constructed with here: the default configuration of its mode."""
    cfg = with_overrides(default_config(), mode=mode, known_modes=plugins.known_modes())
    return BackendContext(config=cfg, node_name=socket.gethostname().strip().lower())


def run(args: argparse.Namespace) -> int:
    trust = plugins.load_trust_list()
    found = plugins.survey(trust, _context)
    if args.json:
        print(json.dumps(as_json(trust, found), indent=2, sort_keys=True))
    else:
        echo(table(trust, found), end="")  # plugins' metadata and load errors
    return EXIT_OK


def as_json(trust: plugins.TrustList, found: list[plugins.BackendStatus]) -> dict[str, Any]:
    return {
        "contractVersion": CONTRACT_VERSION,
        "trustList": {"path": trust.where, "origin": trust.origin},
        "backends": [
            {
                "mode": s.mode,
                "status": s.status,
                "detail": s.detail,
                "entryPoint": s.entry_point,
                "distribution": s.distribution,
                "platforms": list(s.platforms),
                "capabilities": None if s.capabilities is None else sorted(s.capabilities),
                "description": s.description,
                "ignored": list(s.ignored),
                "about": list(s.about),
            }
            for s in found
        ],
    }


def table(trust: plugins.TrustList, found: list[plugins.BackendStatus]) -> str:
    lines = [
        f"trust list: {trust.where} ({trust.origin})",
        f"backend contract: version {CONTRACT_VERSION}",
        "",
    ]
    rows = [("MODE", "STATUS", "ENTRY POINT", "CAPABILITIES")]
    rows += [
        (s.mode, s.status, s.entry_point or "-", plugins.capability_names(s.capabilities))
        for s in found
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for row in rows:
        cells = (c.ljust(w) for c, w in zip(row[:3], widths, strict=True))
        lines.append("  ".join(cells) + "  " + row[3])
    notes = [s for s in found if s.detail or s.ignored or s.about]
    if notes:
        lines.append("")
    for s in notes:
        if s.detail:
            lines.append(f"{s.mode}: {s.status}: {s.detail}".rstrip())
        lines += [f"{s.mode}: ignored (never imported): {i}" for i in s.ignored]
        lines += [f"{s.mode}: {line}" for line in s.about]
    if not found:
        lines.append("(no backend installed or listed)")
    return "\n".join(lines) + "\n"
