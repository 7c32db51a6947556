"""Cluster state from the Kubernetes API: list+watch of Services, EndpointSlices, the own Node
and ServiceCIDRs.

One daemon thread per resource runs a reflector loop like client-go's:

* **list** into a buffer; only a *complete* list is applied, as a diff against what was applied
  before (new or changed objects set, vanished ones deleted), under the cluster's batch lock,
  so a sync never sees half a relist. The resourceVersions are the reflector's: the first list
  asks for ``resourceVersion=0`` with a ``limit`` (the watch cache answers it whole, ignoring
  the limit; a server without one pages it, and then every list is paged); a relist asks for
  the last resourceVersion seen, unpaged (served by the watch cache, at least that fresh);
  a list whose resourceVersion is too old (410) or too new (504 ResourceVersionTooLarge) is
  retried at once with ``resourceVersion`` unset, paged (a consistent read);
* **watch** from the list's resourceVersion with ``allowWatchBookmarks`` and a bounded,
  jittered ``timeoutSeconds``; a clean end re-watches from the last resourceVersion seen
  (events and bookmarks advance it), unless the watch lasted under a second without an event;
  a watch refused (connection refused, 429) is asked for again after a backoff step;
* any other end of a round (``410 Gone``/``Expired``, a watch that broke or ended at once, a
  list that failed: dropped connection, 5xx, 403, unreachable server) relists after the next
  step of client-go's reflector backoff (:mod:`kubeplex.core.sources.reflector_backoff`: 0.8 s
  doubling to 30 s, jittered), so a watch that fails every time is not a relist storm. Nothing
  is ever deleted because a request failed: the working rules stay until a complete list says
  an object is gone;
* every ``configSyncPeriod`` the resource is relisted (0: never).

Services and EndpointSlices are listed with upstream kube-proxy's label selector
(:data:`PROXY_LABEL_SELECTOR`: no headless, no other service proxy); the Node with the field
selector ``metadata.name=<node>``. Objects are fed to :class:`ClusterState` in their raw API
(dict) form, exactly as the manifest source feeds them.

networking.k8s.io/v1 ServiceCIDRs (the ranges ClusterIPs come from; nftables mode drops traffic
to their unallocated addresses) are optional: their list does not gate the initial sync, and an
API server without them (404, before Kubernetes 1.33 or with MultiCIDRServiceAllocator off) or
a role without them (403) is logged once and asked again every ``missing_retry`` seconds.

Permissions: list/watch services, endpointslices, nodes and servicecidrs, and create/patch
events — a subset of ``system:node-proxier`` plus event recording.

The Python client speaks JSON only: ``clientConnection.contentType`` (protobuf by default)
falls back to JSON; ``clientConnection.qps``/``burst`` drive a client-side token bucket
(:class:`TokenBucket`) in front of every list and watch request, which the Python client does
not have on its own.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import logging
import queue
import random
import re
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubeplex.core.config.kubeproxy import KubeProxyConfiguration
from kubeplex.core.model.cluster import ClusterState, ErrorSink
from kubeplex.core.model.errors import InvalidObject, KubeplexError, bare, clip, shown
from kubeplex.core.model.graph import ProxyState
from kubeplex.core.model.types import IPFamily
from kubeplex.core.sources.kubeclient import (
    ApiException,
    ApiTransport,
    api_request,
    make_api_client,
)
from kubeplex.core.sources.reflector_backoff import ReflectorBackoff
from kubeplex.core.startup.collector import Pause, freeze_once

log = logging.getLogger(__name__)

JSON = dict[str, Any]

#: Upstream kube-proxy's informer selector for Services and EndpointSlices
#: (``!service.kubernetes.io/service-proxy-name`` and ``!service.kubernetes.io/headless``, as
#: ``labels.Selector.String()`` prints them: sorted by key).
PROXY_LABEL_SELECTOR = "!service.kubernetes.io/headless,!service.kubernetes.io/service-proxy-name"

#: Event reason for an object kubeplex cannot program.
REASON_FAILED_TO_PROGRAM = "FailedToProgram"
#: Characters of an Event's message, and of a log line's text quoting a user or the server.
EVENT_MESSAGE_LIMIT = 1024
LOG_TEXT_LIMIT = 4096
#: Longest name, namespace, uid or resourceVersion an API object can have (a DNS subdomain).
REF_VALUE_LIMIT = 253
DEFAULT_COMPONENT = "kube-proxy"
PROTOBUF = "application/vnd.kubernetes.protobuf"

EVENTS_PATH = "/api/v1/namespaces/{namespace}/events"
EVENT_PATH = "/api/v1/namespaces/{namespace}/events/{name}"

SERVICES = "services"
ENDPOINTSLICES = "endpointslices"
NODES = "nodes"
SERVICECIDRS = "servicecidrs"
RESOURCES = (SERVICES, ENDPOINTSLICES, NODES, SERVICECIDRS)

_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z"
)


# --------------------------------------------------------------------------------- rate limit


class TokenBucket:
    """client-go's flowcontrol token bucket: ``burst`` requests at once, ``qps`` sustained.

    ``qps <= 0`` disables the limit (as client-go does for a negative QPS).
    """

    def __init__(self, qps: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.qps = qps
        self.burst = max(1, burst)
        self._clock = clock
        self._tokens = float(self.burst)
        self._last = clock()
        self._lock = threading.Lock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.qps)
        self._last = now

    def reserve(self) -> float:
        """Take a token; return how long to wait before using it (0: now)."""
        if self.qps <= 0:
            return 0.0
        with self._lock:
            self._refill()
            self._tokens -= 1.0
            return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    def try_acquire(self) -> bool:
        """Take a token only if one is available now."""
        if self.qps <= 0:
            return True
        with self._lock:
            self._refill()
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return True
            return False

    def acquire(self, stop: threading.Event | None = None) -> bool:
        """Wait for a token; False if ``stop`` was set meanwhile."""
        delay = self.reserve()
        if delay <= 0:
            return stop is None or not stop.is_set()
        if stop is None:
            time.sleep(delay)
            return True
        return not stop.wait(delay)


# --------------------------------------------------------------------------------- cluster


class GatedClusterState(ClusterState):
    """A :class:`ClusterState` that cannot be checked out before the initial sync, nor in the
    middle of a relist.

    ``checkout()`` blocks until :meth:`open` (the API source calls it once the Services,
    EndpointSlices and Node lists are all complete) and takes the batch lock, which the source
    holds while it applies a relist: a sync sees the cluster before or after a relist, never
    half of one, and never a cluster whose lists are incomplete (which would delete the rules
    of every Service not listed yet).
    """

    def __init__(
        self,
        node_name: str,
        families: Iterable[IPFamily] = (IPFamily.IPv4, IPFamily.IPv6),
        on_invalid: ErrorSink | None = None,
    ) -> None:
        super().__init__(node_name, families, on_invalid)
        self._gate = threading.Condition(threading.RLock())
        self._open = False
        self._closed = False

    def batch(self) -> contextlib.AbstractContextManager[Any]:
        """Hold while applying several changes that must be seen together."""
        return self._gate

    def open(self) -> None:
        with self._gate:
            self._open = True
            self._gate.notify_all()

    def close(self) -> None:
        """The source gave up: a blocked checkout raises instead of waiting forever."""
        with self._gate:
            self._closed = True
            self._gate.notify_all()

    @property
    def is_open(self) -> bool:
        return self._open

    def checkout(self, full: bool = False) -> ProxyState:
        with self._gate:
            while not self._open:
                if self._closed:
                    raise KubeplexError(
                        "the Kubernetes API source stopped before its initial sync: "
                        "nothing may be programmed from an incomplete cluster"
                    )
                self._gate.wait()
            return super().checkout(full)


# --------------------------------------------------------------------------------- events


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
        log.warning("event %s %s on %s: %s", type_, reason, _where(obj), message)
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
                    _where(item[0]),
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


def _where(obj: Mapping[str, Any]) -> str:
    """``Kind ns/name`` of a raw object (or object reference) for a log line, bounded."""
    meta = obj.get("metadata", obj)
    meta = meta if isinstance(meta, Mapping) else {}
    kind = bare(obj.get("kind") or "?", 64)
    name = bare(meta.get("name", ""))
    ns = meta.get("namespace")
    return f"{kind} {bare(ns)}/{name}" if ns and kind != "Node" else f"{kind} {name}"


# --------------------------------------------------------------------------------- source


class _Expired(Exception):
    """The watch's resourceVersion is too old (410 Gone / Expired): relist now."""


class _WatchError(Exception):
    """The server ended a watch with an ERROR event other than 410, or at once."""


class _Refused(Exception):
    """The server refused a watch (connection refused, 429): ask again, without a relist."""


class _Stopped(Exception):
    pass


class _Missing(Exception):
    """An optional resource the server does not serve (404) or the role does not grant (403)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class _Resource:
    name: str
    kind: str
    api_version: str
    #: the collection's path (list and watch across all namespaces)
    path: str
    label_selector: str = ""
    field_selector: str = ""
    #: False: its initial list does not gate the sync, and a server or role without it is fine
    required: bool = True
    #: what doing without an optional resource means (logged once)
    without: str = ""
    #: the server or the role lacks this optional resource (logged once until it is back)
    missing: bool = False
    #: the resourceVersion of what was last applied, by key (namespace/name, or name for
    #: the cluster-scoped): the objects themselves live on in their parsed form only
    known: dict[str, str] = field(default_factory=dict)
    rv: str = ""
    synced: threading.Event = field(default_factory=threading.Event)
    last_list: float = float("-inf")
    lists: int = 0
    #: the last list's resourceVersion was too old or too new: the next list asks for none
    rv_unavailable: bool = False
    #: a list at resourceVersion 0 came in pages (no watch cache): relists are paged too
    paginated: bool = False
    watches: int = 0
    last_error: str = ""
    response: Any = None
    thread: threading.Thread | None = None


_QUERY_ORDER = (
    "allowWatchBookmarks",
    "continue",
    "fieldSelector",
    "labelSelector",
    "limit",
    "resourceVersion",
    "timeoutSeconds",
    "watch",
)


#: Put on a list's page queue when its paging starts over.
_RESTART = object()
_DECODER = json.JSONDecoder()
_WS = re.compile(r"[ \t\n\r]*")


def _list_meta(data: bytes) -> JSON | None:
    """The top-level ``metadata`` of a list response, read without decoding its items (the
    API server writes ``kind``, ``apiVersion`` and ``metadata`` before ``items``); None if the
    items come first or the text is not such an object (it is then decoded whole)."""
    try:
        text = data[:4096].decode("utf-8", errors="replace")
        pos = _WS.match(text, 0).end()  # type: ignore[union-attr]
        if text[pos : pos + 1] != "{":
            return None
        pos += 1
        while True:
            pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
            key, pos = _DECODER.raw_decode(text, pos)
            pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
            if key == "items" or text[pos : pos + 1] != ":":
                return None
            pos = _WS.match(text, pos + 1).end()  # type: ignore[union-attr]
            value, pos = _DECODER.raw_decode(text, pos)
            if key == "metadata":
                return value if isinstance(value, dict) else {}
            pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
            if text[pos : pos + 1] != ",":
                return None
            pos += 1
    except (ValueError, IndexError):
        return None


def _list_items(body: Any) -> Iterator[JSON]:
    """The items of a list response, one at a time: decoded from its text item by item (so
    no second copy of the whole list is ever built), or taken from the decoded list."""
    if isinstance(body, _Streamed):
        yield from _streamed_items(body)
        return
    if isinstance(body, dict):
        got = body.get("items") or []
        yield from (item for item in got if isinstance(item, dict)) if isinstance(got, list) else ()
        return
    text = body.decode("utf-8") if isinstance(body, bytes | bytearray) else str(body)
    start = _items_start(text)
    if start < 0:  # not laid out as the API server writes it: decode it whole
        yield from _list_items(json.loads(text))
        return
    pos = _WS.match(text, start).end()  # type: ignore[union-attr]
    if text[pos : pos + 1] == "]":
        return
    while True:
        item, pos = _DECODER.raw_decode(text, pos)
        if isinstance(item, dict):
            yield item
        pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
        sep = text[pos : pos + 1]
        if sep == "]":
            return
        if sep != ",":
            raise ValueError(f"list response: expected ',' or ']' at {pos}, got {sep!r}")
        pos = _WS.match(text, pos + 1).end()  # type: ignore[union-attr]


def _items_start(text: str) -> int:
    """Where the array of a list response's top-level ``items`` opens (just after its "["),
    reading the members before it; -1 if the text is not such an object."""
    try:
        pos = _WS.match(text, 0).end()  # type: ignore[union-attr]
        if text[pos : pos + 1] != "{":
            return -1
        pos += 1
        while True:
            pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
            key, pos = _DECODER.raw_decode(text, pos)
            pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
            if not isinstance(key, str) or text[pos : pos + 1] != ":":
                return -1
            pos = _WS.match(text, pos + 1).end()  # type: ignore[union-attr]
            if key == "items":
                return pos + 1 if text[pos : pos + 1] == "[" else -1
            _value, pos = _DECODER.raw_decode(text, pos)
            pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
            if text[pos : pos + 1] != ",":
                return -1
            pos += 1
    except (ValueError, IndexError):
        return -1


#: How much of a list response is read at a time while its items are decoded.
_CHUNK = 1 << 16


@dataclass
class _Streamed:
    """The last page of a list, still arriving: ``head`` (read to find its list metadata),
    then ``rest``; its items are decoded as they come in (an API server that streams lists,
    as kube-apiserver does since 1.33, is still writing the later ones). ``release(read)``
    gives the connection back: for reuse once the page is all read, closed if not."""

    head: bytes
    rest: Iterator[bytes]
    release: Callable[[bool], None]


def _streamed_items(page: _Streamed) -> Iterator[JSON]:
    """The items of a streamed page, each decoded once it is complete: what is incomplete
    at the end of the text read so far is decoded again with more text (a failure counts
    only when the response has ended)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    text = decoder.decode(page.head)
    ended = read = False

    def more() -> bool:
        nonlocal text, ended
        for chunk in page.rest:
            if chunk:
                text += decoder.decode(chunk)
                return True
        if not ended:
            text += decoder.decode(b"", final=True)
            ended = True
        return False

    try:
        start = _items_start(text)
        while start < 0 and more():
            start = _items_start(text)
        if start < 0:  # not laid out as the API server writes it: decode it whole
            while more():
                pass
            read = True
            yield from _list_items(text)
            return
        pos = start
        while True:
            pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
            if pos == len(text) and more():
                continue
            if text[pos : pos + 1] == "]":
                read = _drained(more)
                return
            try:
                item, end = _DECODER.raw_decode(text, pos)
            except ValueError:
                # Incomplete, or broken: twice as much text before the next try, so an item
                # longer than many chunks is decoded a few times, not once per chunk.
                before = len(text)
                want = pos + 2 * (before - pos)
                while len(text) < want and more():
                    pass
                if len(text) > before:
                    continue
                raise
            if isinstance(item, dict):
                yield item
            pos = _WS.match(text, end).end()  # type: ignore[union-attr]
            while pos == len(text) and more():
                pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
            sep = text[pos : pos + 1]
            if sep == "]":
                read = _drained(more)
                return
            if sep != ",":
                raise ValueError(f"list response: expected ',' or ']' at {pos}, got {sep!r}")
            pos += 1
            if pos > _CHUNK:  # what is decoded goes: the text held stays about a chunk
                text, pos = text[pos:], 0
    finally:
        page.release(read)


def _drained(more: Callable[[], bool]) -> bool:
    """Read what follows the items (the closing brace) to the response's end: True, the
    connection can be reused."""
    while more():
        pass
    return True


def _slim(obj: JSON) -> JSON:
    """``obj`` without what no part of kubeplex reads and an API server adds to every object
    (client-go's TransformStripManagedFields, and the endpoints' pod references): a cluster's
    objects take half the memory."""
    meta = obj.get("metadata")
    if type(meta) is dict:
        meta.pop("managedFields", None)
        meta.pop("ownerReferences", None)
    endpoints = obj.get("endpoints")
    if type(endpoints) is list:
        for endpoint in endpoints:
            if type(endpoint) is dict:
                endpoint.pop("targetRef", None)
                endpoint.pop("deprecatedTopology", None)
    return obj


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


def _rv_of(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return str(meta.get("resourceVersion") or "")


def _rv_unavailable(err: ApiException) -> bool:
    """A list's resourceVersion is gone or not there yet: 410 Expired/Gone, or the 504
    Timeout whose cause is ResourceVersionTooLarge (client-go's isExpiredError and
    isTooLargeResourceVersionError, the older servers' message included)."""
    if err.status == 410:
        return True
    if err.status != 504:
        return False
    try:
        status = json.loads(err.body or "{}")
    except (ValueError, TypeError):
        return False
    if not isinstance(status, dict):
        return False
    details = status.get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    for cause in causes if isinstance(causes, list) else []:
        if isinstance(cause, dict) and (
            cause.get("reason") == "ResourceVersionTooLarge"
            or cause.get("message") == "Too large resource version"
        ):
            return True
    return "Too large resource version" in str(status.get("message", ""))


def _read_page(resp: Any) -> tuple[Any, JSON]:
    """A list response's page and its list metadata. The metadata comes before the items (as
    the API server writes them): the last page (no continue token) is handed on still
    arriving, a :class:`_Streamed`; another is read whole, its connection free for the next
    request; a response laid out otherwise is decoded whole here."""
    chunks = _blocks(resp)
    head = b""
    try:
        meta = None
        for chunk in chunks:
            head += chunk
            meta = _list_meta(head)
            if meta is not None or len(head) >= 4096:
                break
        if meta is not None and not (meta.get("continue") or ""):
            return _Streamed(head, chunks, lambda read: _let_go(resp, read)), meta
        data = head + b"".join(chunks)
    except BaseException:
        _let_go(resp, False)
        raise
    _let_go(resp, True)
    if meta is None:  # no metadata before the items: decode it all here
        body = json.loads(data)
        return body, body.get("metadata") or {}
    return data, meta


def _blocks(resp: Any) -> Iterator[bytes]:
    """A response's body in blocks of ``_CHUNK`` bytes (the last one shorter), however the
    server cut it: Go's server sends a streamed list in chunks of about 2 KB, and each piece
    appended to the text and decoded again costs far more than its bytes (read as urllib3
    streams the chunks, 1,000 EndpointSlices took 92 ms of CPU instead of 48)."""
    while True:
        block = resp.read(_CHUNK, decode_content=True)
        if not block:
            return
        yield block


def _let_go(resp: Any, read: bool) -> None:
    """Give a response's connection back to the pool: closed unless the response was read to
    its end (what is left of it must not be taken for the next response)."""
    if not read:
        resp.close()
    resp.release_conn()


def _iter_lines(resp: Any) -> Iterator[bytes]:
    """Newline-delimited JSON frames of a watch response, as they arrive."""
    buffer = bytearray()
    for chunk in resp.stream(amt=None, decode_content=True):
        buffer.extend(chunk)
        while True:
            nl = buffer.find(b"\n")
            if nl < 0:
                break
            line = bytes(buffer[:nl]).strip()
            del buffer[: nl + 1]
            if line:
                yield line
    tail = bytes(buffer).strip()
    if tail:
        yield tail


def _connection_refused(err: BaseException) -> bool:
    """ECONNREFUSED anywhere in the chain (urllib3 wraps it twice), as Go's
    ``utilnet.IsConnectionRefused`` finds it: the server is down, the watch can wait for it."""
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, ConnectionRefusedError):
            return True
        seen.add(id(cause))
        reason = getattr(cause, "reason", None)
        cause = (
            reason if isinstance(reason, BaseException) else cause.__cause__ or cause.__context__
        )
    return False


def _describe(err: BaseException) -> str:
    if isinstance(err, ApiException):
        message = ""
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            message = json.loads(err.body or "{}").get("message", "")
        text = f"HTTP {err.status} {err.reason}" + (f": {message}" if message else "")
    else:
        text = f"{type(err).__name__}: {err}"
    # A server's message may quote an object's values: bounded, like anything quoting them.
    return clip(text, LOG_TEXT_LIMIT)


class KubeApiSource:
    """List+watch of the cluster objects kube-proxy programs, fed into a ClusterState.

    ``start()`` launches one daemon thread per resource; ``wait_for_initial_sync()`` tells
    when the Services, EndpointSlices and the Node have been listed completely; ``stop()``
    returns promptly (open watches are shut down, threads are daemons).

    By default the source makes its own :class:`GatedClusterState` (``self.cluster``) whose
    invalid objects become Events through ``self.events``. A plain ``ClusterState`` may be
    passed instead; it is then up to the caller not to check it out before
    ``wait_for_initial_sync()``, and a relist is applied as one diff but not under a lock.
    """

    def __init__(
        self,
        api: ApiTransport,
        node_name: str,
        *,
        cluster: ClusterState | None = None,
        families: Iterable[IPFamily] = (IPFamily.IPv4, IPFamily.IPv6),
        events: EventRecorder | None = None,
        qps: float = 5.0,
        burst: int = 10,
        config_sync_period: float = 15 * 60.0,
        watch_timeout: float = 5 * 60.0,
        page_size: int = 500,
        backoff_initial: float = 0.8,
        backoff_max: float = 30.0,
        connect_timeout: float = 10.0,
        request_timeout: float = 60.0,
        label_selector: str = PROXY_LABEL_SELECTOR,
        missing_retry: float = 5 * 60.0,
        backoff: Callable[[str], ReflectorBackoff] | None = None,
    ) -> None:
        self.api = api
        self.node_name = node_name
        self.events = events if events is not None else EventRecorder(api, node_name)
        self.cluster: ClusterState = (
            cluster
            if cluster is not None
            else GatedClusterState(node_name, families, on_invalid=self.events.invalid_object)
        )
        self.limiter = TokenBucket(qps, burst)
        self.config_sync_period = config_sync_period
        self.watch_timeout = watch_timeout
        self.page_size = page_size
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        #: How long to wait before asking again for an optional resource the server lacks.
        self.missing_retry = missing_retry
        #: Makes a resource's reflector backoff (tests give one a clock of their own).
        self._new_backoff = backoff or (
            lambda _: ReflectorBackoff(self.backoff_initial, self.backoff_max)
        )
        self._resources = {
            SERVICES: _Resource(
                SERVICES,
                "Service",
                "v1",
                "/api/v1/services",
                label_selector=label_selector,
            ),
            ENDPOINTSLICES: _Resource(
                ENDPOINTSLICES,
                "EndpointSlice",
                "discovery.k8s.io/v1",
                "/apis/discovery.k8s.io/v1/endpointslices",
                label_selector=label_selector,
            ),
            NODES: _Resource(
                NODES, "Node", "v1", "/api/v1/nodes", field_selector=f"metadata.name={node_name}"
            ),
            SERVICECIDRS: _Resource(
                SERVICECIDRS,
                "ServiceCIDR",
                "networking.k8s.io/v1",
                "/apis/networking.k8s.io/v1/servicecidrs",
                required=False,
                without="no drop rule for unallocated ClusterIPs (nftables mode)",
            ),
        }
        self._stop = threading.Event()
        self._synced = threading.Event()
        #: The cyclic collector's pause from start() until the initial lists are complete.
        self._lists_pause: Pause | None = None
        self._node_seen = False
        #: the own Node as last listed or watched (None: not there)
        self._node: JSON | None = None
        self._started = False
        self._owns_api = False

    @classmethod
    def from_config(
        cls, cfg: KubeProxyConfiguration, node_name: str, master: str = "", **kwargs: Any
    ) -> KubeApiSource:
        """A source for ``cfg.client_connection`` and ``cfg.config_sync_period``, reading the
        API server at ``master`` if given (``--master``)."""
        cc = cfg.client_connection
        api = make_api_client(cc, master)
        kwargs.setdefault("qps", cc.qps)
        kwargs.setdefault("burst", cc.burst)
        kwargs.setdefault("config_sync_period", cfg.config_sync_period)
        source = cls(api, node_name, **kwargs)
        source._owns_api = True
        return source

    # ------------------------------------------------------------------------- lifecycle

    def start(self) -> KubeApiSource:
        if self._started:
            return self
        self._started = True
        self._stop.clear()
        if not self._synced.is_set():
            # A first list allocates every object of the cluster and keeps them all: a
            # collector pass meanwhile would only scan what was decoded so far.
            self._lists_pause = Pause()
        self.events.start()
        for r in self._resources.values():
            r.thread = threading.Thread(
                target=self._run, args=(r,), name=f"kubeapi-{r.name}", daemon=True
            )
            r.thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        """Stop every thread; returns within about ``timeout`` seconds even if a request is
        still hanging (its daemon thread ends when the request does)."""
        self._stop.set()
        if self._lists_pause is not None:
            self._lists_pause.end()
        for r in self._resources.values():
            resp = r.response
            if resp is not None:
                with contextlib.suppress(Exception):
                    resp.shutdown()
        if isinstance(self.cluster, GatedClusterState) and not self.cluster.is_open:
            self.cluster.close()
        deadline = time.monotonic() + timeout
        for r in self._resources.values():
            if r.thread is not None:
                r.thread.join(max(0.0, deadline - time.monotonic()))
        # Events already queued (an invalid object seen by `run --once`) get a moment to go out.
        self.events.flush(max(0.0, min(1.0, deadline - time.monotonic())))
        self.events.stop(max(0.05, deadline - time.monotonic()))
        self._started = False
        if self._owns_api:
            with contextlib.suppress(Exception):
                self.api.close()  # idle pooled connections; a hanging request just fails

    # ------------------------------------------------------------------------- queries

    def wait_for_initial_sync(self, timeout: float | None = None) -> bool:
        """True once Services, EndpointSlices and the Node have each been listed completely;
        False if ``timeout`` passed first or the source was stopped."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._synced.is_set():
            if self._stop.is_set():
                return False
            left = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
            if left <= 0:
                return False
            self._synced.wait(left)
        return True

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    @property
    def pending(self) -> tuple[str, ...]:
        """Resources whose initial list is not complete yet (of those that gate the sync)."""
        return tuple(n for n, r in self._resources.items() if r.required and not r.synced.is_set())

    @property
    def last_error(self) -> str:
        """The most recent list/watch failure, '' if none (for logs and health)."""
        return "; ".join(
            f"{r.name}: {r.last_error}" for r in self._resources.values() if r.last_error
        )

    @property
    def node_deleting(self) -> bool:
        """The own Node has a deletionTimestamp, or was deleted after it had been seen
        (healthz reports such a node as not eligible, like upstream)."""
        node = self._node
        if node is None:
            return self._node_seen and self._resources[NODES].synced.is_set()
        return (node.get("metadata") or {}).get("deletionTimestamp") is not None

    @property
    def resource_versions(self) -> dict[str, str]:
        return {n: r.rv for n, r in self._resources.items()}

    def list_count(self, resource: str) -> int:
        """How many complete lists of ``resource`` were applied (1 + relists)."""
        return self._resources[resource].lists

    @property
    def host(self) -> str:
        return str(getattr(self.api.configuration, "host", ""))

    # ------------------------------------------------------------------------- reflector

    def _run(self, r: _Resource) -> None:
        """client-go's Reflector.Run: list-and-watch rounds; a round that ends otherwise than
        for the periodic relist is followed by the next backoff step."""
        backoff = self._new_backoff(r.name)
        while not self._stop.is_set():
            try:
                self._cycle(r, backoff)
                continue  # the periodic relist is due now
            except _Stopped:
                return
            except _Missing as err:
                self._wait_missing(r, err)
                continue
            except _Expired as err:
                level, what = logging.INFO, f"watch expired ({err})"
            except Exception as err:
                if self._stop.is_set():
                    return
                r.last_error = _describe(err)
                level, what = logging.WARNING, f"list/watch failed ({r.last_error})"
            delay = backoff.step()
            log.log(
                level, "%s: %s; relisting in %.1fs, rules stay as they are", r.name, what, delay
            )
            if backoff.wait(self._stop, delay):
                return

    def _wait_missing(self, r: _Resource, err: _Missing) -> None:
        """An optional resource the server or the role lacks: say so once, ask again later."""
        if not r.missing:
            r.missing = True
            if err.status == 404:
                log.info(
                    "%s: not served by this API server (%s): %s; asking again every %.0fs",
                    r.name,
                    err,
                    r.without,
                    self.missing_retry,
                )
            else:
                log.warning(
                    "%s: not allowed (%s): %s; grant list and watch on it (asking again every"
                    " %.0fs)",
                    r.name,
                    err,
                    r.without,
                    self.missing_retry,
                )
        self._stop.wait(self.missing_retry)

    def _cycle(self, r: _Resource, backoff: ReflectorBackoff) -> None:
        """List, apply, then watch, again from the last resourceVersion after each clean end.
        Returns when the periodic relist is due; raises when the round ended otherwise."""
        items, rv = self._list(r)
        count = len(items)
        self._replace(r, items, rv)
        r.last_error = ""
        if r.missing:
            r.missing = False
            log.info("%s: served now (%d objects)", r.name, count)
        while not self._stop.is_set():
            if self.config_sync_period > 0:
                left = r.last_list + self.config_sync_period - time.monotonic()
                if left <= 0:
                    log.info("%s: periodic relist (configSyncPeriod)", r.name)
                    return
            else:
                left = float("inf")
            try:
                self._watch(r, left)
            except _Refused as err:
                r.last_error = str(err)
                delay = backoff.step()
                log.warning("%s: watch refused (%s); asking again in %.1fs", r.name, err, delay)
                if backoff.wait(self._stop, delay):
                    raise _Stopped() from err
            except Exception as err:
                if self._stop.is_set():
                    raise _Stopped() from err
                raise
        raise _Stopped()

    def _get(self, r: _Resource, read_timeout: float, **params: Any) -> Any:
        """A list or watch request of ``r`` (its selectors plus ``params``), the raw response."""
        params["fieldSelector"] = r.field_selector or None
        params["labelSelector"] = r.label_selector or None
        return api_request(
            self.api,
            "GET",
            r.path,
            # the generated client's order of query parameters
            query=[(k, params[k]) for k in _QUERY_ORDER if params.get(k) is not None],
            timeout=(self.connect_timeout, read_timeout),
        )

    def _list(self, r: _Resource) -> tuple[dict[str, JSON], str]:
        """A complete list (all pages) in memory; nothing is applied before it is complete.

        The pages are fetched on a helper thread (each next request needs only the page's
        list metadata, read ahead of its items) while this one decodes them.
        """
        pages: queue.SimpleQueue[Any] = queue.SimpleQueue()
        fetcher = threading.Thread(
            target=self._fetch_pages, args=(r, pages), name=f"kubeapi-{r.name}-pages", daemon=True
        )
        fetcher.start()
        items: dict[str, JSON] = {}
        while True:
            page = pages.get()
            if isinstance(page, BaseException):
                raise page
            if page is _RESTART:
                items.clear()
                continue
            # The fetcher's reading of the list metadata decides, so both agree on the end.
            body, meta = page
            page = None  # the response's text goes as soon as its items are decoded
            for item in _list_items(body):
                # List items lack TypeMeta; give them the kind a manifest or watch event has.
                item.setdefault("kind", r.kind)
                item.setdefault("apiVersion", r.api_version)
                items[_key(item)] = _slim(item)
            body = None
            if not (meta.get("continue") or ""):
                return items, str(meta.get("resourceVersion") or "")

    def _fetch_pages(self, r: _Resource, pages: queue.SimpleQueue[Any]) -> None:
        """Put each page of a list (its text and list metadata) on ``pages``, then stop; a
        failure is put there instead, and ends the fetching.

        client-go's reflector and pager: the resourceVersion is "0" for the first list, the
        last one seen for a relist, unset after that one was unavailable; ``limit`` is sent
        unless a relist can be served by the watch cache (a resourceVersion other than "0",
        on a server that did not page the first list); continued pages carry no
        resourceVersion, and an expired continue token lists again in one piece."""
        try:
            rv = "" if r.rv_unavailable else (r.rv or "0")
            paged = self.page_size > 0 and (r.paginated or rv in ("", "0"))
            token = ""
            retried = False
            pages_put = 0
            while True:
                if not self.limiter.acquire(self._stop):
                    raise _Stopped()
                try:
                    resp = self._get(
                        r,
                        self.request_timeout,
                        limit=self.page_size if paged else None,
                        resourceVersion=None if token else (rv or None),
                        **{"continue": token or None},
                    )
                except ApiException as err:
                    if err.status == 410 and token:
                        # The snapshot of the paged list expired: start over in one piece.
                        log.info("%s: continue token expired, listing again without paging", r.name)
                        pages.put(_RESTART)
                        token, paged, rv = "", False, ""
                        continue
                    if not token and not retried and rv and _rv_unavailable(err):
                        # Too old (compacted) or too new (a lagging cache): a consistent list.
                        log.info(
                            "%s: list at resourceVersion %s failed (%s): listing the latest",
                            r.name,
                            bare(rv),
                            _describe(err),
                        )
                        r.rv_unavailable = True
                        if pages_put:
                            pages.put(_RESTART)
                        rv, paged, retried = "", self.page_size > 0, True
                        continue
                    if err.status in (403, 404) and not r.required:
                        raise _Missing(err.status, _describe(err)) from err
                    raise
                body, meta = _read_page(resp)
                token = meta.get("continue") or ""
                if rv == "0" and token:
                    r.paginated = True  # no watch cache answered: page the relists too
                pages.put((body, meta))
                pages_put += 1
                if not token:
                    r.rv_unavailable = False
                    return
        except BaseException as err:  # handed over to the decoding thread, which raises it
            pages.put(err)

    def _replace(self, r: _Resource, items: dict[str, JSON], rv: str) -> None:
        """Apply a complete list as one batch: set what is new or changed, delete what is gone.
        ``items`` is emptied on the way."""
        count = len(items)
        batch = (
            self.cluster.batch()
            if isinstance(self.cluster, GatedClusterState)
            else contextlib.nullcontext()
        )
        with batch:
            known: dict[str, str] = {}
            gone = [k for k in r.known if k not in items]
            for key in list(items):  # in the list's order: the first seen keeps a ClusterIP
                # Each raw object is let go once applied: only its parsed form stays.
                obj = items.pop(key)
                version = _rv_of(obj)
                if not version or r.known.get(key) != version:
                    self._set(r, obj)
                known[key] = version
            for key in gone:
                namespace, _, name = key.rpartition("/")
                self._delete(r, {"metadata": {"namespace": namespace, "name": name}})
            r.known = known
            r.rv = rv
            r.lists += 1
            r.last_list = time.monotonic()
        if gone:
            log.info("%s: relist removed %d objects deleted meanwhile", r.name, len(gone))
        if not r.synced.is_set():
            r.synced.set()
            log.info("%s: initial list complete (%d objects)", r.name, count)
            required = [x for x in self._resources.values() if x.required]
            if not self._synced.is_set() and all(x.synced.is_set() for x in required):
                if self._node is None:
                    log.warning(
                        "node %s not found: rules are programmed without its zone and pod CIDR",
                        self.node_name,
                    )
                # What the lists made lives on: frozen, no collector pass scans it. The
                # pause ends before the gate opens, so it never ends under a sync.
                freeze_once()
                if self._lists_pause is not None:
                    self._lists_pause.end()
                if isinstance(self.cluster, GatedClusterState):
                    self.cluster.open()
                self._synced.set()

    def _watch(self, r: _Resource, max_seconds: float) -> None:
        """One watch request, bounded by ``timeoutSeconds``; returns when it ends cleanly."""
        seconds = self.watch_timeout * (1.0 + random.random())
        timeout = max(1, int(min(seconds, max_seconds)))
        if not self.limiter.acquire(self._stop):
            raise _Stopped()
        started = time.monotonic()
        events = 0
        try:
            resp = self._get(
                r,
                timeout + max(5.0, self.connect_timeout),
                watch=True,
                resourceVersion=r.rv,
                allowWatchBookmarks=True,
                timeoutSeconds=timeout,
            )
        except ApiException as err:
            if err.status == 410:
                raise _Expired(_describe(err)) from err
            if err.status == 429:
                raise _Refused(_describe(err)) from err
            raise
        except Exception as err:
            if _connection_refused(err):
                raise _Refused(_describe(err)) from err
            raise
        r.response = resp
        r.watches += 1
        r.last_error = ""  # a watch refused before is answered now
        try:
            if self._stop.is_set():
                raise _Stopped()
            for line in _iter_lines(resp):
                if self._stop.is_set():
                    raise _Stopped()
                self._handle(r, json.loads(line))
                events += 1
        finally:
            r.response = None
            with contextlib.suppress(Exception):
                resp.release_conn()
        if events == 0 and time.monotonic() - started < 1.0:
            # client-go's: a server or proxy that closes every watch at once means a relist
            raise _WatchError("very short watch: ended in less than a second without an event")

    def _handle(self, r: _Resource, event: Mapping[str, Any]) -> None:
        typ = event.get("type")
        obj = event.get("object")
        if not isinstance(obj, dict):
            raise _WatchError(f"watch event {shown(typ)} without an object")
        if typ == "ERROR":
            code = obj.get("code")
            message = clip(f"{obj.get('reason', '')}: {obj.get('message', '')}", LOG_TEXT_LIMIT)
            if code == 410 or obj.get("reason") in ("Expired", "Gone"):
                raise _Expired(message)
            if code == 429:
                raise _Refused(f"HTTP 429 {message}")
            raise _WatchError(f"HTTP {code} {message}")
        rv = _rv_of(obj)
        if typ in ("ADDED", "MODIFIED"):
            obj.setdefault("kind", r.kind)
            obj.setdefault("apiVersion", r.api_version)
            r.known[_key(obj)] = rv
            self._set(r, _slim(obj))
        elif typ == "DELETED":
            r.known.pop(_key(obj), None)
            self._delete(r, obj)
        elif typ != "BOOKMARK":
            log.warning("%s: ignoring watch event of type %s", r.name, shown(typ))
            return
        if rv:
            r.rv = rv

    def _set(self, r: _Resource, obj: JSON) -> None:
        if r.name == SERVICES:
            self.cluster.set_service(obj)
        elif r.name == ENDPOINTSLICES:
            self.cluster.set_endpoint_slice(obj)
        elif r.name == SERVICECIDRS:
            self.cluster.set_service_cidr(obj)
        else:
            self._node_seen = True
            self._node = obj
            self.cluster.set_node(obj)

    def _delete(self, r: _Resource, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        if r.name == SERVICES:
            self.cluster.delete_service(ns, name)
        elif r.name == ENDPOINTSLICES:
            self.cluster.delete_endpoint_slice(ns, name)
        elif r.name == SERVICECIDRS:
            self.cluster.delete_service_cidr(name)
        else:
            # Upstream keeps the last node state too; health reports the node as going away.
            self._node = None
            log.warning("node %s was deleted; keeping its last labels and pod CIDRs", bare(name))
