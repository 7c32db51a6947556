"""Every mode of this platform at once: cleaning them all up (``kubeplex cleanup``,
``kube-proxy --cleanup``), and removing the other modes' leftovers once the active mode has
programmed the node (a daemon's first sync, ``kubeplex migrate``).

Modes are the trust list's, found through the plugin loader: nothing here names one. Two modes
may share kernel objects (the iptables and ipvs modes both write KUBE-SERVICES), so another
mode's cleanup after a switch keeps what the active mode lists as its own leftovers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

from kubeplex.core.config.kubeproxy import with_overrides
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import Backend, BackendContext, SyncResult
from kubeplex.core.model.errors import KubeplexError
from kubeplex.core.model.graph import ProxyState

__all__ = ["ModeCleanup", "SwitchCleanup", "cleanup_modes", "platform_modes"]

log = logging.getLogger(__name__)

#: Seconds between the checks of another mode's draining objects after a switch.
DRAIN_RECHECK = 10.0

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
    #: Left in place while established connections still need them (``cleanup(drain=True)``).
    draining: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        """For people: one line per artifact removed or draining, or one saying why nothing
        was removed."""
        if self.error:
            return [f"{self.mode}: cleanup failed: {self.error}"]
        out = [f"{self.mode}: removed {line}" for line in self.removed]
        out += [f"{self.mode}: draining {line}" for line in self.draining]
        if out:
            return out
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
    drain: bool = False,
) -> list[ModeCleanup]:
    """Clean up ``modes`` (default: every mode of this platform) on the node of ``ctx``
    (its configuration's mode is replaced by each one's; its kernel seam is not used: each
    mode opens its own), leaving what ``keep`` names (and, with ``drain``, what established
    connections still need). A mode whose requirements this node lacks has nothing to clean;
    one that fails is reported and the others still run."""
    out = []
    for mode in platform_modes() if modes is None else modes:
        out.append(_cleanup_one(ctx, mode, keep, make, drain))
    return out


def _cleanup_one(
    ctx: BackendContext, mode: str, keep: Collection[str], make: MakeBackend, drain: bool
) -> ModeCleanup:
    if make is _load and not plugins.installed(mode):
        return ModeCleanup(mode, skipped="no backend installed for it")
    try:
        # The trust list's requirements first: a backend may need them to start at all.
        missing = plugins.missing_requirements(mode)
        if not missing:
            cfg = with_overrides(ctx.config, mode=mode, known_modes=plugins.known_modes())
            backend = make(mode, replace(ctx, config=cfg, kernel=None))
            missing = backend.missing_for_cleanup()
        if missing:
            return ModeCleanup(mode, skipped="; ".join(missing))
        # Plain cleanups make the call a plugin written before `keep` and `drain` answers.
        report = (
            backend.cleanup(keep=keep, drain=True)
            if drain
            else backend.cleanup(keep=keep)
            if keep
            else backend.cleanup()
        )
    except KubeplexError as err:
        return ModeCleanup(mode, error=str(err))
    except Exception as err:  # a plugin's bug costs its own cleanup only
        log.exception("cleanup of mode %s crashed", mode)
        return ModeCleanup(mode, error=f"crashed: {err!r}")
    return ModeCleanup(mode, tuple(report.removed), draining=tuple(report.draining))


def remove_other_modes(
    active: Backend, make: MakeBackend = _load, modes: Iterable[str] | None = None
) -> list[ModeCleanup]:
    """Clean up every mode but the active one (or those of ``modes``), keeping what the
    active one programmed and what established connections still need (drain)."""
    others = [m for m in platform_modes() if m != active.mode] if modes is None else modes
    return cleanup_modes(active.ctx, others, ActiveLeftovers(active), make, drain=True)


class ActiveLeftovers(Collection[str]):
    """The active mode's ``leftovers()``, read at the first question about them: a mode
    that finds nothing of its own to remove never asks, and listing what the active mode
    just programmed is the dearest read of a switch's cleanup (it grows with the Services),
    paid on every start."""

    def __init__(self, active: Backend) -> None:
        self._active = active
        self._lines: frozenset[str] | None = None

    def _read(self) -> frozenset[str]:
        if self._lines is None:
            self._lines = frozenset(self._active.leftovers())
        return self._lines

    def __contains__(self, line: object) -> bool:
        return line in self._read()

    def __iter__(self) -> Iterator[str]:
        return iter(self._read())

    def __len__(self) -> int:
        return len(self._read())


#: Told what the switch did: the active mode's first sync and the others' cleanups.
SwitchReport = Callable[[SyncResult, float, Sequence[ModeCleanup]], None]


class SwitchCleanup:
    """A Proxier listener: after the active mode's first successful sync (the node has its
    rules), remove the other modes' leftovers. Logged per mode, never fatal: a failure
    leaves the other mode's rules, which the active mode's rules take precedence over only
    where the kernel says so, and the next start (or ``kubeplex cleanup``) tries again.

    What a mode leaves draining (established connections whose NAT it holds itself) is
    removed by later syncs, checked at most every ``recheck`` seconds, once it drained."""

    def __init__(
        self,
        backend: Backend,
        report: SwitchReport | None = None,
        make: MakeBackend = _load,
        recheck: float = DRAIN_RECHECK,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backend = backend
        self.report = report
        self.make = make
        self.recheck = recheck
        self.clock = clock
        self.done = False
        self.results: list[ModeCleanup] = []
        self._checked = 0.0

    @property
    def draining(self) -> list[str]:
        """Modes that left something draining at their last cleanup."""
        return [r.mode for r in self.results if r.draining]

    def __call__(self, state: ProxyState, result: SyncResult, elapsed: float) -> None:
        if self.done:
            modes = self.draining
            if modes and self.clock() - self._checked >= self.recheck:
                self._run(modes)
            return
        self.done = True
        self._run(None)
        if self.report is not None:
            self.report(result, elapsed, self.results)

    def _run(self, modes: list[str] | None) -> None:
        self._checked = self.clock()
        try:
            found = remove_other_modes(self.backend, self.make, modes)
        except Exception as err:  # reading the active mode's leftovers, the trust list...
            log.exception("removing the other modes' leftovers failed")
            found = [ModeCleanup("?", error=repr(err))]
        if modes is None:
            self.results = found
        else:
            by_mode = {r.mode: r for r in found}
            self.results = [by_mode.get(r.mode, r) for r in self.results]
        for done in found:
            if done.error:
                log.error("mode %s: removing its leftovers failed: %s", done.mode, done.error)
                continue
            if done.removed:
                log.info(
                    "mode %s: removed %d leftovers (active mode: %s)",
                    done.mode,
                    len(done.removed),
                    self.backend.mode,
                )
                for line in done.removed:
                    log.debug("mode %s: removed %s", done.mode, line)
            if done.draining:
                log.info(
                    "mode %s: %d objects left while their connections drain: %s",
                    done.mode,
                    len(done.draining),
                    "; ".join(done.draining),
                )
