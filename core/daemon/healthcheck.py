"""Health checks: the proxy's /healthz and /livez, and per-Service health-check NodePorts.

Semantics follow upstream's pkg/proxy/healthcheck:

* **Proxy health** (``ProxyHealth``). Each IP family remembers when its rules were last
  updated and the oldest change queued since. A family is unhealthy once a queued change has
  waited ``health_timeout`` (upstream: 2 x syncPeriod) without a successful sync; a family
  with nothing queued is healthy however old its rules are (a quiet cluster is not a stale
  one). ``/livez`` answers that alone; ``/healthz`` also needs the node to be eligible (not
  being deleted), so a node on its way out is taken out of load balancers while the proxy
  stays live. Both answer JSON with ``lastUpdated``, ``currentTime``, ``healthy`` and a
  per-family ``status`` (``/healthz`` adds ``nodeEligible``); when healthy, ``lastUpdated`` is
  the current time, as upstream keeps for compatibility. ``/healthz`` also lists, as
  ``servicesNotProgrammed``, the service ports the last sync left out (kubeplex isolates a
  Service its backend cannot program, where upstream fails the whole sync); the field is
  absent while there are none, so the body is upstream's.
* **Service health** (``ServiceHealthServer``): one listener per ``healthCheckNodePort`` of a
  ``externalTrafficPolicy: Local`` Service, opened and closed as Services come and go. It
  answers 200 while the node has a ready local endpoint of the Service and the proxy is
  healthy, 503 otherwise, with upstream's JSON body and headers, so cloud load balancers only
  send traffic to nodes that can serve it locally.

All listeners of a process share one ``HTTPServing`` loop (``httpserving``: one thread over
non-blocking sockets, bounded connections and deadlines, a small pool for the answers), so
opening and closing a port is immediate, a hundred Services do not cost a hundred threads and
idle clients cost no thread at all. Listeners can be opened inside a network namespace
(``netns``), where the proxy programs its rules.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubeplex.core.daemon.httpserving import App, HTTPServing, Listener, ListenError, Response
from kubeplex.core.model.graph import ProxyState
from kubeplex.core.model.types import IPFamily

log = logging.getLogger(__name__)

#: Told of every /healthz or /livez answer: ("healthz" | "livez", status code).
ProbeHook = Callable[[str, int], None]

JSON_HEADERS = (("Content-Type", "application/json"), ("X-Content-Type-Options", "nosniff"))
#: The most service ports /healthz lists as not programmed (the metric counts them all).
NOT_PROGRAMMED_LISTED = 100
_NOT_FOUND: Response = (
    404,
    (("Content-Type", "text/plain; charset=utf-8"), ("X-Content-Type-Options", "nosniff")),
    b"404 page not found\n",
)


#: A listener could not be opened (address in use, no such namespace, ...).
HealthCheckError = ListenError


# ------------------------------------------------------------------------------ proxy health


def go_time(ts: float | None) -> str:
    """A timestamp as Go's JSON encoding writes a UTC time.Time (RFC 3339, trimmed fraction)."""
    if ts is None:
        return "0001-01-01T00:00:00Z"
    dt = datetime.fromtimestamp(ts, UTC)
    frac = f"{dt.microsecond:06d}".rstrip("0")
    return dt.strftime("%Y-%m-%dT%H:%M:%S") + (f".{frac}" if frac else "") + "Z"


@dataclass(frozen=True)
class FamilyHealth:
    last_updated: float
    healthy: bool


@dataclass(frozen=True)
class HealthReport:
    healthy: bool
    #: The most recent update of any family (None: no family ever updated).
    last_updated: float | None
    current_time: float
    status: Mapping[str, FamilyHealth] = field(default_factory=dict)

    def document(self, node_eligible: bool | None = None) -> dict[str, Any]:
        """Upstream's ProxyHealth JSON object (``nodeEligible`` only for /healthz)."""
        doc: dict[str, Any] = {
            "lastUpdated": go_time(self.last_updated),
            "currentTime": go_time(self.current_time),
        }
        if node_eligible is not None:
            doc["nodeEligible"] = node_eligible
        doc["healthy"] = self.healthy
        if self.status:
            doc["status"] = {
                fam: {"lastUpdated": go_time(h.last_updated), "healthy": h.healthy}
                for fam, h in sorted(self.status.items())
            }
        return doc


class ProxyHealth:
    """Upstream's ProxyHealthServer state: per-family last update and oldest queued change.

    ``clock`` returns wall-clock seconds (``time.time``); tests pass a fake one.
    """

    def __init__(
        self,
        health_timeout: float,
        *,
        node_eligible: Callable[[], bool] = lambda: True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.health_timeout = health_timeout
        self._node_eligible = node_eligible
        self.clock = clock
        self._lock = threading.Lock()
        self._last_updated: dict[str, float] = {}
        self._oldest_queued: dict[str, float] = {}
        self._not_programmed: tuple[str, ...] = ()

    def updated(self, families: Iterable[IPFamily | str]) -> None:
        """The rules of these families now reflect every change seen: healthy again."""
        now = self.clock()
        with self._lock:
            for fam in families:
                self._oldest_queued.pop(str(fam), None)
                self._last_updated[str(fam)] = now

    def queued_update(self, families: Iterable[IPFamily | str]) -> None:
        """A change arrived that the rules do not show yet (keeps the oldest such time)."""
        now = self.clock()
        with self._lock:
            for fam in families:
                self._oldest_queued.setdefault(str(fam), now)

    def not_programmed(self, service_ports: Iterable[str]) -> None:
        """The service ports the last successful sync left out (none: all programmed)."""
        listed = tuple(sorted(service_ports))
        with self._lock:
            self._not_programmed = listed

    def health(self) -> HealthReport:
        now = self.clock()
        with self._lock:
            status: dict[str, FamilyHealth] = {}
            for fam, updated in self._last_updated.items():
                queued = self._oldest_queued.get(fam)
                # Healthy while starting up or fully synced, or while the queued change is
                # not late yet; only families that have synced once are judged (upstream).
                late = queued is not None and now - queued >= self.health_timeout
                status[fam] = FamilyHealth(updated, not late)
            last = max(self._last_updated.values(), default=None)
        return HealthReport(all(h.healthy for h in status.values()), last, now, status)

    def node_eligible(self) -> bool:
        try:
            return bool(self._node_eligible())
        except Exception:
            log.exception("node eligibility check failed; reporting the node eligible")
            return True

    def healthz(self) -> Response:
        report = self.health()
        eligible = self.node_eligible()
        healthy = report.healthy and eligible
        doc = self._document(report, healthy, eligible)
        with self._lock:
            left_out = self._not_programmed
        if left_out:
            doc["servicesNotProgrammed"] = list(left_out[:NOT_PROGRAMMED_LISTED])
        return self._response(doc, healthy)

    def livez(self) -> Response:
        report = self.health()
        return self._response(self._document(report, report.healthy, None), report.healthy)

    @staticmethod
    def _document(report: HealthReport, healthy: bool, eligible: bool | None) -> dict[str, Any]:
        doc = report.document(eligible)
        if healthy:
            # Upstream compatibility: a healthy proxy reports "now" as its last update.
            doc["lastUpdated"] = doc["currentTime"]
        return doc

    @staticmethod
    def _response(doc: Mapping[str, Any], healthy: bool) -> Response:
        body = json.dumps(doc, separators=(",", ":")).encode()
        return (200 if healthy else 503), JSON_HEADERS, body


class ProxyHealthServer:
    """``/healthz`` and ``/livez`` of a ``ProxyHealth`` on one address (healthzBindAddress)."""

    def __init__(
        self,
        serving: HTTPServing,
        health: ProxyHealth,
        host: str,
        port: int,
        *,
        on_probe: ProbeHook | None = None,
        netns: str | None = None,
    ) -> None:
        self.health = health
        self._serving = serving
        self._on_probe = on_probe
        self._server = serving.listen(host, port, self._app, netns=netns)
        self.address = serving.address_of(self._server)

    def _app(self, method: str, path: str) -> Response:
        if path == "/healthz":
            response = self.health.healthz()
            self._record("healthz", response[0])
            return response
        if path == "/livez":
            response = self.health.livez()
            self._record("livez", response[0])
            return response
        return _NOT_FOUND

    def _record(self, probe: str, code: int) -> None:
        if self._on_probe is not None:
            try:
                self._on_probe(probe, code)
            except Exception:
                log.exception("recording a %s probe failed", probe)

    def close(self) -> None:
        self._serving.close(self._server)


# ---------------------------------------------------------------------------- service health

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
class _Instance:
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
        self._services: dict[ServiceKey, _Instance] = {}

    def ports(self) -> dict[ServiceKey, int]:
        """The Services whose health check is listening, and on which port."""
        with self._lock:
            return {key: inst.port for key, inst in self._services.items()}

    def sync_services(self, wanted: Mapping[ServiceKey, int]) -> list[str]:
        """Open and close listeners to match ``wanted``; returns what could not be opened.

        A Service that failed to open is retried at the next call (it is not remembered).
        """
        errors: list[str] = []
        with self._lock:
            for key, inst in list(self._services.items()):
                if wanted.get(key) != inst.port:
                    log.info("closing health check of %s/%s on port %d", *key, inst.port)
                    self._close(inst)
                    del self._services[key]
            for key, port in sorted(wanted.items()):
                if key in self._services:
                    continue
                log.info("opening health check of %s/%s on port %d", *key, port)
                try:
                    servers = self._open(key, port)
                except (HealthCheckError, RuntimeError) as err:
                    msg = (
                        f"node {self._node_name or '?'} failed to start health check "
                        f"{key[0]}/{key[1]} on port {port}: {err}"
                    )
                    log.error("%s", msg)
                    errors.append(msg)
                    continue
                self._services[key] = _Instance(port, servers)
        return errors

    def sync_endpoints(self, counts: Mapping[ServiceKey, int]) -> None:
        """Local endpoint counts; a Service missing from ``counts`` has none."""
        with self._lock:
            for key, inst in self._services.items():
                inst.endpoints = counts.get(key, 0)

    def sync_state(self, state: ProxyState) -> list[str]:
        """Both of the above from one sync's state (what the sync listener calls)."""
        errors = self.sync_services(health_check_node_ports(state))
        self.sync_endpoints(local_ready_endpoints(state))
        return errors

    def close(self) -> None:
        with self._lock:
            for inst in self._services.values():
                self._close(inst)
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

    def _close(self, inst: _Instance) -> None:
        for srv in inst.servers:
            try:
                self._serving.close(srv)
            except RuntimeError:
                srv.server_close()

    def _app_for(self, key: ServiceKey) -> App:
        def app(method: str, path: str) -> Response:
            with self._lock:
                inst = self._services.get(key)
                count = inst.endpoints if inst is not None else 0
            try:
                healthy = bool(self._proxy_healthy())
            except Exception:
                log.exception("proxy health check failed")
                healthy = False
            headers = (*JSON_HEADERS, ("X-Load-Balancing-Endpoint-Weight", str(count)))
            status = 200 if count and healthy else 503
            return status, headers, service_health_body(key, count, healthy)

        return app
