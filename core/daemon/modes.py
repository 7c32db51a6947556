"""Every mode of this platform at once: cleaning them all up (``kubeplex cleanup``,
``kube-proxy --cleanup``), and removing the other modes' leftovers once the active mode has
programmed the node (a daemon's first sync, ``kubeplex migrate``).

Modes are the trust list's, found through the plugin loader: nothing here names one. Two modes
may share kernel objects (the iptables and ipvs modes both write KUBE-SERVICES), so another
mode's cleanup after a switch keeps what the active mode lists as its own leftovers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, replace

from kubeplex.core.config.kubeproxy import with_overrides
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import Backend, BackendContext, SyncResult
from kubeplex.core.model.errors import KubeplexError
from kubeplex.core.model.graph import ProxyState

__all__ = ["ModeCleanup", "SwitchCleanup", "cleanup_modes", "platform_modes"]

log = logging.getLogger(__name__)

#: Builds the backend of a mode from its context (tests pass backends on fake kernels).
MakeBackend = Callable[[str, BackendContext], Backend]


@dataclass(frozen=True)
class ModeCleanup:
    """What the cleanup of one mode did."""

    mode: str
    removed: tuple[str, ...] = ()
    #: Why there was nothing to clean (the mode cannot run here), else "".
    skipped: str = ""
    #: Why the cleanup failed, else "".
    error: str = ""

    def lines(self) -> list[str]:
        """For people: one line per artifact removed, or one saying why nothing was."""
        if self.error:
            return [f"{self.mode}: cleanup failed: {self.error}"]
        if self.removed:
            return [f"{self.mode}: removed {line}" for line in self.removed]
        why = f" ({self.skipped})" if self.skipped else ""
        return [f"{self.mode}: nothing to remove{why}"]


def platform_modes() -> list[str]:
    """The trust list's modes for this platform, by name."""
    trust = plugins.load_trust_list()
    here = plugins.this_platform()
    return sorted(m for m, entry in trust.backends.items() if here in entry.platforms)


def _load(mode: str, ctx: BackendContext) -> Backend:
    return plugins.load_backend(mode, ctx)


def cleanup_modes(
    ctx: BackendContext,
    modes: Iterable[str] | None = None,
    keep: Collection[str] = (),
    make: MakeBackend = _load,
) -> list[ModeCleanup]:
    """Clean up ``modes`` (default: every mode of this platform) on the node of ``ctx``
    (its configuration's mode is replaced by each one's; its kernel seam is not used: each
    mode opens its own), leaving what ``keep`` names. A mode whose requirements this node
    lacks has nothing to clean; one that fails is reported and the others still run."""
    out = []
    for mode in platform_modes() if modes is None else modes:
        out.append(_cleanup_one(ctx, mode, keep, make))
    return out


def _cleanup_one(
    ctx: BackendContext, mode: str, keep: Collection[str], make: MakeBackend
) -> ModeCleanup:
    if make is _load and not plugins.installed(mode):
        return ModeCleanup(mode, skipped="no backend installed for it")
    try:
        # The trust list's requirements first: a backend may need them to start at all.
        missing = plugins.missing_requirements(mode)
        if not missing:
            cfg = with_overrides(ctx.config, mode=mode, known_modes=plugins.known_modes())
            backend = make(mode, replace(ctx, config=cfg, kernel=None))
            missing = backend.missing_requirements()
        if missing:
            return ModeCleanup(mode, skipped="; ".join(missing))
        # Without anything to keep, the call a plugin written before `keep` also answers.
        report = backend.cleanup(keep=keep) if keep else backend.cleanup()
    except KubeplexError as err:
        return ModeCleanup(mode, error=str(err))
    except Exception as err:  # a plugin's bug costs its own cleanup only
        log.exception("cleanup of mode %s crashed", mode)
        return ModeCleanup(mode, error=f"crashed: {err!r}")
    return ModeCleanup(mode, tuple(report.removed))


def remove_other_modes(active: Backend, make: MakeBackend = _load) -> list[ModeCleanup]:
    """Clean up every mode but the active one, keeping what the active one programmed."""
    keep = set(active.leftovers())
    others = [m for m in platform_modes() if m != active.mode]
    return cleanup_modes(active.ctx, others, keep, make)


#: Told what the switch did: the active mode's first sync and the others' cleanups.
SwitchReport = Callable[[SyncResult, float, Sequence[ModeCleanup]], None]


class SwitchCleanup:
    """A Proxier listener: after the active mode's first successful sync (the node has its
    rules), remove the other modes' leftovers, once. Logged per mode, never fatal: a failure
    leaves the other mode's rules, which the active mode's rules take precedence over only
    where the kernel says so, and the next start (or ``kubeplex cleanup``) tries again."""

    def __init__(
        self, backend: Backend, report: SwitchReport | None = None, make: MakeBackend = _load
    ) -> None:
        self.backend = backend
        self.report = report
        self.make = make
        self.done = False
        self.results: list[ModeCleanup] = []

    def __call__(self, state: ProxyState, result: SyncResult, elapsed: float) -> None:
        if self.done:
            return
        self.done = True
        try:
            self.results = remove_other_modes(self.backend, self.make)
        except Exception as err:  # reading the active mode's leftovers, the trust list...
            log.exception("removing the other modes' leftovers failed")
            self.results = [ModeCleanup("?", error=repr(err))]
        for done in self.results:
            if done.error:
                log.error("mode %s: removing its leftovers failed: %s", done.mode, done.error)
            elif done.removed:
                log.info(
                    "mode %s: removed %d leftovers (active mode: %s)",
                    done.mode,
                    len(done.removed),
                    self.backend.mode,
                )
                for line in done.removed:
                    log.debug("mode %s: removed %s", done.mode, line)
        if self.report is not None:
            self.report(result, elapsed, self.results)
