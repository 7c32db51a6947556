"""One Service whose iptables rules cannot be rendered costs only that Service (no root).

Any exception in one Service's fragment (not only a BackendError) leaves that Service out of
the plan with its last good rules, names it in ``SyncResult.failed``, and every other Service is
still rendered in the same sync.
"""

from __future__ import annotations

from typing import Any

import pytest
from kits.iptables_kit import Harness, all_lines
from kits.render_kit import NODE, endpoint_slice, ep, port, service

import kubeplex.backends.iptables.render as render_module


def objects(version: int) -> list[dict[str, Any]]:
    objs: list[dict[str, Any]] = []
    for i in range(1, 5):
        objs.append(service(f"ns{i}", "web", f"172.30.0.{i}", [port(80)]))
        objs.append(
            endpoint_slice(f"ns{i}", "web", [ep(f"10.180.{i}.{version}", NODE)], ports=[port(80)])
        )
    return objs


def break_ns3(monkeypatch: pytest.MonkeyPatch) -> None:
    real = render_module.service_rules

    def rules(svc: Any, *args: Any) -> Any:
        if svc.name.namespace == "ns3":
            raise ZeroDivisionError("a bug in one Service's rules")
        return real(svc, *args)

    monkeypatch.setattr(render_module, "service_rules", rules)


def test_a_service_whose_rules_raise_costs_only_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    h = Harness(objects(2))
    h.commit(h.render(full=True))
    break_ns3(monkeypatch)
    h.feed(objects(3))  # every Service's endpoint changes
    rendered = h.render()
    lines = "\n".join(all_lines(rendered))
    for i in (1, 2, 4):
        assert f"10.180.{i}.3" in lines
    assert "10.180.3.3" not in lines
    (plan,) = rendered.plans
    assert list(plan.errors) == ["ns3/web:p80"]
    assert "ZeroDivisionError" in next(iter(plan.errors.values()))
    # Its last good rules stay: a full render still has the old endpoint.
    h.commit(rendered)
    full = "\n".join(all_lines(h.render(full=True)))
    assert "10.180.3.2" in full and "10.180.1.3" in full
