"""Traffic-policy decisions shared by the dataplanes (reject, drop, which endpoint sets)."""

from __future__ import annotations

import pytest

from kubeplex.core.model.policy import traffic_plan
from kubeplex.core.model.topology import categorize_endpoints
from kubeplex.core.model.types import Endpoint, IPFamily, ServicePort, ServicePortName

SPN = ServicePortName(
    "ns",
    "svc",
    "p",
)
LOCAL = Endpoint("10.0.1.1", 80, is_local=True, node_name="me")
REMOTE = Endpoint("10.0.2.1", 80, node_name="other")


def svc(**kw: object) -> ServicePort:
    return ServicePort(SPN, IPFamily.IPv4, "10.96.0.1", 80, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("service", "endpoints", "expected"),
    [
        # (no_endpoints, drop_internal, drop_external, cluster set, local set, external chain)
        (svc(), [], (True, False, False, False, False, False)),
        (svc(), [REMOTE], (False, False, False, True, False, False)),
        (svc(node_port=30000), [REMOTE], (False, False, False, True, False, True)),
        (svc(internal_policy_local=True), [REMOTE], (False, True, False, False, False, False)),
        (
            svc(internal_policy_local=True),
            [LOCAL, REMOTE],
            (False, False, False, False, True, False),
        ),
        (
            svc(node_port=30000, external_policy_local=True),
            [REMOTE],
            (False, False, True, True, False, True),
        ),
        (
            svc(node_port=30000, external_policy_local=True),
            [LOCAL, REMOTE],
            (False, False, False, True, True, True),
        ),
    ],
)
def test_traffic_plan(
    service: ServicePort, endpoints: list[Endpoint], expected: tuple[bool, ...]
) -> None:
    plan = traffic_plan(service, categorize_endpoints(endpoints, service, "me", ""))
    got = (
        plan.no_endpoints,
        plan.drop_internal,
        plan.drop_external,
        plan.uses_cluster_endpoints,
        plan.uses_local_endpoints,
        plan.uses_external_chain,
    )
    assert got == expected
