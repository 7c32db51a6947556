"""Running the kit: one mode's cases (``ModeKit``, one lab for all its kernel cases), the
pass/fail table, and the command line."""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
import time
from collections.abc import Callable, Sequence
from types import TracebackType

from kubeplex.core.dataplane import plugins
from kubeplex.core.model.errors import KubeplexError
from kubeplex.testing.conformance.common import Case, Outcome, Result, Skip
from kubeplex.testing.conformance.dualstack import DUAL_STACK_CASES
from kubeplex.testing.conformance.kernel import IPV4_CASES
from kubeplex.testing.conformance.render import RENDER_CASES, RenderSubject
from kubeplex.testing.dataplane import DataplaneCluster, DataplaneUnavailable, cluster
from kubeplex.testing.netlab import LabError, reap_stale

KERNEL_CASES: tuple[Case, ...] = (*IPV4_CASES, *DUAL_STACK_CASES)
ALL_CASES: tuple[Case, ...] = (*RENDER_CASES, *KERNEL_CASES)
assert len({c.name for c in ALL_CASES}) == len(ALL_CASES), "case names must be unique"


def linux_modes(plugins_file: str | os.PathLike[str] | None = None) -> list[str]:
    """The modes of the trust list in effect that run on Linux, in its order."""
    with plugins.trusting(plugins_file):
        trust = plugins.load_trust_list()
    return [m for m, e in trust.backends.items() if "linux" in e.platforms]


def kernel_unavailable(mode: str) -> str | None:
    """Why the kernel suite cannot run for ``mode`` here, or None."""
    trust = plugins.load_trust_list()
    entry = trust.entry(mode)
    if entry is not None and "render-only" in entry.capabilities:
        return f"mode {mode} declares render-only: it programs no packet path"
    if os.geteuid() != 0:
        return "the kernel suite needs root (CAP_NET_ADMIN and network namespaces)"
    missing = plugins.missing_requirements(mode, trust=trust)
    if missing:
        return f"this node lacks: {'; '.join(missing)}"
    return None


class ModeKit:
    """The kit for one mode: runs any case; the kernel cases share one lab (dual-stack if
    the backend declares ``ipv6``), made at the first of them and removed by ``close``."""

    def __init__(self, mode: str, plugins_file: str | os.PathLike[str] | None = None) -> None:
        self.mode = mode
        self.plugins_file = plugins_file
        self._stack = contextlib.ExitStack()
        self._dc: DataplaneCluster | None = None
        self._unavailable: str | None = None
        self._fresh = False

    def __enter__(self) -> ModeKit:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._dc = None
        self._stack.close()

    def capabilities(self) -> frozenset[str]:
        """What the backend class declares (loaded through the trust list in effect)."""
        return plugins.load_backend_class(self.mode, plugins.load_trust_list()).capabilities

    def run_case(self, case: Case) -> None:
        """Run one case; raises Skip (with the reason) or AssertionError."""
        with plugins.trusting(self.plugins_file):
            if case.suite == "render":
                case.func(RenderSubject(self.mode))
                return
            why = case.skip_reason(self.capabilities())
            if why:
                raise Skip(why)
            dc = self._cluster()
            if not self._fresh:
                dc.reset()
            self._fresh = False
            case.func(dc)

    def _cluster(self) -> DataplaneCluster:
        if self._dc is not None:
            return self._dc
        if self._unavailable is None:
            self._unavailable = kernel_unavailable(self.mode)
        if self._unavailable is None:
            reap_stale()
            try:
                self._dc = self._stack.enter_context(
                    cluster(self.mode, ipv6="ipv6" in self.capabilities())
                )
            except (DataplaneUnavailable, LabError) as err:
                self._unavailable = str(err)
        if self._dc is None:
            raise Skip(self._unavailable or "no lab")
        self._fresh = True
        return self._dc


def _outcome(func: Callable[[], None]) -> tuple[Outcome, str]:
    try:
        func()
    except Skip as err:
        return "skip", str(err)
    except AssertionError as err:
        return "fail", str(err) or "assertion failed"
    except KubeplexError as err:
        return "fail", f"{type(err).__name__}: {err}"
    except Exception as err:
        return "fail", f"crashed: {err!r}"
    return "pass", ""


def run(
    mode: str,
    *,
    kernel: bool = False,
    only: Sequence[str] = (),
    plugins_file: str | os.PathLike[str] | None = None,
) -> list[Result]:
    """Run the render suite (and, with ``kernel``, the kernel suite) against ``mode``."""
    suites = (*RENDER_CASES, *(KERNEL_CASES if kernel else ()))
    cases = [c for c in suites if not only or c.name in only]
    results: list[Result] = []
    not_loading = ""
    with ModeKit(mode, plugins_file) as kit:
        for case in cases:
            if not_loading:
                results.append(Result(case.suite, case.name, "fail", not_loading))
                continue
            started = time.monotonic()
            outcome, detail = _outcome(functools.partial(kit.run_case, case))
            results.append(
                Result(case.suite, case.name, outcome, detail, time.monotonic() - started)
            )
            if case.name == "loads" and outcome == "fail":
                not_loading = "not run: the backend does not load (see render/loads)"
    return results


def table(mode: str, results: Sequence[Result]) -> str:
    rows = [("SUITE", "CHECK", "RESULT", "TIME")]
    rows += [(r.suite, r.name, r.outcome.upper(), f"{r.seconds * 1000:.0f} ms") for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [f"conformance of mode {mode}"]
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    details = [r for r in results if r.detail and r.outcome != "pass"]
    if details:
        lines.append("")
    lines += [f"{r.suite}/{r.name}: {r.outcome}: {r.detail}" for r in details]
    counts = {o: sum(r.outcome == o for r in results) for o in ("pass", "fail", "skip")}
    lines += ["", f"{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped"]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m kubeplex.testing.conformance",
        description="Run the kubeplex conformance kit against a backend, by its mode name.",
    )
    p.add_argument("mode", help="the backend's mode (its entry point name)")
    p.add_argument(
        "--kernel", action="store_true", help="also run the namespace behavioural suite (root)"
    )
    p.add_argument("--plugins", metavar="FILE", help="trust list to load the backend with")
    names = [c.name for c in ALL_CASES]
    p.add_argument("--only", action="append", default=[], choices=names, metavar="CHECK")
    args = p.parse_args(argv)
    try:
        with plugins.trusting(args.plugins):
            plugins.load_trust_list()
    except KubeplexError as err:
        print(f"conformance: {err}", file=sys.stderr)
        return 2
    results = run(args.mode, kernel=args.kernel, only=args.only, plugins_file=args.plugins)
    sys.stdout.write(table(args.mode, results))
    return 1 if any(r.outcome == "fail" for r in results) else 0
