"""Per-Service health checks (upstream's pkg/proxy/healthcheck/service_health.go).

One listener per ``healthCheckNodePort`` of an ``externalTrafficPolicy: Local`` Service (on each
configured address), opened and closed as Services come and go. It answers 200 while the node
has a ready local endpoint of the Service and the proxy is healthy, 503 otherwise, with
upstream's JSON body and headers, so cloud load balancers only send traffic to nodes that can
serve it locally.

The listeners share the process's ``HTTPServing`` loop (``httpserving``: one thread over
non-blocking sockets), so opening and closing a port is immediate, a hundred Services do not
cost a hundred threads and idle clients cost no thread at all. They can be opened inside a
network namespace (``netns``), where the proxy programs its rules.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from kubeplex.core.daemon.httpserving import (
    JSON_HEADERS,
    App,
    HTTPServing,
    Listener,
    ListenError,
    Response,
)
from kubeplex.core.model.graph import ProxyState

log = logging.getLogger(__name__)

#: (namespace, name) of a Service.
ServiceKey = tuple[str, str]


def health_check_node_ports(state: ProxyState) -> dict[ServiceKey, int]:
    """Every Service with a healthCheckNodePort (upstream's HealthCheckNodePorts)."""
    out: dict[ServiceKey, int] = {}
    for graph in state.graphs.values():
        for spn, svc in graph.services.items():
            if svc.health_check_node_port:
                out[(spn.namespace, spn.name)] = svc.health_check_node_port
    return out


def local_ready_endpoints(state: ProxyState) -> dict[ServiceKey, int]:
    """Distinct ready endpoint IPs on this node per Service (upstream's LocalReadyEndpoints).

    Ready, not merely serving: a node whose only local endpoints are terminating fails its
    health check, so load balancers drain it while those pods finish.
    """
    ips: dict[ServiceKey, set[str]] = {}
    for graph in state.graphs.values():
        for spn in graph.services:
            for ep in graph.endpoints_of(spn):
                if ep.is_local and ep.ready:
                    ips.setdefault((spn.namespace, spn.name), set()).add(ep.ip)
    return {key: len(found) for key, found in ips.items()}


def service_health_body(key: ServiceKey, count: int, proxy_healthy: bool) -> bytes:
    """Upstream's body, byte for byte (tab-indented, no trailing newline)."""
    namespace, name = key
    return (
        "{\n"
        '\t"service": {\n'
        f'\t\t"namespace": {json.dumps(namespace)},\n'
        f'\t\t"name": {json.dumps(name)}\n'
        "\t},\n"
        f'\t"localEndpoints": {count},\n'
        f'\t"serviceProxyHealthy": {"true" if proxy_healthy else "false"}\n'
        "}"
    ).encode()


@dataclass
class _ServiceListeners:
    """A Service's health-check listeners (one per address) and its local ready endpoints."""

    port: int
    servers: list[Listener]
    endpoints: int = 0


class ServiceHealthServer:
    """The health-check NodePorts of a node: one listener per Service and address."""

    def __init__(
        self,
        serving: HTTPServing,
        *,
        addresses: Sequence[str] = ("0.0.0.0",),
        proxy_healthy: Callable[[], bool] = lambda: True,
        netns: str | None = None,
        node_name: str = "",
    ) -> None:
        for host in addresses:
            ipaddress.ip_address(host)  # a bad address is a programming error: fail early
        self._serving = serving
        self._addresses = tuple(addresses)
        self._proxy_healthy = proxy_healthy
        self._netns = netns
        self._node_name = node_name
        self._lock = threading.Lock()
        self._services: dict[ServiceKey, _ServiceListeners] = {}

    def ports(self) -> dict[ServiceKey, int]:
        """The Services whose health check is listening, and on which port."""
        with self._lock:
            return {key: listeners.port for key, listeners in self._services.items()}

    def sync_services(self, wanted: Mapping[ServiceKey, int]) -> list[str]:
        """Open and close listeners to match ``wanted``; returns what could not be opened.

        A Service that failed to open is retried at the next call (it is not remembered).
        """
        errors: list[str] = []
        with self._lock:
            for key, listeners in list(self._services.items()):
                if wanted.get(key) != listeners.port:
                    log.info("closing health check of %s/%s on port %d", *key, listeners.port)
                    self._close(listeners)
                    del self._services[key]
            for key, port in sorted(wanted.items()):
                if key in self._services:
                    continue
                log.info("opening health check of %s/%s on port %d", *key, port)
                try:
                    servers = self._open(key, port)
                except (ListenError, RuntimeError) as err:
                    msg = (
                        f"node {self._node_name or '?'} failed to start health check "
                        f"{key[0]}/{key[1]} on port {port}: {err}"
                    )
                    log.error("%s", msg)
                    errors.append(msg)
                    continue
                self._services[key] = _ServiceListeners(port, servers)
        return errors

    def sync_endpoints(self, counts: Mapping[ServiceKey, int]) -> None:
        """Local endpoint counts; a Service missing from ``counts`` has none."""
        with self._lock:
            for key, listeners in self._services.items():
                listeners.endpoints = counts.get(key, 0)

    def sync_state(self, state: ProxyState) -> list[str]:
        """Both of the above from one sync's state (what the sync listener calls)."""
        errors = self.sync_services(health_check_node_ports(state))
        self.sync_endpoints(local_ready_endpoints(state))
        return errors

    def close(self) -> None:
        with self._lock:
            for listeners in self._services.values():
                self._close(listeners)
            self._services.clear()

    def _open(self, key: ServiceKey, port: int) -> list[Listener]:
        servers: list[Listener] = []
        try:
            for host in self._addresses:
                app = self._app_for(key)
                servers.append(self._serving.listen(host, port, app, netns=self._netns))
        except BaseException:
            # Close what was opened, so a retry (or another owner of the port) can bind.
            for srv in servers:
                self._serving.close(srv)
            raise
        return servers

    def _close(self, listeners: _ServiceListeners) -> None:
        for srv in listeners.servers:
            try:
                self._serving.close(srv)
            except RuntimeError:
                srv.server_close()

    def _app_for(self, key: ServiceKey) -> App:
        def app(method: str, path: str) -> Response:
            with self._lock:
                listeners = self._services.get(key)
                count = listeners.endpoints if listeners is not None else 0
            try:
                healthy = bool(self._proxy_healthy())
            except Exception:
                log.exception("proxy health check failed")
                healthy = False
            headers = (*JSON_HEADERS, ("X-Load-Balancing-Endpoint-Weight", str(count)))
            status = 200 if count and healthy else 503
            return status, headers, service_health_body(key, count, healthy)

        return app
