"""The proxy's own health: /healthz and /livez (upstream's pkg/proxy/healthcheck/proxy_health.go).

Each IP family remembers when its rules were last updated and the oldest change queued since.
A family is unhealthy once a queued change has waited ``health_timeout`` (upstream: 2 x
syncPeriod) without a successful sync; a family with nothing queued is healthy however old its
rules are (a quiet cluster is not a stale one). ``/livez`` answers that alone; ``/healthz`` also
needs the node to be eligible (not being deleted), so a node on its way out is taken out of load
balancers while the proxy stays live. Both answer JSON with ``lastUpdated``, ``currentTime``,
``healthy`` and a per-family ``status`` (``/healthz`` adds ``nodeEligible``); when healthy,
``lastUpdated`` is the current time, as upstream keeps for compatibility. ``/healthz`` also
lists, as ``servicesNotProgrammed``, the service ports the last sync left out (kubeplex isolates
a Service its backend cannot program, where upstream fails the whole sync); the field is absent
while there are none, so the body is upstream's.

The server is one listener of the process's ``HTTPServing`` loop (``httpserving``), opened
inside the network namespace (``netns``) where the proxy programs its rules, if one is given.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubeplex.core.daemon.httpserving import JSON_HEADERS, HTTPServing, Response
from kubeplex.core.model.types import IPFamily

log = logging.getLogger(__name__)

#: Told of every /healthz or /livez answer: ("healthz" | "livez", status code).
ProbeHook = Callable[[str, int], None]

#: The most service ports /healthz lists as not programmed (the metric counts them all).
NOT_PROGRAMMED_LISTED = 100
_NOT_FOUND: Response = (
    404,
    (("Content-Type", "text/plain; charset=utf-8"), ("X-Content-Type-Options", "nosniff")),
    b"404 page not found\n",
)


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
