"""A protocol-faithful fake Kubernetes API server for tests (see README.md)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .server import (
    DEFAULT_RESOURCES,
    ENDPOINTSLICES,
    EVENTS,
    EVENTS_V1,
    NODES,
    SERVICECIDRS,
    SERVICES,
    TLS_CERT,
    TLS_KEY,
    ApiError,
    FakeApiServer,
    RequestAttributes,
    RequestRecord,
    ResourceType,
    parse_field_selector,
    parse_label_selector,
)

# The RBAC a kube-proxy needs (system:node-proxier + event recording), as authorizer pairs;
# list/watch servicecidrs as upstream grants them with MultiCIDRServiceAllocator (GA in 1.33).
KUBE_PROXY_PERMISSIONS: frozenset[tuple[str, str]] = frozenset(
    {
        ("list", "services"),
        ("watch", "services"),
        ("list", "endpointslices"),
        ("watch", "endpointslices"),
        ("list", "nodes"),
        ("watch", "nodes"),
        ("get", "nodes"),
        ("list", "servicecidrs"),
        ("watch", "servicecidrs"),
        ("create", "events"),
        ("patch", "events"),
        ("update", "events"),
    }
)


@contextmanager
def running_apiserver(**kwargs: Any) -> Iterator[FakeApiServer]:
    """``with running_apiserver(bookmark_interval=0.2) as srv: ...`` (stopped on exit)."""
    srv = FakeApiServer(**kwargs).start()
    try:
        yield srv
    finally:
        srv.stop()


__all__ = [
    "DEFAULT_RESOURCES",
    "ENDPOINTSLICES",
    "EVENTS",
    "EVENTS_V1",
    "KUBE_PROXY_PERMISSIONS",
    "NODES",
    "SERVICECIDRS",
    "SERVICES",
    "TLS_CERT",
    "TLS_KEY",
    "ApiError",
    "FakeApiServer",
    "RequestAttributes",
    "RequestRecord",
    "ResourceType",
    "parse_field_selector",
    "parse_label_selector",
    "running_apiserver",
]
