"""core/v1 Events about the objects kubeplex cannot program, posted as client-go's recorder does."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubeplex.core.model.errors import InvalidObject, bare, clip
from kubeplex.core.sources.api_errors import LOG_TEXT_LIMIT
from kubeplex.core.sources.kubeclient import ApiException, ApiTransport, api_request
from kubeplex.core.sources.token_bucket import TokenBucket

log = logging.getLogger(__name__)

JSON = dict[str, Any]

#: Event reason for an object kubeplex cannot program.
REASON_FAILED_TO_PROGRAM = "FailedToProgram"
#: Characters of an Event's message.
EVENT_MESSAGE_LIMIT = 1024
#: Longest name, namespace, uid or resourceVersion an API object can have (a DNS subdomain).
REF_VALUE_LIMIT = 253
DEFAULT_COMPONENT = "kube-proxy"

EVENTS_PATH = "/api/v1/namespaces/{namespace}/events"
EVENT_PATH = "/api/v1/namespaces/{namespace}/events/{name}"

_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z"
)


def _now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Posted:
    name: str
    namespace: str
    count: int


class EventRecorder:
    """Posts core/v1 Events about objects kubeplex cannot program, off the watch threads.

    Like client-go's recorder: identical events (same object, reason and message) are
    aggregated into one Event whose ``count`` is patched; each object may produce ``burst``
    events, then one per ``refill_seconds`` (EventSourceObjectSpamFilter); a full queue drops
    events rather than blocking a watch. Every event is also logged.
    """

    def __init__(
        self,
        api: ApiTransport,
        node_name: str,
        *,
        component: str = DEFAULT_COMPONENT,
        burst: int = 25,
        refill_seconds: float = 300.0,
        queue_size: int = 1000,
        max_tracked: int = 4096,
        request_timeout: tuple[float, float] = (5.0, 10.0),
    ) -> None:
        self._api = api
        self.request_timeout = request_timeout
        self.node_name = node_name
        self.component = component
        self._burst = burst
        self._refill = refill_seconds
        self._max_tracked = max_tracked
        self._queue: deque[tuple[JSON, str, str, str]] = deque()
        self._busy = False
        self._queue_size = queue_size
        self._cond = threading.Condition()
        self._stop = False
        self._buckets: OrderedDict[tuple[str, ...], TokenBucket] = OrderedDict()
        self._posted: OrderedDict[tuple[str, ...], _Posted] = OrderedDict()
        self._thread: threading.Thread | None = None
        self.posted = 0
        self.dropped = 0
        self.failed = 0

    # the ClusterState sink
    def invalid_object(self, err: InvalidObject, obj: Mapping[str, Any]) -> None:
        message = err.details or str(err)
        self.record(
            obj,
            "Warning",
            REASON_FAILED_TO_PROGRAM,
            f"kubeplex cannot program this object, the last valid version stays in effect: "
            f"{message}",
        )

    def record(self, obj: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """Queue an event about ``obj`` (a raw API object). Never blocks."""
        ref = _object_reference(obj)
        message = clip(message, EVENT_MESSAGE_LIMIT)
        log.warning("event %s %s on %s: %s", type_, reason, _describe_object(obj), message)
        key = (ref.get("kind", ""), ref.get("namespace", ""), ref.get("name", ""))
        with self._cond:  # watch threads of different resources report concurrently
            bucket = self._buckets.get(key)
            if bucket is None:
                bucket = TokenBucket(1.0 / self._refill, self._burst)
                self._buckets[key] = bucket
                while len(self._buckets) > self._max_tracked:
                    self._buckets.popitem(last=False)
            if not bucket.try_acquire() or len(self._queue) >= self._queue_size:
                self.dropped += 1
                return
            self._queue.append((ref, type_, reason, message))
            self._cond.notify()

    def start(self) -> None:
        if self._thread is None:
            self._stop = False
            self._thread = threading.Thread(target=self._run, name="kubeapi-events", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 1.0) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until the queue is empty (tests, shutdown). False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))
        return True

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
                item = self._queue.popleft()
                self._busy = True
            try:
                self._post(*item)
            except Exception as err:  # an event must never take anything down
                self.failed += 1
                log.warning(
                    "could not record event %s on %s: %s",
                    item[2],
                    _describe_object(item[0]),
                    clip(str(err), LOG_TEXT_LIMIT),
                )
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _post(self, ref: JSON, type_: str, reason: str, message: str) -> None:
        namespace = ref.get("namespace") or "default"
        key = (
            ref.get("kind", ""),
            namespace,
            ref.get("name", ""),
            ref.get("uid", ""),
            type_,
            reason,
            message,
        )
        now = _now_rfc3339()
        seen = self._posted.get(key)
        if seen is not None:
            try:
                api_request(
                    self._api,
                    "PATCH",
                    EVENT_PATH,
                    path_params={"namespace": seen.namespace, "name": seen.name},
                    body={"count": seen.count + 1, "lastTimestamp": now},
                    content_type="application/strategic-merge-patch+json",
                    timeout=self.request_timeout,
                ).release_conn()
                seen.count += 1
                self.posted += 1
                self._posted.move_to_end(key)
                return
            except ApiException as err:
                if err.status != 404:  # gone (events expire): create a fresh one
                    raise
                del self._posted[key]
        name = str(ref.get("name", ""))
        if not _DNS1123_SUBDOMAIN.match(name) or len(name) > 200:
            name = "kubeplex"
        event_name = f"{name}.{time.time_ns():x}"
        body: JSON = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": event_name, "namespace": namespace},
            "involvedObject": ref,
            "reason": reason,
            "message": message,
            "type": type_,
            "source": {"component": self.component, "host": self.node_name},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "reportingComponent": self.component,
            "reportingInstance": self.node_name,
        }
        api_request(
            self._api,
            "POST",
            EVENTS_PATH,
            path_params={"namespace": namespace},
            body=body,  # sent as JSON, with no Content-Type (as the generated client does)
            timeout=self.request_timeout,
        ).release_conn()
        self.posted += 1
        self._posted[key] = _Posted(event_name, namespace, 1)
        while len(self._posted) > self._max_tracked:
            self._posted.popitem(last=False)


def _object_reference(obj: Mapping[str, Any]) -> JSON:
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    ref: JSON = {
        "kind": _short_str(obj.get("kind", "")),
        "apiVersion": _short_str(obj.get("apiVersion", "")),
    }
    for src, dst in (
        ("name", "name"),
        ("namespace", "namespace"),
        ("uid", "uid"),
        ("resourceVersion", "resourceVersion"),
    ):
        value = meta.get(src)
        # Longer than any API object's: no object to refer to (and no megabytes to post).
        if isinstance(value, str) and value and len(value) <= REF_VALUE_LIMIT:
            ref[dst] = value
    if ref["kind"] == "Node":
        ref.pop("namespace", None)
    return ref


def _short_str(value: Any) -> str:
    return value if isinstance(value, str) and len(value) <= REF_VALUE_LIMIT else ""


def _describe_object(obj: Mapping[str, Any]) -> str:
    """``Kind ns/name`` of a raw object (or object reference) for a log line, bounded."""
    meta = obj.get("metadata", obj)
    meta = meta if isinstance(meta, Mapping) else {}
    kind = bare(obj.get("kind") or "?", 64)
    name = bare(meta.get("name", ""))
    ns = meta.get("namespace")
    return f"{kind} {bare(ns)}/{name}" if ns and kind != "Node" else f"{kind} {name}"
