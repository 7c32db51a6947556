"""One Service the backend cannot program costs only that Service (nftables mode, no root).

A Service whose rules cannot be rendered (an exception in its own fragment) or whose
commands the kernel refuses is left out of the sync: every other Service is programmed in the
same sync, the failing one is named (with the reason) in ``SyncResult.failed`` and in the
Proxier's log and status, its previous rules stay in the table, and the next sync retries it,
without a change to it and without turning every later sync into a failing full one.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest
from kits.nftables_kit import NODE, FaultyNftables, Harness, many_services
from kits.render_kit import endpoint_slice, ep

import kubeplex.backends.nftables.render as render_module
from kubeplex.core.config.kubeproxy import default_config
from kubeplex.core.daemon.operations import start_operations
from kubeplex.core.daemon.proxier import Proxier
from kubeplex.core.model.errors import BackendError

BROKEN = "-ns3/web/"


class RefusingKernel(FaultyNftables):
    """Refuses every transaction with a command naming ``refused`` (as nft names the line)."""

    def __init__(self, refused: str | None) -> None:
        super().__init__()
        self.refused = refused
        self.refusals = 0

    def run(self, text: str) -> None:
        if self.refused is not None:
            for line in text.splitlines():
                if self.refused in line:
                    self.refusals += 1
                    raise BackendError(f"nft -f failed: Error: Invalid argument\n{line}\n^^^")
        super().run(text)


def harness(refused: str | None = None) -> tuple[Harness, RefusingKernel, Proxier]:
    h = Harness(many_services(6, 2))
    kernel = RefusingKernel(refused)
    h.use(kernel)
    return h, kernel, Proxier(h.cluster, h.backend)


def new_endpoints(i: int, last: int) -> dict[str, Any]:
    return endpoint_slice(f"ns{i}", "web", [ep(f"10.0.{i}.1", NODE), ep(f"10.0.{i}.{last}", "n2")])


@pytest.fixture
def broken_render(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """service_objects raises for ns3/web (a bug in one Service's fragment)."""
    real = render_module.service_objects

    def objects(svc: Any, cat: Any, settings: Any) -> Any:
        if svc.name.namespace == "ns3":
            raise ZeroDivisionError("bug in one fragment")
        return real(svc, cat, settings)

    monkeypatch.setattr(render_module, "service_objects", objects)
    yield


def test_a_service_the_kernel_refuses_in_a_partial_sync_costs_only_itself() -> None:
    h, kernel, proxier = harness()
    assert proxier.sync()
    before = h.dump()
    h.feed([new_endpoints(1, 7), new_endpoints(3, 7), new_endpoints(5, 7)])
    kernel.refused = BROKEN
    assert proxier.sync()
    assert not proxier.next_sync_full
    assert list(proxier.status.failed_services) == ["ns3/web:p80"]
    assert "Invalid argument" in proxier.status.failed_services["ns3/web:p80"]
    dump = h.dump()
    assert "10.0.1.7" in dump and "10.0.5.7" in dump  # the others: programmed
    assert "10.0.3.7" not in dump  # the refused change: not in the table ...
    ns3 = [ln for ln in before.splitlines() if BROKEN in ln]
    assert ns3 and all(ln in dump for ln in ns3)  # ... and its old rules: kept
    # The next sync retries it (no change to it since) and programs it.
    kernel.refused = None
    assert proxier.sync()
    assert proxier.status.failed_services == {}
    assert "10.0.3.7" in h.dump()


def test_a_refused_service_does_not_make_full_syncs_fail_forever() -> None:
    h, _kernel, proxier = harness(BROKEN)
    for _ in range(3):
        assert proxier.sync(full=True)
        assert not proxier.next_sync_full
        assert list(proxier.status.failed_services) == ["ns3/web:p80"]
    dump = h.dump()
    assert "-ns2/web/" in dump and "-ns4/web/" in dump and BROKEN not in dump
    assert proxier.status.service_failures == 3 and proxier.status.failures == 0


def test_a_refusal_naming_no_service_still_fails_the_sync() -> None:
    h, kernel, proxier = harness()
    assert proxier.sync()
    before = h.dump()
    h.feed([new_endpoints(1, 7)])
    kernel.refused = "mark-for-masquerade mark set"  # a fixed rule: nobody's own
    assert not proxier.sync(full=True)
    assert proxier.next_sync_full and h.dump() == before


def test_a_service_whose_rules_cannot_be_rendered_costs_only_itself(broken_render: None) -> None:
    h, _kernel, proxier = harness()
    assert proxier.sync()  # a first (full) sync: everything but ns3/web
    assert list(proxier.status.failed_services) == ["ns3/web:p80"]
    assert "ZeroDivisionError" in proxier.status.failed_services["ns3/web:p80"]
    dump = h.dump()
    assert BROKEN not in dump and "-ns2/web/" in dump and "-ns4/web/" in dump
    h.feed([new_endpoints(2, 7)])
    assert proxier.sync() and "10.0.2.7" in h.dump()
    assert list(proxier.status.failed_services) == ["ns3/web:p80"]  # retried, still failing


def test_a_failing_render_keeps_the_services_last_good_rules(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h, _kernel, proxier = harness()
    assert proxier.sync()
    before = [ln for ln in h.dump().splitlines() if BROKEN in ln]
    real = render_module.service_objects

    def objects(svc: Any, cat: Any, settings: Any) -> Any:
        if svc.name.namespace == "ns3":
            raise RuntimeError("broken")
        return real(svc, cat, settings)

    monkeypatch.setattr(render_module, "service_objects", objects)
    h.feed([new_endpoints(3, 7), new_endpoints(4, 7)])
    assert proxier.sync(full=True)
    dump = h.dump()
    assert "10.0.4.7" in dump and "10.0.3.7" not in dump
    assert before and all(ln in dump for ln in before)


def test_a_service_left_out_is_counted_and_listed_in_healthz() -> None:
    """The log alone alerts no one: a metric counts it (by Service) and /healthz names it."""
    h, kernel, proxier = harness(BROKEN)
    ops = start_operations(
        default_config(),
        proxier,
        h.cluster,
        sysctls=False,
        healthz_address="127.0.0.1:0",
        metrics_address="127.0.0.1:0",
        poll_interval=3600,
    )
    ops.conntrack.enabled = False  # no conntrack table in a unit test
    assert ops.healthz_address is not None and ops.metrics_address is not None
    total = "kubeplex_sync_proxy_rules_service_failures_total"
    try:
        for _ in range(2):  # a full sync, then a partial one that retries it
            assert ops.sync()
        assert ops.metrics.value(total, {"namespace": "ns3", "name": "web"}) == 2
        assert ops.metrics.value("kubeplex_sync_proxy_rules_services_not_programmed") == 1
        status, body = fetch(ops.healthz_address, "/healthz")
        assert status == 200  # every other Service is programmed: the node still serves
        assert json.loads(body)["servicesNotProgrammed"] == ["ns3/web:p80"]
        text = fetch(ops.metrics_address, "/metrics")[1]
        assert f'{total}{{name="web",namespace="ns3"}} 2.0' in text

        kernel.refused = None  # fixed: the next sync programs it
        assert ops.sync()
        assert ops.metrics.value("kubeplex_sync_proxy_rules_services_not_programmed") == 0
        assert ops.metrics.value(total, {"namespace": "ns3", "name": "web"}) == 2
        doc = json.loads(fetch(ops.healthz_address, "/healthz")[1])
        assert "servicesNotProgrammed" not in doc and doc["healthy"] is True
    finally:
        ops.stop()


def fetch(address: tuple[str, int], path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection(*address, timeout=5)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()
