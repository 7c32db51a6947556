"""What ``kube-proxy`` does to its own process at start: the OOM score, and one warning for
every configuration field that is set but cannot apply (:mod:`kubeplex.core.config.fields`).
"""

from __future__ import annotations

import logging
import resource
from pathlib import Path

from kubeplex.core.config.fields import start_warnings
from kubeplex.core.config.kubeproxy import KubeProxyConfiguration

__all__ = [
    "OOM_SCORE_ADJ",
    "apply_oom_score_adj",
    "prepare_process",
    "raise_open_files_limit",
    "warn_unusable_fields",
]

log = logging.getLogger(__name__)

OOM_SCORE_ADJ = Path("/proc/self/oom_score_adj")


def apply_oom_score_adj(value: int, path: Path = OOM_SCORE_ADJ) -> str | None:
    """Write oomScoreAdj for this process (upstream's oom.ApplyOOMScoreAdj on pid 0); the
    reason as text if the kernel refuses (lowering it needs CAP_SYS_RESOURCE), else None.

    A score that already protects the process as much (lower is more protected: the kubelet
    gives a node-critical pod its own) is kept: raising it would only make the process an
    earlier victim."""
    current = ""
    try:
        current = path.read_text().strip()
        if current.lstrip("-").isdigit() and int(current) <= value:
            return None
        path.write_text(f"{value}\n")
    except OSError as err:
        return (
            f"oomScoreAdj {value}: cannot write {path} (the score stays {current or 'unknown'}): "
            f"{err.strerror or err}"
        )
    return None


def raise_open_files_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard one, as every Go program does at start (so
    upstream's kube-proxy does): the usual soft limit, 1,024, is a limit for select(2), which
    kubeplex does not use, and connections held open by clients must not starve the rest of
    the process of descriptors. Returns (before, after); a refusal is logged and kept."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (OSError, ValueError) as err:
        log.info("open files limit stays %d (hard limit %d): %s", soft, hard, err)
        return soft, soft
    log.debug("open files limit raised from %d to %d", soft, hard)
    return soft, hard


def warn_unusable_fields(cfg: KubeProxyConfiguration) -> list[str]:
    """Log one warning per field the configuration sets that kubeplex cannot act on."""
    messages = []
    for path, why in start_warnings(cfg):
        message = f"configuration field {path} is set but not used: {why}"
        log.warning("%s", message, extra={"field": path})
        messages.append(message)
    return messages


def prepare_process(cfg: KubeProxyConfiguration, oom_path: Path = OOM_SCORE_ADJ) -> None:
    """At the start of the proxy: warn about unusable fields, then apply oomScoreAdj."""
    warn_unusable_fields(cfg)
    refused = apply_oom_score_adj(cfg.oom_score_adj, oom_path)
    if refused is not None:
        # At upstream's V(2): the pod's own score (the kubelet's) still applies.
        log.info("%s", refused)
