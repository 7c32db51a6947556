"""``kube-proxy``: kubeplex behind kube-proxy's own command line, so a DaemonSet written for
kube-proxy (kubeadm's: ``kube-proxy --config=... --hostname-override=$(NODE_NAME)``) runs it
unchanged. The flags are in :mod:`.kube_proxy_flags`, their precedence over the file in
:mod:`.kube_proxy_config`; the daemon is ``kubeplex run``'s.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml

# As in ``run``: only what the daemon's first request to the API server needs is imported
# here; cleanup and --init-only import their parts when asked.
from kubeplex.core.cli import kube_proxy_flags as flags
from kubeplex.core.cli import logs
from kubeplex.core.cli.config_watch import ConfigWatch
from kubeplex.core.cli.kube_proxy_config import build
from kubeplex.core.cli.options import EXIT_BACKEND, EXIT_OK, EXIT_USAGE, reporting_errors
from kubeplex.core.cli.printing import echo, printable
from kubeplex.core.cli.run import serve
from kubeplex.core.config.kubeproxy import KubeProxyConfiguration
from kubeplex.core.dataplane.entrypoints import KnownModes
from kubeplex.core.model.errors import KubeplexError, escaped
from kubeplex.core.startup import codecache
from kubeplex.core.version import __version__

log = logging.getLogger("kubeplex")

PROG = "kube-proxy"


def version_text(raw: bool = False) -> str:
    """``--version``: upstream prints ``Kubernetes vX.Y.Z``; this is kubeplex, following
    kube-proxy's release line."""
    if raw:
        return (
            f"version.Info{{Program:{PROG!r}, Implementation:'kubeplex', "
            f"Version:{__version__!r}, KubeProxy:{flags.KUBE_PROXY_VERSION!r}}}"
        )
    return f"kubeplex v{__version__} (kube-proxy {flags.KUBE_PROXY_VERSION})"


def write_config(cfg: KubeProxyConfiguration, path: str) -> None:
    """``--write-config-to``: the effective (defaulted) configuration, v1alpha1 YAML."""
    text = yaml.safe_dump(cfg.to_dict(), default_flow_style=False, sort_keys=True)
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as err:  # a folder, a full disk, no permission: said, not a traceback
        raise KubeplexError(
            f"--write-config-to {path}: cannot write: {err.strerror or err}"
        ) from err
    log.info("Wrote configuration to %s", path)


def cleanup_every_mode(cfg: KubeProxyConfiguration) -> int:
    """``--cleanup``: what ``kubeplex cleanup`` does, for every mode of this platform (as
    upstream cleans up iptables, ipvs and nftables alike), then exit."""
    from kubeplex.core.cli.cleanup import clean

    failed = False
    for done in clean(cfg, None):
        if done.error:
            log.error("mode %s: cleanup failed: %s", done.mode, done.error)
            failed = True
        elif done.skipped:
            log.info("mode %s: nothing to clean up here (%s)", done.mode, done.skipped)
        for line in done.removed:
            echo(f"removed {escaped(line)}")  # names read back from the kernel
    return EXIT_BACKEND if failed else EXIT_OK


def init_only(cfg: KubeProxyConfiguration) -> int:
    """``--init-only``: what needs full root before the daemon may run with CAP_NET_ADMIN
    alone: the mode's requirements and the conntrack sysctls; then exit."""
    from kubeplex.core.cli.shared import make_backend
    from kubeplex.core.daemon.sysctls import apply_conntrack_sysctls
    from kubeplex.core.dataplane import plugins

    backend = make_backend(cfg, None)
    missing = plugins.missing_requirements(cfg.mode, backend)
    if missing:
        raise KubeplexError(f"mode {cfg.mode}: this node lacks what it needs: {'; '.join(missing)}")
    report = apply_conntrack_sysctls(cfg.conntrack)
    for name, before, after in report.changed:
        log.info("set %s = %d (was %s)", name, after, before)
    for name, why in report.skipped:
        log.info("not setting %s: %s", name, why)
    report.raise_for_errors()
    return EXIT_OK


def _run(parsed: flags.ParsedFlags) -> int:
    config = parsed.get("config")
    daemon = not (parsed.get("write-config-to") or parsed.get("cleanup") or parsed.get("init-only"))
    # Taken before the file is read: a change made while the daemon starts is seen too.
    watch = ConfigWatch(config) if config and daemon else None
    built = build(parsed, KnownModes())
    cfg = built.config
    logs.configure(cfg, None)  # -v and the other logging flags are in cfg.logging
    for name, value in parsed.values.items():
        log.debug("FLAG: --%s=%r", name, value)
    for warning in built.warnings:
        log.warning("%s", warning)
    if parsed.get("write-config-to"):
        write_config(cfg, str(parsed.get("write-config-to")))
        return EXIT_OK
    if parsed.get("cleanup"):
        return cleanup_every_mode(cfg)
    if parsed.get("init-only"):
        return init_only(cfg)
    return serve(cfg, watch=watch, master=built.master)


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        parsed = flags.parse(args)
    except flags.UsageError as err:
        print(f"Error: {printable(str(err))}\nRun '{PROG} --help' for usage.", file=sys.stderr)
        return EXIT_USAGE
    if parsed.get("help"):
        print(flags.usage(), end="")
        return EXIT_OK
    version = parsed.get("version", False)
    if version:  # as upstream: before anything else is looked at
        print(version_text(raw=version == "raw"))
        return EXIT_OK

    def run() -> int:
        try:
            return _run(parsed)
        except flags.UsageError as err:
            print(f"Error: {printable(str(err))}\nRun '{PROG} --help' for usage.", file=sys.stderr)
            return EXIT_USAGE

    try:
        return reporting_errors(PROG, run)
    finally:
        codecache.done()


if __name__ == "__main__":
    sys.exit(main())
