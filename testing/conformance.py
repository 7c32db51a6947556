"""The conformance kit for dataplane backends: run it against any backend by its mode name.

Two suites, both loading the backend the way ``kubeplex run`` does (its entry point, allowed by
the trust list in effect; ``--plugins FILE`` or ``plugins_file=`` to use another list):

* **render** — the render contract, no root needed: a full render is full and names every
  Service; render is deterministic and does not touch the system (it runs with PATH emptied
  and process creation blocked); a Service that disappears is gone from a full render;
  ``invalidate()`` makes the next render full; and, once something was applied, a sync with
  no change renders nothing and a one-endpoint change renders less than the full render.
  Those last two need an applied state: as root the kit applies inside a private network
  namespace it makes (never on the host); a process without CAP_NET_ADMIN cannot change the
  network, so it applies in place, and skips the two checks if that apply is refused.
* **kernel** — the namespace behavioural suite (root, CAP_NET_ADMIN, network namespaces):
  traffic through ClusterIP, NodePort and hairpin, refusal without endpoints, and ClientIP
  affinity if the backend declares ``session-affinity``. Skipped for a backend that declares
  ``render-only``.

From a shell (prints a pass/fail table; exit 0 if nothing failed, 1 otherwise)::

    python -m kubeplex.testing.conformance MODE [--kernel] [--plugins FILE] [--only CHECK]

From pytest, in a backend package's tests::

    from kubeplex.testing.conformance import kernel_tests, render_contract_tests

    test_render_contract = render_contract_tests("recording", plugins_file="plugins.toml")
    TestKernel = kernel_tests("recording", plugins_file="plugins.toml")
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from kubeplex.core.config.kubeproxy import KubeProxyConfiguration, with_overrides
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import Backend, BackendContext, Rendered
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.errors import BackendError, KubeplexError
from kubeplex.core.model.graph import ProxyState
from kubeplex.core.model.types import IPFamily
from kubeplex.testing.dataplane import (
    DataplaneCluster,
    DataplaneUnavailable,
    cluster,
    endpoint,
    endpoint_slice,
    lab_config,
    node_object,
    service,
)
from kubeplex.testing.netlab import (
    CLIENT_POD,
    EXTERNAL,
    NODE1,
    WEB_A,
    WEB_B,
    WEB_C,
    LabError,
    reap_stale,
    tally,
    unique_prefix,
)

Outcome = Literal["pass", "fail", "skip"]

__all__ = [
    "KERNEL_CASES",
    "RENDER_CASES",
    "Case",
    "Result",
    "Skip",
    "kernel_tests",
    "main",
    "render_contract_tests",
    "run",
]


class Skip(Exception):
    """A check that cannot run here (says why); neither a pass nor a failure."""


@dataclass(frozen=True)
class Case:
    suite: str
    name: str
    doc: str
    func: Callable[[Any], None]


@dataclass(frozen=True)
class Result:
    suite: str
    name: str
    outcome: Outcome
    detail: str = ""
    seconds: float = 0.0


def _check(condition: object, message: str) -> None:
    if not condition:
        raise AssertionError(message)


# ------------------------------------------------------------------------------ render suite

NODE = "kind-worker"
OTHER_NODE = "kind-worker2"
NODE_IP = "172.18.0.2"
POD_CIDR = "10.244.1.0/24"
#: ClusterIPs of the plain services svc-0 .. svc-4.
VIPS = tuple(f"10.96.10.{10 + i}" for i in range(5))
NODEPORT_VIP = "10.96.10.30"
UDP_VIP = "10.96.10.53"
STICKY_VIP = "10.96.10.40"
ALL_VIPS = (*VIPS, NODEPORT_VIP, UDP_VIP, STICKY_VIP)
#: The endpoint a one-endpoint change adds to svc-1.
NEW_ENDPOINT = "10.244.2.99"
#: svc-3 is the one that disappears.
GONE = "svc-3"
GONE_VIP = VIPS[3]


def _endpoints(i: int) -> list[dict[str, Any]]:
    return [endpoint(f"10.244.1.{10 + i}", NODE), endpoint(f"10.244.2.{10 + i}", OTHER_NODE)]


def seed_objects() -> list[dict[str, Any]]:
    """The render suite's cluster: a node, five ClusterIP Services, a NodePort, a UDP
    Service and a ClientIP-affinity Service, each with two endpoints (one on this node)."""
    objs = [node_object(NODE, NODE_IP, POD_CIDR, zone="zone-a")]
    for i, vip in enumerate(VIPS):
        objs += [
            service(f"svc-{i}", vip, 80, target_port=8080),
            endpoint_slice(f"svc-{i}", _endpoints(i), port=8080),
        ]
    objs += [
        service("np", NODEPORT_VIP, 80, target_port=8080, type="NodePort", node_port=30090),
        endpoint_slice("np", _endpoints(20), port=8080),
        service("dns", UDP_VIP, 53, target_port=5353, protocol="UDP"),
        endpoint_slice("dns", _endpoints(53), port=5353, protocol="UDP"),
        service("sticky", STICKY_VIP, 80, target_port=8080, session_affinity="ClientIP"),
        endpoint_slice("sticky", _endpoints(40), port=8080),
    ]
    return objs


def feed(state: ClusterState, objects: Sequence[Mapping[str, Any]]) -> None:
    for obj in objects:
        kind = obj["kind"]
        if kind == "Node":
            state.set_node(obj)
        elif kind == "Service":
            state.set_service(obj)
        else:
            state.set_endpoint_slice(obj)
    _check(not state.invalid, f"the kit's own objects were rejected: {state.invalid}")


def one_endpoint_more() -> dict[str, Any]:
    return endpoint_slice("svc-1", [*_endpoints(1), endpoint(NEW_ENDPOINT, OTHER_NODE)], port=8080)


def payload_lines(text: str) -> list[str]:
    """Lines that carry something: not blank, not a ``#`` comment."""
    return [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def _has_net_admin() -> bool:
    """Can this process change the network (CAP_NET_ADMIN in effect)?"""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        status = ""
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) & (1 << 12))
    return os.geteuid() == 0


@contextlib.contextmanager
def nothing_spawns() -> Iterator[None]:
    """PATH emptied, and creating a process raises: what a pure render never notices."""

    def refuse(*args: object, **kwargs: object) -> Any:
        raise AssertionError(f"render started a process: {args[:1]!r}")

    saved_path = os.environ.get("PATH")
    targets: list[tuple[Any, str]] = [
        (subprocess, "Popen"),
        (os, "system"),
        (os, "posix_spawn"),
        (os, "posix_spawnp"),
        (os, "fork"),
    ]
    saved = [(obj, name, getattr(obj, name)) for obj, name in targets if hasattr(obj, name)]
    os.environ["PATH"] = ""
    for obj, name, _ in saved:
        setattr(obj, name, refuse)
    try:
        yield
    finally:
        for obj, name, original in saved:
            setattr(obj, name, original)
        if saved_path is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = saved_path


class RenderSubject:
    """A backend of ``mode`` (loaded as ``kubeplex run`` loads it) and the kit's cluster."""

    families = (IPFamily.IPv4,)

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.trust = plugins.load_trust_list()
        self.entry = self.trust.entry(mode)
        base = lab_config(mode)
        self.config: KubeProxyConfiguration = with_overrides(
            base, mode=mode, hostname_override=NODE, known_modes=plugins.known_modes()
        )

    def backend(self, netns: str | None = None) -> Backend:
        ctx = BackendContext(self.config, NODE, self.families, netns=netns)
        return plugins.load_backend(self.mode, ctx, self.trust)

    def state(self, objects: Sequence[Mapping[str, Any]] | None = None) -> ClusterState:
        state = ClusterState(NODE, self.families)
        feed(state, seed_objects() if objects is None else objects)
        return state

    def render(self, backend: Backend, state: ProxyState) -> Rendered:
        with nothing_spawns():
            rendered = backend.render(state)
            str(rendered)  # printing is part of rendering: pure as well
        return rendered

    @contextlib.contextmanager
    def applying(self) -> Iterator[tuple[Backend, Callable[[Rendered], None]]]:
        """A fresh backend and a function that applies a render of it, where that is safe:
        in a private network namespace (with CAP_NET_ADMIN), or in place without it."""
        missing = plugins.missing_requirements(self.mode, trust=self.trust)
        if missing:
            raise Skip(f"needs an applied state; this node lacks: {'; '.join(missing)}")
        netns: str | None = None
        if _has_net_admin():
            reap_stale()
            netns = f"{unique_prefix()}-render"
            made = subprocess.run(["ip", "netns", "add", netns], capture_output=True, text=True)
            if made.returncode != 0:
                raise Skip(f"cannot make a network namespace to apply in: {made.stderr.strip()}")
        try:
            backend = self.backend(netns)
            missing = plugins.missing_requirements(self.mode, backend, self.trust)
            if missing:
                raise Skip(f"needs an applied state; this node lacks: {'; '.join(missing)}")

            def unprivileged(step: Callable[[], object]) -> None:
                try:
                    step()
                except BackendError as err:
                    if netns is None:
                        raise Skip(f"apply is refused without CAP_NET_ADMIN: {err}") from err
                    raise

            def apply(rendered: Rendered) -> None:
                unprivileged(lambda: backend.apply(rendered))

            unprivileged(backend.prepare)

            yield backend, apply
            with contextlib.suppress(Exception):
                backend.cleanup()
        finally:
            if netns is not None:
                subprocess.run(["ip", "netns", "del", netns], capture_output=True, check=False)


def check_loads(s: RenderSubject) -> None:
    backend = s.backend()  # raises, saying why, if the trust list does not allow it
    _check(isinstance(backend, Backend), f"{type(backend)!r} is not a kubeplex Backend")
    _check(
        backend.mode == s.mode,
        f"{type(backend).__name__}.mode is {backend.mode!r}, the entry point is {s.mode!r}",
    )


def check_capabilities_declared(s: RenderSubject) -> None:
    assert s.entry is not None
    own = s.backend().capabilities
    _check(
        own == s.entry.capabilities,
        f"the trust list declares {sorted(s.entry.capabilities)}, "
        f"the backend class says {sorted(own)}",
    )


def check_full_render(s: RenderSubject) -> None:
    rendered = s.render(s.backend(), s.state().checkout(full=True))
    text = str(rendered)
    _check(rendered.full, "the render of a full change set says .full = False")
    _check(isinstance(text, str) and payload_lines(text), "a full render with Services is empty")
    absent = [vip for vip in ALL_VIPS if vip not in text]
    _check(not absent, f"ClusterIPs missing from the full render: {absent}")


def check_deterministic(s: RenderSubject) -> None:
    first = s.render(s.backend(), s.state().checkout(full=True))
    second = s.render(s.backend(), s.state().checkout(full=True))
    _check(str(first) == str(first), "str() of one render changes from call to call")
    _check(str(first) == str(second), _diff("two renders of the same state differ", first, second))


def check_render_touches_nothing(s: RenderSubject) -> None:
    # Renders inside nothing_spawns() (every RenderSubject.render does); the output must not
    # depend on PATH, and a partial render must not spawn anything either.
    backend, state = s.backend(), s.state()
    blind = s.render(backend, state.checkout(full=True))
    seeing = s.backend().render(s.state().checkout(full=True))
    _check(str(blind) == str(seeing), _diff("a render depends on PATH", seeing, blind))
    state.set_endpoint_slice(one_endpoint_more())
    s.render(backend, state.checkout())


def check_removed_service_gone(s: RenderSubject) -> None:
    objects = [
        o
        for o in seed_objects()
        if not (o["metadata"]["name"] in (GONE, f"{GONE}-slice") and o["kind"] != "Node")
    ]
    backend, state = s.backend(), s.state()
    s.render(backend, state.checkout(full=True))
    state.delete_service("default", GONE)
    state.delete_endpoint_slice("default", f"{GONE}-slice")
    text = str(s.render(backend, state.checkout(full=True)))
    _check(GONE_VIP not in text, f"{GONE} ({GONE_VIP}) is still in the full render")
    left = [vip for vip in ALL_VIPS if vip != GONE_VIP and vip not in text]
    _check(not left, f"other Services vanished with {GONE}: {left}")
    fresh = s.render(s.backend(), s.state(objects).checkout(full=True))
    _check(str(fresh) == text, _diff("it differs from a fresh backend's render", fresh, text))


def check_invalidate_makes_next_full(s: RenderSubject) -> None:
    backend, state = s.backend(), s.state()
    s.render(backend, state.checkout(full=True))
    state.set_endpoint_slice(one_endpoint_more())
    backend.invalidate()
    after = s.render(backend, state.checkout())
    _check(after.full, "after invalidate() a partial change set rendered .full = False")
    fresh_state = s.state([*seed_objects(), one_endpoint_more()])
    fresh = s.render(s.backend(), fresh_state.checkout(full=True))
    _check(str(after) == str(fresh), _diff("it is not what a fresh backend renders", fresh, after))


def check_no_change_renders_nothing(s: RenderSubject) -> None:
    with s.applying() as (backend, apply):
        state = s.state()
        apply(s.render(backend, state.checkout(full=True)))
        quiet = s.render(backend, state.checkout())
        _check(not quiet.full, "a render without changes after an apply says .full = True")
        lines = payload_lines(str(quiet))
        _check(not lines, f"a render without changes is not empty: {lines[:5]}")


def check_partial_is_smaller(s: RenderSubject) -> None:
    with s.applying() as (backend, apply):
        state = s.state()
        full = s.render(backend, state.checkout(full=True))
        apply(full)
        state.set_endpoint_slice(one_endpoint_more())
        partial = s.render(backend, state.checkout())
        _check(not partial.full, "a one-endpoint change after an apply rendered .full = True")
        _check(
            len(str(partial)) < len(str(full)),
            f"the partial render ({len(str(partial))} chars) is not smaller than the full "
            f"one ({len(str(full))})",
        )
        _check(NEW_ENDPOINT in str(partial), f"the new endpoint {NEW_ENDPOINT} is not rendered")
        apply(partial)


def _diff(message: str, a: object, b: object) -> str:
    la, lb = str(a).splitlines(), str(b).splitlines()
    for i, (x, y) in enumerate(zip(la, lb, strict=False)):
        if x != y:
            return f"{message}: line {i + 1}: {x!r} != {y!r}"
    return f"{message}: {len(la)} lines vs {len(lb)}"


RENDER_CASES: tuple[Case, ...] = (
    Case("render", "loads", "loads through the trust list; .mode is its name", check_loads),
    Case(
        "render",
        "capabilities-declared",
        "the trust list's capabilities are the class's",
        check_capabilities_declared,
    ),
    Case("render", "full-render", "full, non-empty, names every ClusterIP", check_full_render),
    Case("render", "deterministic", "same state, same text; str() stable", check_deterministic),
    Case(
        "render",
        "touches-nothing",
        "no process, output independent of PATH",
        check_render_touches_nothing,
    ),
    Case(
        "render",
        "removed-service-gone",
        "a deleted Service is gone from a full render",
        check_removed_service_gone,
    ),
    Case(
        "render",
        "invalidate-full",
        "invalidate(): next render full, as a fresh backend's",
        check_invalidate_makes_next_full,
    ),
    Case(
        "render",
        "no-change-empty",
        "after an apply, no change renders nothing",
        check_no_change_renders_nothing,
    ),
    Case(
        "render",
        "partial-smaller",
        "one-endpoint change renders less than full",
        check_partial_is_smaller,
    ),
)


# ------------------------------------------------------------------------------ kernel suite

WEB_VIP = "10.96.88.59"
NODEPORT = 30080
WEBS = (WEB_A, WEB_B, WEB_C)


def _web(dc: DataplaneCluster, pods: Sequence[str] = WEBS, **svc: Any) -> None:
    name = svc.pop("name", "web")
    vip = svc.pop("vip", WEB_VIP)
    dc.set(
        service(name, vip, 80, target_port=8080, **svc),
        endpoint_slice(name, dc.endpoints(*pods), port=8080),
    )
    dc.sync_or_raise()


def _capabilities(dc: DataplaneCluster) -> frozenset[str]:
    return next(iter(dc.agents.values())).backend.capabilities


def case_clusterip_spread(dc: DataplaneCluster) -> None:
    _web(dc)
    counts = tally(dc.lab.http(CLIENT_POD, WEB_VIP, 80, count=90))
    _check(sum(counts[w] for w in WEBS) == 90, f"not every request answered: {dict(counts)}")
    _check(all(counts[w] >= 10 for w in WEBS), f"not spread over the endpoints: {dict(counts)}")


def case_no_endpoints_refused(dc: DataplaneCluster) -> None:
    dc.set(service("empty", "10.96.0.30", 80, target_port=8080))
    dc.sync_or_raise()
    [r] = dc.lab.http(CLIENT_POD, "10.96.0.30", 80, timeout=3.0)
    _check(r.outcome == "refused" and r.ms < 500, f"expected an immediate refusal, got {r}")


def case_nodeport(dc: DataplaneCluster) -> None:
    _web(dc, type="NodePort", node_port=NODEPORT)
    node_ip = str(dc.lab.spec.node(NODE1).host_ip)
    results = dc.lab.http(EXTERNAL, node_ip, NODEPORT, count=12)
    _check(all(r.ok for r in results), f"NodePort from the external host: {tally(results)}")
    _check(set(tally(results)) <= set(WEBS), f"answered by non-endpoints: {tally(results)}")


def case_session_affinity(dc: DataplaneCluster) -> None:
    if "session-affinity" not in _capabilities(dc):
        raise Skip("the backend does not declare session-affinity")
    _web(dc, session_affinity="ClientIP", affinity_timeout=60)
    counts = tally(dc.lab.http(CLIENT_POD, WEB_VIP, 80, count=20))
    _check(len(counts) == 1 and next(iter(counts)) in WEBS, f"not sticky: {dict(counts)}")


def case_hairpin(dc: DataplaneCluster) -> None:
    _web(dc, (WEB_A,), name="self", vip="10.96.0.20")
    counts = tally(dc.lab.http(WEB_A, "10.96.0.20", 80, count=3))
    _check(counts == {WEB_A: 3}, f"a pod through its own Service: {dict(counts)}")
    seen = dc.lab.http(WEB_A, "10.96.0.20", 80, "/clientip", count=3)
    own = str(dc.lab.spec.pod(WEB_A).ip)
    _check(all(r.ok for r in seen), f"hairpin /clientip failed: {seen}")
    _check(
        all((r.body or "").rsplit(":", 1)[0] != own for r in seen),
        "hairpin traffic was not masqueraded (the pod saw its own address)",
    )


KERNEL_CASES: tuple[Case, ...] = (
    Case("kernel", "clusterip-spread", "ClusterIP reaches every endpoint", case_clusterip_spread),
    Case("kernel", "no-endpoints-refused", "no endpoints: refused", case_no_endpoints_refused),
    Case("kernel", "nodeport", "NodePort from an external host", case_nodeport),
    Case("kernel", "session-affinity", "ClientIP affinity (if declared)", case_session_affinity),
    Case("kernel", "hairpin", "a pod reaches itself, masqueraded", case_hairpin),
)


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


@contextlib.contextmanager
def kernel_cluster(mode: str) -> Iterator[DataplaneCluster]:
    """The conformance lab with an agent per node in ``mode``; raises Skip if impossible."""
    why = kernel_unavailable(mode)
    if why:
        raise Skip(why)
    reap_stale()
    with contextlib.ExitStack() as stack:
        try:
            dc = stack.enter_context(cluster(mode))
        except (DataplaneUnavailable, LabError) as err:
            raise Skip(str(err)) from err
        yield dc


# ------------------------------------------------------------------------------------ running


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
    results: list[Result] = []

    def record(case: Case, func: Callable[[], None]) -> Result:
        started = time.monotonic()
        outcome, detail = _outcome(func)
        result = Result(case.suite, case.name, outcome, detail, time.monotonic() - started)
        results.append(result)
        return result

    with plugins.trusting(plugins_file):
        wanted = [c for c in RENDER_CASES if not only or c.name in only]
        subject: RenderSubject | None = None
        setup_error = ""
        try:
            subject = RenderSubject(mode)
        except KubeplexError as err:
            setup_error = f"{type(err).__name__}: {err}"
        for case in wanted:
            if subject is None:
                results.append(Result(case.suite, case.name, "fail", setup_error))
                continue
            first = record(case, functools.partial(case.func, subject))
            if case.name == "loads" and first.outcome == "fail":
                subject = None
                setup_error = "not run: the backend does not load (see render/loads)"
        kernel_wanted = [c for c in KERNEL_CASES if kernel and (not only or c.name in only)]
        if kernel_wanted:
            try:
                with kernel_cluster(mode) as dc:
                    for case in kernel_wanted:

                        def one(c: Case = case) -> None:
                            dc.reset()
                            c.func(dc)

                        record(case, one)
            except Skip as err:
                done = {r.name for r in results}
                results += [
                    Result(c.suite, c.name, "skip", str(err))
                    for c in kernel_wanted
                    if c.name not in done
                ]
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
    names = [c.name for c in (*RENDER_CASES, *KERNEL_CASES)]
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


# ------------------------------------------------------------------------------------ pytest


def _pytest_outcome(pytest_mod: Any, func: Callable[[], None]) -> None:
    try:
        func()
    except Skip as err:
        pytest_mod.skip(str(err))


def render_contract_tests(
    mode: str, *, plugins_file: str | os.PathLike[str] | None = None
) -> Callable[..., None]:
    """A pytest test function, one test per render check: ``test_x = render_contract_tests(m)``."""
    import pytest

    @pytest.mark.parametrize("case", RENDER_CASES, ids=[c.name for c in RENDER_CASES])
    def test_render_contract(case: Case) -> None:
        with plugins.trusting(plugins_file):
            subject = RenderSubject(mode)
            _pytest_outcome(pytest, lambda: case.func(subject))

    return test_render_contract


def kernel_tests(mode: str, *, plugins_file: str | os.PathLike[str] | None = None) -> type:
    """A pytest test class (one lab for all its tests), marked ``kernel``:
    ``TestKernel = kernel_tests(mode)``."""
    import pytest

    @pytest.mark.kernel
    class KernelConformance:
        stack: contextlib.ExitStack
        dc: DataplaneCluster

        @classmethod
        def setup_class(cls) -> None:
            cls.stack = contextlib.ExitStack()
            try:
                with plugins.trusting(plugins_file):
                    cls.dc = cls.stack.enter_context(kernel_cluster(mode))
            except Skip as err:
                cls.stack.close()
                pytest.skip(str(err))

        @classmethod
        def teardown_class(cls) -> None:
            cls.stack.close()

        @pytest.mark.parametrize("case", KERNEL_CASES, ids=[c.name for c in KERNEL_CASES])
        def test_kernel(self, case: Case) -> None:
            with plugins.trusting(plugins_file):
                self.dc.reset()
                _pytest_outcome(pytest, lambda: case.func(self.dc))

    return KernelConformance


if __name__ == "__main__":
    sys.exit(main())
