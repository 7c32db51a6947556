"""The render suite: the render contract, and what the other hooks say of an applied state.

No root needed. Checks that need something applied program an in-memory fake of the mode's
kernel where ``kubeplex.testing.fakes`` has one; otherwise, as root, a private network
namespace the kit makes (never the host); a process without CAP_NET_ADMIN cannot change the
network, so it applies in place and skips those checks if that apply is refused.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from kubeplex.core.config.kubeproxy import KubeProxyConfiguration, with_overrides
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import (
    Backend,
    BackendContext,
    CleanupReport,
    Rendered,
)
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.errors import BackendError
from kubeplex.core.model.graph import ProxyState
from kubeplex.core.model.types import IPFamily, ServicePortName
from kubeplex.testing import fakes
from kubeplex.testing.conformance.common import Case, Skip, case, check, diff
from kubeplex.testing.conformance.seams import Recorder, seam_of, swapped
from kubeplex.testing.dataplane import endpoint, endpoint_slice, lab_config, node_object, service
from kubeplex.testing.netlab import reap_stale, unique_prefix

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
    check(not state.invalid, f"the kit's own objects were rejected: {state.invalid}")


def one_endpoint_more() -> dict[str, Any]:
    return endpoint_slice("svc-1", [*_endpoints(1), endpoint(NEW_ENDPOINT, OTHER_NODE)], port=8080)


def payload_lines(text: str) -> list[str]:
    """Lines that carry something: not blank, not a ``#`` comment."""
    return [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def has_net_admin() -> bool:
    """Can this process change the network (CAP_NET_ADMIN in effect)?"""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        status = ""
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) & (1 << 12))
    return os.geteuid() == 0


def fake_kernel(mode: str) -> object | None:
    """An in-memory kernel seam for ``mode`` from ``kubeplex.testing.fakes``, or None."""
    return fakes.for_mode(mode)


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


class Applied:
    """A backend with something to apply to (a fake kernel, a private namespace, in place)."""

    def __init__(self, backend: Backend, where: str, in_place: bool) -> None:
        self.backend = backend
        #: "fake kernel", "network namespace NAME" or "in place" (for messages).
        self.where = where
        self._in_place = in_place

    def render(self, state: ProxyState) -> Rendered:
        """Observe (may read the kernel), then render purely, as ``Backend.sync`` does."""
        observed = self._guard(lambda: self.backend.observe(state))
        with nothing_spawns():
            rendered = self.backend.render(state, observed)
            str(rendered)
        return rendered

    def apply(self, rendered: Rendered) -> None:
        self._guard(lambda: self.backend.apply(rendered))

    def _guard(self, step: Callable[[], Any]) -> Any:
        try:
            return step()
        except BackendError as err:
            if self._in_place:
                raise Skip(f"apply is refused without CAP_NET_ADMIN: {err}") from err
            raise


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

    def backend(self, netns: str | None = None, kernel: object | None = None) -> Backend:
        ctx = BackendContext(self.config, NODE, self.families, netns=netns, kernel=kernel)
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
    def applying(self) -> Iterator[Applied]:
        """A fresh backend that can apply: to the mode's fake kernel if the kit has one, else
        to the node's kernel inside a private network namespace (with CAP_NET_ADMIN), or in
        place without it. As root, even a fake-kernel backend gets the private namespace:
        a backend that bypasses its seam then writes there, not on the host."""
        fake = fake_kernel(self.mode)
        if fake is None:
            missing = plugins.missing_requirements(self.mode, trust=self.trust)
            if missing:
                raise Skip(f"needs an applied state; this node lacks: {'; '.join(missing)}")
        netns: str | None = None
        if has_net_admin():
            reap_stale()
            netns = f"{unique_prefix()}-render"
            made = subprocess.run(["ip", "netns", "add", netns], capture_output=True, text=True)
            if made.returncode != 0:
                raise Skip(f"cannot make a network namespace to apply in: {made.stderr.strip()}")
        try:
            backend = self.backend(netns, fake)
            if fake is None:
                missing = plugins.missing_requirements(self.mode, backend, self.trust)
                if missing:
                    raise Skip(f"needs an applied state; this node lacks: {'; '.join(missing)}")
            where = (
                "fake kernel"
                if fake is not None
                else f"network namespace {netns}"
                if netns
                else "in place"
            )
            applied = Applied(backend, where, in_place=fake is None and netns is None)
            applied._guard(backend.prepare)
            yield applied
            with contextlib.suppress(Exception):
                backend.cleanup()
        finally:
            if netns is not None:
                subprocess.run(["ip", "netns", "del", netns], capture_output=True, check=False)


def spn(name: str) -> ServicePortName:
    """The service port of the kit's one-port Service ``default/name``."""
    return ServicePortName("default", name)


# ------------------------------------------------------------------------------------ checks


def check_loads(s: RenderSubject) -> None:
    backend = s.backend()  # raises, saying why, if the trust list does not allow it
    check(isinstance(backend, Backend), f"{type(backend)!r} is not a kubeplex Backend")
    check(
        backend.mode == s.mode,
        f"{type(backend).__name__}.mode is {backend.mode!r}, the entry point is {s.mode!r}",
    )


def check_capabilities_declared(s: RenderSubject) -> None:
    assert s.entry is not None
    own = s.backend().capabilities
    check(
        own == s.entry.capabilities,
        f"the trust list declares {sorted(s.entry.capabilities)}, "
        f"the backend class says {sorted(own)}",
    )


def check_full_render(s: RenderSubject) -> None:
    rendered = s.render(s.backend(), s.state().checkout(full=True))
    text = str(rendered)
    check(rendered.full, "the render of a full change set says .full = False")
    check(isinstance(text, str) and payload_lines(text), "a full render with Services is empty")
    absent = [vip for vip in ALL_VIPS if vip not in text]
    check(not absent, f"ClusterIPs missing from the full render: {absent}")


def check_deterministic(s: RenderSubject) -> None:
    first = s.render(s.backend(), s.state().checkout(full=True))
    second = s.render(s.backend(), s.state().checkout(full=True))
    check(str(first) == str(first), "str() of one render changes from call to call")
    check(str(first) == str(second), diff("two renders of the same state differ", first, second))


def check_render_touches_nothing(s: RenderSubject) -> None:
    # Renders inside nothing_spawns() (every RenderSubject.render does); the output must not
    # depend on PATH, and a partial render must not spawn anything either.
    backend, state = s.backend(), s.state()
    blind = s.render(backend, state.checkout(full=True))
    seeing = s.backend().render(s.state().checkout(full=True))
    check(str(blind) == str(seeing), diff("a render depends on PATH", seeing, blind))
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
    check(GONE_VIP not in text, f"{GONE} ({GONE_VIP}) is still in the full render")
    left = [vip for vip in ALL_VIPS if vip != GONE_VIP and vip not in text]
    check(not left, f"other Services vanished with {GONE}: {left}")
    fresh = s.render(s.backend(), s.state(objects).checkout(full=True))
    check(str(fresh) == text, diff("it differs from a fresh backend's render", fresh, text))


def check_invalidate_makes_next_full(s: RenderSubject) -> None:
    backend, state = s.backend(), s.state()
    s.render(backend, state.checkout(full=True))
    state.set_endpoint_slice(one_endpoint_more())
    backend.invalidate()
    after = s.render(backend, state.checkout())
    check(after.full, "after invalidate() a partial change set rendered .full = False")
    fresh_state = s.state([*seed_objects(), one_endpoint_more()])
    fresh = s.render(s.backend(), fresh_state.checkout(full=True))
    check(str(after) == str(fresh), diff("it is not what a fresh backend renders", fresh, after))


def check_no_change_renders_nothing(s: RenderSubject) -> None:
    with s.applying() as a:
        state = s.state()
        a.apply(a.render(state.checkout(full=True)))
        quiet = a.render(state.checkout())
        check(not quiet.full, "a render without changes after an apply says .full = True")
        lines = payload_lines(str(quiet))
        check(not lines, f"a render without changes is not empty: {lines[:5]}")


def check_partial_is_smaller(s: RenderSubject) -> None:
    with s.applying() as a:
        state = s.state()
        full = a.render(state.checkout(full=True))
        a.apply(full)
        state.set_endpoint_slice(one_endpoint_more())
        partial = a.render(state.checkout())
        check(not partial.full, "a one-endpoint change after an apply rendered .full = True")
        check(
            len(str(partial)) < len(str(full)),
            f"the partial render ({len(str(partial))} chars) is not smaller than the full "
            f"one ({len(str(full))})",
        )
        check(NEW_ENDPOINT in str(partial), f"the new endpoint {NEW_ENDPOINT} is not rendered")
        a.apply(partial)


def check_apply_sends_kernel_inputs(s: RenderSubject) -> None:
    # The contract: kernel_inputs() is exactly what apply sends, in order; apply adds nothing.
    with s.applying() as a:
        recorder = Recorder(seam_of(a.backend))
        state = s.state()

        def one(step: str, ps: ProxyState) -> None:
            rendered = a.render(ps)
            recorder.sent.clear()
            a.apply(rendered)
            wanted = list(rendered.kernel_inputs())
            sent = recorder.sent
            check(
                len(sent) == len(wanted),
                f"the {step} apply sent {len(sent)} texts through the kernel seam, "
                f"kernel_inputs() has {len(wanted)}",
            )
            check(
                sent == wanted, diff(f"the {step} apply sent", "\n".join(wanted), "\n".join(sent))
            )

        with swapped(a.backend, recorder.seam):
            one("full", state.checkout(full=True))
            state.set_endpoint_slice(one_endpoint_more())
            one("partial", state.checkout())


def check_inspect_reads_back(s: RenderSubject) -> None:
    with s.applying() as a:
        a.apply(a.render(s.state().checkout(full=True)))
        views = a.backend.inspect(spn("svc-0"))
        if views is None:
            raise Skip("inspect() returns None: the backend cannot read its kernel back")
        check(views, "inspect() finds nothing of an applied Service (default/svc-0)")
        mine = [v for v in views if v.family is IPFamily.IPv4]
        check(len(mine) == 1, f"inspect() has {len(mine)} IPv4 entries for default/svc-0: {views}")
        v4 = mine[0]
        check(v4.service == "default/svc-0", f"inspect() names {v4.service!r}")
        targets = sorted(e.target for e in v4.endpoints)
        wanted = sorted(f"{ep['addresses'][0]}:8080" for ep in _endpoints(0))
        check(targets == wanted, f"inspect() endpoints are {targets}, not {wanted}")
        check(
            any(VIPS[0] in e for e in v4.entries),
            f"no entry of inspect() names the ClusterIP {VIPS[0]}: {v4.entries}",
        )
        shares = [e.share for e in v4.endpoints if e.share is not None]
        check(
            all(abs(x - 0.5) < 0.01 for x in shares),
            f"two endpoints, shares {shares} (1/2 each)",
        )
        sticky = a.backend.inspect(spn("sticky")) or []
        check(
            all(v.affinity_seconds == 10800 for v in sticky),
            f"ClientIP affinity with the default timeout reads back as "
            f"{[v.affinity_seconds for v in sticky]} (10800 s)",
        )
        nothing = a.backend.inspect(spn("no-such-service"))
        check(nothing == [], f"inspect() of a Service never applied says {nothing}")


def check_cleanup_report(s: RenderSubject) -> None:
    with s.applying() as a:
        a.apply(a.render(s.state().checkout(full=True)))
        before = a.backend.leftovers()
        check(before, f"leftovers() is empty after an apply ({a.where})")
        report = a.backend.cleanup()
        check(
            isinstance(report, CleanupReport),
            f"cleanup() returned {type(report).__name__}, not a CleanupReport",
        )
        check(report.mode == s.mode, f"the CleanupReport says mode {report.mode!r}")
        check(report.removed, "cleanup() after an apply says it removed nothing")
        after = a.backend.leftovers()
        check(after == [], f"leftovers() after cleanup(): {after[:5]}")
        again = a.backend.cleanup()
        check(not again.removed, f"a second cleanup() still removed {again.removed[:5]}")


RENDER_CASES: tuple[Case, ...] = (
    case("render", "loads", "loads through the trust list; .mode is its name", check_loads),
    case(
        "render",
        "capabilities-declared",
        "the trust list's capabilities are the class's",
        check_capabilities_declared,
    ),
    case("render", "full-render", "full, non-empty, names every ClusterIP", check_full_render),
    case("render", "deterministic", "same state, same text; str() stable", check_deterministic),
    case(
        "render",
        "touches-nothing",
        "no process, output independent of PATH",
        check_render_touches_nothing,
    ),
    case(
        "render",
        "removed-service-gone",
        "a deleted Service is gone from a full render",
        check_removed_service_gone,
    ),
    case(
        "render",
        "invalidate-full",
        "invalidate(): next render full, as a fresh backend's",
        check_invalidate_makes_next_full,
    ),
    case(
        "render",
        "no-change-empty",
        "after an apply, no change renders nothing",
        check_no_change_renders_nothing,
    ),
    case(
        "render",
        "partial-smaller",
        "one-endpoint change renders less than full",
        check_partial_is_smaller,
    ),
    case(
        "render",
        "apply-sends-inputs",
        "apply sends exactly kernel_inputs() through Backend.kernel",
        check_apply_sends_kernel_inputs,
    ),
    case(
        "render",
        "inspect-reads-back",
        "inspect() of an applied Service: its endpoints, ClusterIP, affinity",
        check_inspect_reads_back,
    ),
    case(
        "render",
        "cleanup-report",
        "cleanup() says what it removed; leftovers() empty after",
        check_cleanup_report,
    ),
)
