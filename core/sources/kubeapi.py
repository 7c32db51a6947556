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
(:mod:`kubeplex.core.sources.token_bucket`) in front of every list and watch request, which
the Python client does not have on its own.

Beside this module, each in its own: the gated cluster state
(:mod:`kubeplex.core.sources.gated_cluster`), the event recorder
(:mod:`kubeplex.core.sources.event_recorder`), the list decoder
(:mod:`kubeplex.core.sources.list_decoder`), what a failed request means
(:mod:`kubeplex.core.sources.api_errors`) and the relist backoff
(:mod:`kubeplex.core.sources.reflector_backoff`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubeplex.core.config.kubeproxy import KubeProxyConfiguration
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.errors import bare, clip, shown
from kubeplex.core.model.types import IPFamily
from kubeplex.core.sources.api_errors import (
    LOG_TEXT_LIMIT,
    connection_refused,
    describe_failure,
    resource_version_unavailable,
)
from kubeplex.core.sources.event_recorder import EventRecorder
from kubeplex.core.sources.gated_cluster import GatedClusterState
from kubeplex.core.sources.kubeclient import (
    ApiException,
    ApiTransport,
    api_request,
    make_api_client,
)
from kubeplex.core.sources.list_decoder import list_items, read_page
from kubeplex.core.sources.reflector_backoff import ReflectorBackoff
from kubeplex.core.sources.token_bucket import TokenBucket
from kubeplex.core.startup.collector import Pause, freeze_once

log = logging.getLogger(__name__)

JSON = dict[str, Any]

#: Upstream kube-proxy's informer selector for Services and EndpointSlices
#: (``!service.kubernetes.io/service-proxy-name`` and ``!service.kubernetes.io/headless``, as
#: ``labels.Selector.String()`` prints them: sorted by key).
PROXY_LABEL_SELECTOR = "!service.kubernetes.io/headless,!service.kubernetes.io/service-proxy-name"

PROTOBUF = "application/vnd.kubernetes.protobuf"

SERVICES = "services"
ENDPOINTSLICES = "endpointslices"
NODES = "nodes"
SERVICECIDRS = "servicecidrs"
RESOURCES = (SERVICES, ENDPOINTSLICES, NODES, SERVICECIDRS)


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


def drop_unread_fields(obj: JSON) -> JSON:
    """``obj`` without what no part of kubeplex reads and an API server adds to every object
    (client-go's TransformStripManagedFields, and the endpoints' pod references): a cluster's
    objects take much less memory (bench/cold_start.py's rss)."""
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
                r.last_error = describe_failure(err)
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
            for item in list_items(body):
                # List items lack TypeMeta; give them the kind a manifest or watch event has.
                item.setdefault("kind", r.kind)
                item.setdefault("apiVersion", r.api_version)
                items[_key(item)] = drop_unread_fields(item)
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
                    if not token and not retried and rv and resource_version_unavailable(err):
                        # Too old (compacted) or too new (a lagging cache): a consistent list.
                        log.info(
                            "%s: list at resourceVersion %s failed (%s): listing the latest",
                            r.name,
                            bare(rv),
                            describe_failure(err),
                        )
                        r.rv_unavailable = True
                        if pages_put:
                            pages.put(_RESTART)
                        rv, paged, retried = "", self.page_size > 0, True
                        continue
                    if err.status in (403, 404) and not r.required:
                        raise _Missing(err.status, describe_failure(err)) from err
                    raise
                body, meta = read_page(resp)
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
                raise _Expired(describe_failure(err)) from err
            if err.status == 429:
                raise _Refused(describe_failure(err)) from err
            raise
        except Exception as err:
            if connection_refused(err):
                raise _Refused(describe_failure(err)) from err
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
            self._set(r, drop_unread_fields(obj))
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
