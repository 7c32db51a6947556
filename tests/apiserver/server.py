"""A small, protocol-faithful Kubernetes list/watch API server for tests.

Stdlib only (``http.server``), JSON only, loopback only. See README.md next to this file.

Semantics mirrored from upstream kube-apiserver (apimachinery / apiserver storage + cacher):

* one global, monotonically increasing resourceVersion (like an etcd revision);
* list: written as it is encoded, item by item, in chunks (kube-apiserver 1.33's
  StreamingCollectionEncodingToJSON; ``stream_lists=False`` sends it whole, with a length);
  label/field selectors, ``limit``/``continue`` consistent snapshots (continue token is
  base64url JSON ``{"v":"meta.k8s.io/v1","rv":N,"start":"<key>\\x00"}`` like upstream),
  ``remainingItemCount`` only for unfiltered lists, ``resourceVersion``/``resourceVersionMatch``
  per the "semantics for get and list" table, ListOptions validation (422 Invalid);
* watch: chunked newline-delimited JSON events, replay from a bounded per-resource history,
  ``too old resource version: N (M)`` ERROR event (410 Expired) like the watch cache,
  selector transitions (object leaving a selector -> DELETED) like ``cacheWatcher``,
  bookmarks, ``timeoutSeconds``, ``sendInitialEvents`` with the initial-events-end bookmark.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import copy
import datetime as _dt
import ipaddress
import itertools
import json
import logging
import queue
import random
import re
import select
import socket
import ssl
import struct
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast
from urllib.parse import parse_qs, urlsplit

if TYPE_CHECKING:
    import kubernetes.client

JSONDict = dict[str, Any]
DropMode = Literal["reset", "eof", "close"]
#: How :meth:`FakeApiServer.break_watches` answers every new watch.
WatchFault = Literal["expired", "garbage", "closed"]

log = logging.getLogger(__name__)

#: The server's certificate for ``tls=True``: self-signed (its own CA), for 127.0.0.1, ::1 and
#: localhost, valid until 2126; and its key. Test material only.
TLS_CERT = Path(__file__).resolve().parent / "tls.crt"
TLS_KEY = Path(__file__).resolve().parent / "tls.key"

ADDED = "ADDED"
MODIFIED = "MODIFIED"
DELETED = "DELETED"
BOOKMARK = "BOOKMARK"
ERROR = "ERROR"

INITIAL_EVENTS_END_ANNOTATION = "k8s.io/initial-events-end"
SERVER_VERSION: JSONDict = {
    "major": "1",
    "minor": "34",
    "gitVersion": "v1.34.0-kubeplex-fake",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2025-01-01T00:00:00Z",
    "goVersion": "go1.24.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}


# --------------------------------------------------------------------------------------------
# Resource types
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResourceType:
    """Static description of one served resource (what the apiserver's registry knows)."""

    group: str
    version: str
    plural: str
    singular: str
    kind: str
    namespaced: bool
    field_labels: frozenset[str] = frozenset({"metadata.name", "metadata.namespace"})
    short_names: tuple[str, ...] = ()
    status_subresource: bool = False
    allow_create_on_update: bool = False
    return_deleted_object: bool = False
    track_generation: bool = False

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """``GroupResource.String()``: ``services`` or ``endpointslices.discovery.k8s.io``."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def base_path(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    def key(self, namespace: str | None, name: str) -> str:
        return f"{namespace}/{name}" if self.namespaced else name


SERVICES = ResourceType(
    group="",
    version="v1",
    plural="services",
    singular="service",
    kind="Service",
    namespaced=True,
    field_labels=frozenset({"metadata.name", "metadata.namespace", "spec.clusterIP", "spec.type"}),
    short_names=("svc",),
    status_subresource=True,
    allow_create_on_update=True,
    return_deleted_object=True,
)
NODES = ResourceType(
    group="",
    version="v1",
    plural="nodes",
    singular="node",
    kind="Node",
    namespaced=False,
    field_labels=frozenset({"metadata.name", "metadata.namespace", "spec.unschedulable"}),
    short_names=("no",),
    status_subresource=True,
)
ENDPOINTSLICES = ResourceType(
    group="discovery.k8s.io",
    version="v1",
    plural="endpointslices",
    singular="endpointslice",
    kind="EndpointSlice",
    namespaced=True,
    track_generation=True,
)
EVENTS = ResourceType(
    group="",
    version="v1",
    plural="events",
    singular="event",
    kind="Event",
    namespaced=True,
    field_labels=frozenset(
        {
            "metadata.name",
            "metadata.namespace",
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        }
    ),
    short_names=("ev",),
    allow_create_on_update=True,
)
EVENTS_V1 = ResourceType(
    group="events.k8s.io",
    version="v1",
    plural="events",
    singular="event",
    kind="Event",
    namespaced=True,
    short_names=("ev",),
    allow_create_on_update=True,
)
SERVICECIDRS = ResourceType(
    group="networking.k8s.io",
    version="v1",
    plural="servicecidrs",
    singular="servicecidr",
    kind="ServiceCIDR",
    namespaced=False,
    status_subresource=True,
)
DEFAULT_RESOURCES: tuple[ResourceType, ...] = (
    SERVICES,
    NODES,
    ENDPOINTSLICES,
    SERVICECIDRS,
    EVENTS,
    EVENTS_V1,
)

_FIELD_ALIASES = {"source": "source.component"}
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


# --------------------------------------------------------------------------------------------
# Errors (metav1.Status)
# --------------------------------------------------------------------------------------------


class ApiError(Exception):
    """An error rendered as a ``metav1.Status`` (also raised by the Python control API)."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        details: JSONDict | None = None,
        *,
        list_meta: JSONDict | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.list_meta = list_meta or {}
        self.headers = dict(headers or {})

    def status(self) -> JSONDict:
        st: JSONDict = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": dict(self.list_meta),
            "status": "Failure",
            "message": self.message,
        }
        if self.reason:
            st["reason"] = self.reason
        if self.details is not None:
            st["details"] = self.details
        st["code"] = self.code
        return st


def _details(rt: ResourceType, name: str = "") -> JSONDict:
    d: JSONDict = {}
    if name:
        d["name"] = name
    if rt.group:
        d["group"] = rt.group
    d["kind"] = rt.plural
    return d


def not_found(rt: ResourceType, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{rt.qualified} "{name}" not found', _details(rt, name))


def already_exists(rt: ResourceType, name: str) -> ApiError:
    msg = f'{rt.qualified} "{name}" already exists'
    return ApiError(409, "AlreadyExists", msg, _details(rt, name))


def conflict(rt: ResourceType, name: str, why: str) -> ApiError:
    msg = f'Operation cannot be fulfilled on {rt.qualified} "{name}": {why}'
    return ApiError(409, "Conflict", msg, _details(rt, name))


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def expired(message: str, *, list_meta: JSONDict | None = None) -> ApiError:
    return ApiError(410, "Expired", message, list_meta=list_meta)


def invalid(kind: str, group: str, name: str, causes: list[tuple[str, str, str]]) -> ApiError:
    """``errors.NewInvalid``; causes are (field, type, detail) e.g. ("x", "Forbidden", "...")."""
    qualified = f"{kind}.{group}" if group else kind
    parts = [f"{f}: {t}: {d}" for f, t, d in causes]
    joined = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    reason_map = {
        "Forbidden": "FieldValueForbidden",
        "Required value": "FieldValueRequired",
        "Invalid value": "FieldValueInvalid",
        "Unsupported value": "FieldValueNotSupported",
    }
    details: JSONDict = {"name": name}
    if group:
        details["group"] = group
    details["kind"] = kind
    details["causes"] = [
        {"reason": reason_map.get(t, "FieldValueInvalid"), "message": f"{t}: {d}", "field": f}
        for f, t, d in causes
    ]
    return ApiError(422, "Invalid", f'{qualified} "{name}" is invalid: {joined}', details)


def too_large_resource_version(requested: int, current: int) -> ApiError:
    """``storage.NewTooLargeResourceVersionError`` (a 504 Timeout with a cause)."""
    return ApiError(
        504,
        "Timeout",
        f"Timeout: Too large resource version: {requested}, current: {current}",
        {
            "causes": [
                {"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}
            ],
            "retryAfterSeconds": 1,
        },
        headers={"Retry-After": "1"},
    )


#: Go's net/http buffers a handler's writes this much (bufferBeforeChunkingSize) and sends each
#: buffer it flushes as one chunk; kube-apiserver's streaming list encoder writes item by item,
#: so a streamed list arrives in chunks of about 2 KB (an item larger than the free buffer,
#: with nothing buffered, as a chunk of its own).
LIST_BUFFER = 2048
#: The connection's write buffer under the chunks (net/http's bufio.Writer on the conn).
CONN_BUFFER = 4096


class _GoChunkedBody:
    """A chunked body written as net/http writes one: the handler's writes through a
    LIST_BUFFER-byte bufio.Writer whose flushes are the chunks, the chunks through a
    CONN_BUFFER-byte buffer on the connection."""

    def __init__(self, send: Callable[[bytes], object]) -> None:
        self._send = send
        self._buffer = bytearray()
        self._conn = bytearray()

    def write(self, data: bytes) -> None:
        # bufio.Writer.Write: fill and flush the buffer; a large write with nothing buffered
        # goes straight through.
        size = LIST_BUFFER
        while len(data) > size - len(self._buffer):
            if not self._buffer:
                self._chunk(data)
                return
            room = size - len(self._buffer)
            self._buffer += data[:room]
            data = data[room:]
            self._chunk(bytes(self._buffer))
            self._buffer.clear()
        self._buffer += data

    def close(self) -> None:
        """The handler returned: what is buffered, the last chunk, all on the wire."""
        if self._buffer:
            self._chunk(bytes(self._buffer))
            self._buffer.clear()
        self._conn += b"0\r\n\r\n"
        self._send(bytes(self._conn))
        self._conn.clear()

    def _chunk(self, data: bytes) -> None:
        self._conn += b"%x\r\n" % len(data) + data + b"\r\n"
        if len(self._conn) >= CONN_BUFFER:
            self._send(bytes(self._conn))
            self._conn.clear()


def _list_options_invalid(causes: list[tuple[str, str, str]]) -> ApiError:
    return invalid("ListOptions", "meta.k8s.io", "", causes)


# --------------------------------------------------------------------------------------------
# Selectors
# --------------------------------------------------------------------------------------------

_LABEL_KEY = (
    r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?"
)
_LABEL_VALUE = r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_RE_NOT_EXISTS = re.compile(rf"!\s*({_LABEL_KEY})")
_RE_SET = re.compile(rf"({_LABEL_KEY})\s+(in|notin)\s*\(([^()]*)\)")
_RE_CMP = re.compile(rf"({_LABEL_KEY})\s*(==|=|!=|>|<)\s*(\S*)")
_RE_EXISTS = re.compile(rf"({_LABEL_KEY})")
_RE_VALUE = re.compile(_LABEL_VALUE)


@dataclass(frozen=True)
class LabelRequirement:
    key: str
    op: str  # "in", "notin", "exists", "!", "gt", "lt"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "in":
            return present and value in self.values
        if self.op == "notin":
            return not present or value not in self.values
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if not present or value is None:
            return False
        try:
            iv = int(value)
        except ValueError:
            return False
        bound = int(self.values[0])
        return iv > bound if self.op == "gt" else iv < bound


def _split_top_level(s: str) -> list[str]:
    out: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in s:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return out


def parse_label_selector(selector: str) -> tuple[LabelRequirement, ...]:
    """Parse ``labels.Parse`` syntax: ``a=b,c!=d,e,!f,g in (x,y),h notin (z),n>3``."""
    if not selector.strip():
        return ()
    reqs: list[LabelRequirement] = []
    for raw in _split_top_level(selector):
        term = raw.strip()
        if m := _RE_NOT_EXISTS.fullmatch(term):
            reqs.append(LabelRequirement(m.group(1), "!"))
        elif m := _RE_SET.fullmatch(term):
            values = tuple(v.strip() for v in m.group(3).split(","))
            if any(not _RE_VALUE.fullmatch(v) for v in values):
                raise bad_request(f"unable to parse requirement: invalid label value in {term!r}")
            reqs.append(LabelRequirement(m.group(1), m.group(2), values))
        elif m := _RE_CMP.fullmatch(term):
            key, op, value = m.group(1), m.group(2), m.group(3)
            if op in (">", "<"):
                if not re.fullmatch(r"-?\d+", value):
                    raise bad_request(
                        f"unable to parse requirement: for 'Gt', 'Lt' operators, the value "
                        f"must be an integer: {term!r}"
                    )
                reqs.append(LabelRequirement(key, "gt" if op == ">" else "lt", (value,)))
                continue
            if not _RE_VALUE.fullmatch(value):
                raise bad_request(f"unable to parse requirement: invalid label value: {value!r}")
            reqs.append(LabelRequirement(key, "notin" if op == "!=" else "in", (value,)))
        elif m := _RE_EXISTS.fullmatch(term):
            reqs.append(LabelRequirement(m.group(1), "exists"))
        else:
            raise bad_request(f"unable to parse requirement: found {term!r}")
    return tuple(reqs)


@dataclass(frozen=True)
class FieldRequirement:
    path: str
    value: str
    negate: bool

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return (_field_value(obj, self.path) == self.value) != self.negate


def _field_value(obj: Mapping[str, Any], path: str) -> str:
    cur: Any = obj
    for part in _FIELD_ALIASES.get(path, path).split("."):
        if not isinstance(cur, Mapping):
            return ""
        cur = cur.get(part)
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def _split_unescaped(s: str, sep: str) -> list[str]:
    out: list[str] = []
    cur: list[str] = []
    escaped = False
    for ch in s:
        if escaped:
            cur.append("\\" + ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == sep:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if escaped:
        cur.append("\\")
    out.append("".join(cur))
    return out


def _unescape_field(s: str) -> str:
    return re.sub(r"\\(.)", r"\1", s)


def parse_field_selector(selector: str, rt: ResourceType) -> tuple[FieldRequirement, ...]:
    """Parse ``fields.ParseSelector`` syntax; unknown fields -> 400 like the real server."""
    if not selector.strip():
        return ()
    reqs: list[FieldRequirement] = []
    for term in _split_unescaped(selector, ","):
        m = re.fullmatch(r"\s*([^=!\s]+)\s*(==|=|!=)(.*)", term)
        if not m:
            raise bad_request(f"invalid selector: '{selector}'; can't understand '{term}'")
        path, op, value = m.group(1), m.group(2), _unescape_field(m.group(3))
        if path not in rt.field_labels:
            raise bad_request(f"field label not supported: {path}")
        reqs.append(FieldRequirement(path, value, op == "!="))
    return tuple(reqs)


@dataclass(frozen=True)
class _Predicate:
    namespace: str | None
    labels: tuple[LabelRequirement, ...]
    fields: tuple[FieldRequirement, ...]

    @property
    def empty(self) -> bool:
        return not self.labels and not self.fields

    def matches(self, obj: Mapping[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        obj_labels = meta.get("labels") or {}
        return all(r.matches(obj_labels) for r in self.labels) and all(
            f.matches(obj) for f in self.fields
        )


# --------------------------------------------------------------------------------------------
# Patches
# --------------------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result: JSONDict = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            result.pop(k, None)
        else:
            result[k] = merge_patch(result.get(k), v)
    return result


def _pointer_parts(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise bad_request(f"invalid JSON pointer: {pointer!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in pointer[1:].split("/")]


def json_patch(doc: Any, ops: list[Any]) -> Any:
    """RFC 6902 JSON patch (add/remove/replace/move/copy/test)."""
    doc = copy.deepcopy(doc)

    def walk(parts: list[str]) -> tuple[Any, str]:
        cur = doc
        for p in parts[:-1]:
            cur = cur[int(p)] if isinstance(cur, list) else cur[p]
        return cur, parts[-1]

    def get(pointer: str) -> Any:
        cur = doc
        for p in _pointer_parts(pointer):
            cur = cur[int(p)] if isinstance(cur, list) else cur[p]
        return cur

    def add(pointer: str, value: Any) -> None:
        nonlocal doc
        parts = _pointer_parts(pointer)
        if not parts:
            doc = value
            return
        parent, last = walk(parts)
        if isinstance(parent, list):
            parent.insert(len(parent) if last == "-" else int(last), value)
        else:
            parent[last] = value

    def remove(pointer: str) -> Any:
        parent, last = walk(_pointer_parts(pointer))
        return parent.pop(int(last)) if isinstance(parent, list) else parent.pop(last)

    try:
        for op in ops:
            kind, path = op["op"], op["path"]
            if kind == "add":
                add(path, copy.deepcopy(op["value"]))
            elif kind == "remove":
                remove(path)
            elif kind == "replace":
                remove(path)
                add(path, copy.deepcopy(op["value"]))
            elif kind == "move":
                add(path, remove(op["from"]))
            elif kind == "copy":
                add(path, copy.deepcopy(get(op["from"])))
            elif kind == "test":
                if get(path) != op["value"]:
                    raise bad_request(
                        f"the server rejected our request due to an error in our "
                        f"request: testing value {path} failed"
                    )
            else:
                raise bad_request(f"Unexpected kind: {kind}")
    except (KeyError, IndexError, ValueError, TypeError) as exc:
        raise ApiError(422, "Invalid", f"the server rejected our request: {exc!r}") from exc
    return doc


# --------------------------------------------------------------------------------------------
# Store
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Event:
    type: str
    rv: int
    key: str
    obj: JSONDict  # current state (for DELETED: last state, resourceVersion = deletion rv)
    prev: JSONDict | None


@dataclass
class _Store:
    rt: ResourceType
    objects: dict[str, JSONDict] = field(default_factory=dict)
    log: deque[_Event] = field(default_factory=deque)
    # every event with rv > history_start is in `log`; watch/list at rv < history_start -> 410
    history_start: int = 0


def _with_rv(obj: JSONDict, rv: int) -> JSONDict:
    out = dict(obj)
    meta = dict(out.get("metadata") or {})
    meta["resourceVersion"] = str(rv)
    out["metadata"] = meta
    return out


def _ordered(obj: JSONDict) -> JSONDict:
    """kind, apiVersion, metadata first (the order the real server serializes in)."""
    head: JSONDict = {k: obj[k] for k in ("kind", "apiVersion", "metadata") if k in obj}
    return {**head, **{k: v for k, v in obj.items() if k not in head}}


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _strip_for_compare(obj: Mapping[str, Any]) -> JSONDict:
    out = dict(obj)
    meta = dict(out.get("metadata") or {})
    meta.pop("resourceVersion", None)
    meta.pop("managedFields", None)
    out["metadata"] = meta
    return out


# --------------------------------------------------------------------------------------------
# Request bookkeeping
# --------------------------------------------------------------------------------------------


@dataclass
class RequestRecord:
    """One request as seen by the server (``status`` is filled in once answered)."""

    method: str
    path: str
    query: dict[str, str]
    verb: str  # Kubernetes verb: get/list/watch/create/update/patch/delete/... or "" for non-API
    resource: str  # plural, "" for discovery/non-resource
    group: str
    namespace: str | None
    name: str | None
    subresource: str | None
    headers: dict[str, str]
    body: Any = None
    status: int | None = None
    time: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class RequestAttributes:
    """What an authorizer sees (like ``authorizer.Attributes``)."""

    user: str
    verb: str
    resource: str
    group: str
    subresource: str | None
    namespace: str | None
    name: str | None


Authorizer = Callable[[RequestAttributes], bool]


@dataclass
class _Failure:
    remaining: int
    code: int
    reset: bool
    retry_after: int | None
    match: Callable[[RequestRecord], bool] | None


class _Watch:
    _ids = itertools.count(1)

    def __init__(
        self,
        rt: ResourceType,
        pred: _Predicate,
        min_rv: int,
        allow_bookmarks: bool,
        queue_size: int,
    ) -> None:
        self.id = next(self._ids)
        self.rt = rt
        self.pred = pred
        self.min_rv = min_rv
        self.allow_bookmarks = allow_bookmarks
        self.queue_size = queue_size
        # unbounded at the Python level so control sentinels always fit; the bound is enforced
        # in `offer` (an overflowing watcher is terminated, like the cacher does)
        self.q: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.terminated = False
        self.sock: socket.socket | None = None

    def offer(self, ev: _Event) -> None:
        if self.terminated or ev.rv <= self.min_rv:
            return
        out = self.convert(ev)
        if out is None:
            return
        if self.q.qsize() >= self.queue_size:
            log.warning("fake apiserver: terminating unresponsive watch %d", self.id)
            self.terminated = True
            self.q.put(("drop", "close"))
            return
        self.q.put(("event", out))

    def convert(self, ev: _Event) -> JSONDict | None:
        cur = ev.type != DELETED and self.pred.matches(ev.obj)
        old = ev.prev is not None and self.pred.matches(ev.prev)
        if cur and not old:
            return {"type": ADDED, "object": ev.obj}
        if cur and old:
            return {"type": MODIFIED, "object": ev.obj}
        if old and ev.prev is not None:
            return {"type": DELETED, "object": _with_rv(ev.prev, ev.rv)}
        return None


@dataclass
class _ReqInfo:
    is_resource: bool
    verb: str = ""
    rt: ResourceType | None = None
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None
    group: str = ""
    plural: str = ""


# --------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------


class FakeApiServer:
    """In-process Kubernetes API server speaking the real list/watch protocol over HTTP.

    Typical use::

        with FakeApiServer(bookmark_interval=0.2) as srv:
            kubeconfig = srv.write_kubeconfig(tmp_path / "kubeconfig")
            srv.create("Service", {...})
            ...
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        resources: Iterable[ResourceType] = DEFAULT_RESOURCES,
        history_size: int = 1000,
        watch_queue_size: int = 1000,
        bookmark_interval: float = 60.0,
        default_watch_timeout: float | None = None,
        too_large_rv_wait: float = 3.0,
        authorizer: set[tuple[str, str]] | Authorizer | None = None,
        token: str | None = None,
        user: str = "system:kube-proxy",
        defaulting: bool = True,
        request_log_size: int = 10000,
        watch_cache: bool = True,
        stream_lists: bool = True,
        tls: bool = False,
    ) -> None:
        if host not in ("127.0.0.1", "::1", "localhost"):
            raise ValueError("the fake apiserver only listens on loopback")
        self.host = host
        self._requested_port = port
        self.history_size = history_size
        self.watch_queue_size = watch_queue_size
        self.bookmark_interval = bookmark_interval
        self.default_watch_timeout = default_watch_timeout
        self.too_large_rv_wait = too_large_rv_wait
        self.authorizer: set[tuple[str, str]] | Authorizer | None = authorizer
        self.token = token
        self.user = user
        self.defaulting = defaulting
        #: Lists at resourceVersion "0" come from the watch cache, which ignores ``limit``
        #: (upstream's cacher: computeListLimit); False serves them paged, as etcd does
        #: (``--watch-cache=false``, or a resource without one).
        self.watch_cache = watch_cache
        #: List responses go out as they are encoded (chunked), as kube-apiserver 1.33 and
        #: later write them; False: encoded whole, then sent with a Content-Length.
        self.stream_lists = stream_lists
        #: HTTPS with :data:`TLS_CERT` (its own CA, for 127.0.0.1, ::1 and localhost), as a
        #: pod's service account reaches the API server.
        self.tls = tls

        self._cond = threading.Condition(threading.RLock())
        self._rev = 1
        self._stores: dict[tuple[str, str], _Store] = {}
        for rt in resources:
            self._stores[(rt.group, rt.plural)] = _Store(rt, history_start=self._rev)
        self._watches: dict[int, _Watch] = {}
        self._requests: deque[RequestRecord] = deque(maxlen=request_log_size)
        self._failures: list[_Failure] = []
        #: (fault, resource type or None for all) set by break_watches
        self._watch_fault: tuple[WatchFault, ResourceType | None] | None = None
        self._running = threading.Event()
        self._running.set()
        self._stopping = threading.Event()
        self._conns: set[socket.socket] = set()
        self._conn_threads: set[threading.Thread] = set()
        self._conn_lock = threading.Lock()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._ip_counter = 10
        self._port_counter = 30000

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> FakeApiServer:
        if self._httpd is not None:
            return self
        self._stopping.clear()
        self._running.set()
        httpd = _HTTPServer((self.host, self._requested_port), _Handler, self)
        if self.tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(TLS_CERT, TLS_KEY)
            # The handshake is made on the connection's own thread (process_request_thread),
            # not in accept(), where a silent client would hold up every other one.
            httpd.socket = ctx.wrap_socket(
                httpd.socket, server_side=True, do_handshake_on_connect=False
            )
        self._requested_port = httpd.server_address[1]  # keep the port across stop()/start()
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fake-apiserver",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving; closes every connection. State is kept, start() again reuses the port."""
        httpd, thread = self._httpd, self._thread
        if httpd is None:
            return
        self._stopping.set()
        self._running.set()
        with self._cond:
            for w in self._watches.values():
                w.q.put(("stop", None))
            self._cond.notify_all()
        httpd.shutdown()
        httpd.server_close()
        with self._conn_lock:
            conns = list(self._conns)
            threads = list(self._conn_threads)
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + timeout
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if thread is not None:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._httpd = None
        self._thread = None

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self._requested_port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    def write_kubeconfig(
        self, path: str | Path, *, namespace: str | None = None, user: JSONDict | None = None
    ) -> Path:
        """Write a kubeconfig (JSON is valid YAML) pointing at this server; returns the path.
        ``user`` is its user entry (an auth provider, an exec plugin); by default the server's
        token."""
        if user is None:
            user = {"token": self.token} if self.token else {}
        ctx: JSONDict = {"cluster": "kubeplex-fake", "user": "kubeplex-fake"}
        cluster: JSONDict = {"server": self.url}
        if self.tls:
            cluster["certificate-authority"] = str(TLS_CERT)
        if namespace:
            ctx["namespace"] = namespace
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "kubeplex-fake", "cluster": cluster}],
            "users": [{"name": "kubeplex-fake", "user": user}],
            "contexts": [{"name": "kubeplex-fake", "context": ctx}],
            "current-context": "kubeplex-fake",
            "preferences": {},
        }
        p = Path(path)
        p.write_text(json.dumps(cfg, indent=2))
        return p

    def api_client(self) -> kubernetes.client.ApiClient:
        """A real ``kubernetes.client.ApiClient`` configured for this server (lazy import)."""
        import kubernetes.client as kc

        cfg = kc.Configuration()
        cfg.host = self.url
        if self.tls:
            cfg.ssl_ca_cert = str(TLS_CERT)
        if self.token:
            cfg.api_key = {"authorization": f"Bearer {self.token}"}
        return kc.ApiClient(cfg)

    # ---------------------------------------------------------------- control API: objects

    @property
    def resource_version(self) -> int:
        with self._cond:
            return self._rev

    def resource_type(self, kind: str) -> ResourceType:
        """Resolve ``Service``/``services``/``svc``/``endpointslices.discovery.k8s.io``."""
        k = kind.lower()
        for (group, _plural), st in self._stores.items():
            rt = st.rt
            names = {rt.kind.lower(), rt.plural, rt.singular, *rt.short_names, rt.qualified}
            if group:
                names |= {f"{rt.kind.lower()}.{group}", f"{rt.singular}.{group}"}
            if k in names and not (group == "events.k8s.io" and k in ("event", "events", "ev")):
                return rt
        raise KeyError(f"unknown resource {kind!r}")

    def create(self, kind: str, obj: Any, *, namespace: str | None = None) -> JSONDict:
        rt = self.resource_type(kind)
        body = self._to_dict(obj)
        ns = self._control_namespace(rt, body, namespace)
        return copy.deepcopy(self._create(rt, ns, body, from_api=False))

    def update(self, kind: str, obj: Any, *, namespace: str | None = None) -> JSONDict:
        """Replace an object (unconditional: metadata.resourceVersion in ``obj`` is ignored)."""
        rt = self.resource_type(kind)
        body = self._to_dict(obj)
        ns = self._control_namespace(rt, body, namespace)
        name = (body.get("metadata") or {}).get("name", "")
        return copy.deepcopy(self._update(rt, ns, name, body, from_api=False, subresource=None))

    def apply(self, kind: str, obj: Any, *, namespace: str | None = None) -> JSONDict:
        """Create or replace."""
        rt = self.resource_type(kind)
        body = self._to_dict(obj)
        ns = self._control_namespace(rt, body, namespace)
        name = (body.get("metadata") or {}).get("name", "")
        with self._cond:
            if self._store(rt).objects.get(rt.key(ns, name)) is None:
                return copy.deepcopy(self._create(rt, ns, body, from_api=False))
            return copy.deepcopy(self._update(rt, ns, name, body, from_api=False, subresource=None))

    def patch(
        self, kind: str, name: str, patch: JSONDict, *, namespace: str | None = None
    ) -> JSONDict:
        """JSON merge patch an object."""
        rt = self.resource_type(kind)
        ns = (namespace or "default") if rt.namespaced else None
        with self._cond:
            new = merge_patch(self._get(rt, ns, name), patch)
            return copy.deepcopy(self._update(rt, ns, name, new, from_api=False, subresource=None))

    def delete(
        self,
        kind: str,
        obj_or_name: Any,
        *,
        namespace: str | None = None,
        respect_finalizers: bool = False,
    ) -> JSONDict:
        """Delete an object. With ``respect_finalizers`` an object with finalizers only gets a
        deletionTimestamp (MODIFIED) like a real DELETE; otherwise it is removed at once."""
        rt = self.resource_type(kind)
        if isinstance(obj_or_name, str):
            name = obj_or_name
        else:
            meta = self._to_dict(obj_or_name).get("metadata") or {}
            name = meta.get("name", "")
            namespace = namespace or meta.get("namespace")
        ns = (namespace or "default") if rt.namespaced else None
        return copy.deepcopy(
            self._delete(rt, ns, name, preconditions=None, force=not respect_finalizers)
        )

    def get(self, kind: str, name: str, *, namespace: str | None = None) -> JSONDict:
        rt = self.resource_type(kind)
        ns = (namespace or "default") if rt.namespaced else None
        with self._cond:
            return copy.deepcopy(self._get(rt, ns, name))

    def list_objects(self, kind: str, *, namespace: str | None = None) -> list[JSONDict]:
        rt = self.resource_type(kind)
        with self._cond:
            st = self._store(rt)
            return [
                copy.deepcopy(o)
                for k, o in sorted(st.objects.items())
                if namespace is None or o["metadata"].get("namespace") == namespace
            ]

    def compact(self, resource_version: int | None = None) -> int:
        """Drop history up to ``resource_version`` (default: now) like etcd compaction + a watch
        cache that lost its window: older watches/continue tokens/exact lists get 410 Expired."""
        with self._cond:
            rv = self._rev if resource_version is None else min(resource_version, self._rev)
            for st in self._stores.values():
                while st.log and st.log[0].rv <= rv:
                    st.log.popleft()
                st.history_start = max(st.history_start, rv)
            return rv

    # ---------------------------------------------------------------- control API: faults

    def drop_watches(self, mode: DropMode = "reset", resource: str | None = None) -> int:
        """Close open watch streams. ``reset``: TCP RST; ``eof``: FIN without the terminating
        chunk (truncated body); ``close``: clean end of stream (like a server-side timeout).
        Returns how many watches were dropped."""
        rt = self.resource_type(resource) if resource else None
        n = 0
        with self._cond:
            for w in self._watches.values():
                if rt is None or w.rt == rt:
                    w.terminated = True
                    w.q.put(("drop", mode))
                    n += 1
        return n

    def break_watches(self, fault: WatchFault | None, resource: str | None = None) -> None:
        """Answer every new watch (of ``resource``, default any) badly until called with None.

        Each gets HTTP 200 and, before the end of the stream: for ``expired``, the ERROR event
        the watch cache answers a resourceVersion from before its window with (Status 410
        Expired ``too old resource version: N (M)``; a watch at "0" or none is served), as from
        a server whose window was compacted past every resourceVersion it hands out; for
        ``garbage``, a bookmark at the current revision (if allowed), then a line that is not
        JSON, as a stream corrupted on the way; for ``closed``, nothing, as from a proxy in
        front of the server that closes every watch at once."""
        rt = self.resource_type(resource) if resource else None
        with self._cond:
            self._watch_fault = None if fault is None else (fault, rt)

    def _broken_watch(self, rt: ResourceType, params: Mapping[str, str]) -> list[bytes] | None:
        """The lines break_watches answers a watch of ``rt`` with; None: serve it."""
        with self._cond:
            if self._watch_fault is None:
                return None
            fault, only = self._watch_fault
            current = self._rev
        if only is not None and only != rt:
            return None
        if fault == "closed":
            return []
        if fault == "garbage":
            lines = [b'{"type":"MODIFIED","object":{"metadata":\n']
            if params.get("allowWatchBookmarks", "").lower() in ("true", "1"):
                lines.insert(0, _event_line(_bookmark(rt, current)))
            return lines
        want = self._parse_rv(params.get("resourceVersion", "") or "0")
        if want == 0:
            return None
        gone = expired(f"too old resource version: {want} ({current + 1})")
        return [_event_line({"type": ERROR, "object": gone.status()})]

    def fail_next(
        self,
        count: int = 1,
        *,
        code: int = 500,
        reset: bool = False,
        retry_after: int | None = None,
        match: Callable[[RequestRecord], bool] | None = None,
    ) -> None:
        """Make the next ``count`` matching requests fail: a Status with ``code`` (500, 429,
        503, 504, 410...) or, with ``reset=True``, a TCP reset before any response.

        ``retry_after`` adds a ``Retry-After`` header (and details.retryAfterSeconds); note that
        urllib3 (under the kubernetes client) transparently retries 413/429/503 responses that
        carry it. ``match`` restricts which requests fail (default: any)."""
        with self._cond:
            self._failures.append(_Failure(count, code, reset, retry_after, match))

    def clear_failures(self) -> None:
        with self._cond:
            self._failures.clear()

    def pause(self) -> None:
        """New requests hang (no response) until resume(); open watches are unaffected."""
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    # ---------------------------------------------------------------- control API: inspection

    @property
    def requests(self) -> list[RequestRecord]:
        with self._cond:
            return list(self._requests)

    def clear_requests(self) -> None:
        with self._cond:
            self._requests.clear()

    def find_requests(
        self,
        verb: str | None = None,
        resource: str | None = None,
        *,
        namespace: str | None = None,
        name: str | None = None,
    ) -> list[RequestRecord]:
        return [
            r
            for r in self.requests
            if (verb is None or r.verb == verb)
            and (resource is None or r.resource == resource)
            and (namespace is None or r.namespace == namespace)
            and (name is None or r.name == name)
        ]

    def verbs_used(self) -> set[tuple[str, str]]:
        """Distinct (verb, resource) pairs seen on resource requests (incl. denied ones)."""
        return {(r.verb, r.resource) for r in self.requests if r.resource}

    def wait_for_request(
        self, predicate: Callable[[RequestRecord], bool], timeout: float = 5.0
    ) -> RequestRecord:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for r in self._requests:
                    if predicate(r):
                        return r
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("no matching request")
                self._cond.wait(left)

    def watch_count(self, resource: str | None = None) -> int:
        rt = self.resource_type(resource) if resource else None
        with self._cond:
            return sum(1 for w in self._watches.values() if rt is None or w.rt == rt)

    def wait_for_watches(
        self, count: int, resource: str | None = None, timeout: float = 5.0
    ) -> None:
        """Block until at least ``count`` watches (of ``resource``) are established."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.watch_count(resource) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{self.watch_count(resource)} watches open, wanted {count}")
                self._cond.wait(left)

    # ---------------------------------------------------------------- internals: storage

    def _store(self, rt: ResourceType) -> _Store:
        return self._stores[(rt.group, rt.plural)]

    @staticmethod
    def _to_dict(obj: Any) -> JSONDict:
        if isinstance(obj, Mapping):
            return copy.deepcopy(dict(obj))
        if hasattr(obj, "openapi_types") or hasattr(obj, "to_dict"):
            import kubernetes.client as kc

            client: Any = kc.ApiClient()
            return cast(JSONDict, client.sanitize_for_serialization(obj))
        raise TypeError(f"cannot convert {type(obj).__name__} to an object dict")

    @staticmethod
    def _control_namespace(rt: ResourceType, body: JSONDict, namespace: str | None) -> str | None:
        if not rt.namespaced:
            return None
        return namespace or (body.get("metadata") or {}).get("namespace") or "default"

    def _get(self, rt: ResourceType, ns: str | None, name: str) -> JSONDict:
        obj = self._store(rt).objects.get(rt.key(ns, name))
        if obj is None:
            raise not_found(rt, name)
        return obj

    def _commit(self, rt: ResourceType, etype: str, key: str, obj: JSONDict | None) -> JSONDict:
        """Apply one change at a new revision, log it, fan it out. Caller holds the lock."""
        st = self._store(rt)
        prev = st.objects.get(key)
        self._rev += 1
        rv = self._rev
        if etype == DELETED:
            assert prev is not None
            stored = _with_rv(prev, rv)
            del st.objects[key]
        else:
            assert obj is not None
            stored = _with_rv(obj, rv)
            st.objects[key] = stored
        ev = _Event(etype, rv, key, stored, prev)
        st.log.append(ev)
        while len(st.log) > self.history_size:
            st.history_start = st.log.popleft().rv
        for w in self._watches.values():
            if w.rt == rt:
                w.offer(ev)
        self._cond.notify_all()
        return stored

    def _prepare_new(self, rt: ResourceType, ns: str | None, body: JSONDict) -> JSONDict:
        obj = copy.deepcopy(body)
        obj["apiVersion"] = rt.group_version
        obj["kind"] = rt.kind
        meta = dict(obj.get("metadata") or {})
        if not meta.get("name"):
            if meta.get("generateName"):
                suffix = "".join(random.choice(_NAME_ALPHABET) for _ in range(5))
                meta["name"] = f"{meta['generateName']}{suffix}"
            else:
                raise invalid(
                    rt.kind,
                    rt.group,
                    "",
                    [("metadata.name", "Required value", "name or generateName is required")],
                )
        if rt.namespaced:
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _now()
        meta.pop("deletionTimestamp", None)
        meta.pop("deletionGracePeriodSeconds", None)
        meta.pop("resourceVersion", None)
        if rt.track_generation:
            meta["generation"] = 1
        obj["metadata"] = meta
        if self.defaulting:
            self._default(rt, obj, None)
        return _ordered(obj)

    def _create(
        self,
        rt: ResourceType,
        ns: str | None,
        body: JSONDict,
        *,
        from_api: bool,
        dry_run: bool = False,
    ) -> JSONDict:
        with self._cond:
            if from_api:
                meta = body.get("metadata") or {}
                if meta.get("resourceVersion"):
                    raise ApiError(
                        500,
                        "InternalError",
                        "Internal error occurred: resourceVersion should not be set on objects "
                        "to be created",
                        {
                            "causes": [
                                {
                                    "message": "resourceVersion should not be set on objects "
                                    "to be created"
                                }
                            ]
                        },
                    )
                if rt.namespaced and meta.get("namespace") not in (None, "", ns):
                    raise bad_request(
                        "the namespace of the provided object does not match the namespace "
                        "sent on the request"
                    )
            obj = self._prepare_new(rt, ns, body)
            name = obj["metadata"]["name"]
            key = rt.key(ns, name)
            if key in self._store(rt).objects:
                raise already_exists(rt, name)
            if dry_run:
                return _with_rv(obj, self._rev)
            return self._commit(rt, ADDED, key, obj)

    def _update(
        self,
        rt: ResourceType,
        ns: str | None,
        name: str,
        body: JSONDict,
        *,
        from_api: bool,
        subresource: str | None,
        dry_run: bool = False,
    ) -> JSONDict:
        with self._cond:
            st = self._store(rt)
            key = rt.key(ns, name)
            old = st.objects.get(key)
            meta_in = body.get("metadata") or {}
            if meta_in.get("name") not in (None, "", name):
                raise bad_request(
                    f"the name of the object ({meta_in.get('name')}) does not match the name on "
                    f"the URL ({name})"
                )
            if old is None:
                if not from_api or not rt.allow_create_on_update or subresource:
                    raise not_found(rt, name)
                body = dict(body)
                body["metadata"] = {**meta_in, "name": name}
                return self._create(rt, ns, body, from_api=False, dry_run=dry_run)
            if (
                from_api
                and meta_in.get("resourceVersion") not in (None, "")
                and meta_in["resourceVersion"] != old["metadata"]["resourceVersion"]
            ):
                raise conflict(
                    rt,
                    name,
                    "the object has been modified; please apply your changes to the latest "
                    "version and try again",
                )
            if from_api and rt.namespaced and meta_in.get("namespace") not in (None, "", ns):
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent on "
                    "the request"
                )
            new = copy.deepcopy(body)
            new["apiVersion"] = rt.group_version
            new["kind"] = rt.kind
            meta = dict(new.get("metadata") or {})
            old_meta = old["metadata"]
            meta["name"] = name
            if rt.namespaced:
                meta["namespace"] = ns
            else:
                meta.pop("namespace", None)
            for k in (
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
            ):
                if k in old_meta:
                    meta[k] = old_meta[k]
                else:
                    meta.pop(k, None)
            if rt.track_generation:
                meta["generation"] = old_meta.get("generation", 1)
            new["metadata"] = meta
            if from_api and rt.status_subresource:
                if subresource == "status":
                    # status subresource: only status changes
                    new = {**old, "status": new.get("status")}
                    if new["status"] is None:
                        new.pop("status")
                    meta = dict(old_meta)
                    new["metadata"] = meta
                elif "status" in old:
                    new["status"] = old["status"]
                else:
                    new.pop("status", None)
            if self.defaulting:
                self._default(rt, new, old)
            if rt.track_generation:
                a = {k: v for k, v in new.items() if k not in ("metadata", "status")}
                b = {k: v for k, v in old.items() if k not in ("metadata", "status")}
                if a != b:
                    meta["generation"] = old_meta.get("generation", 1) + 1
            new = _ordered(new)
            if _strip_for_compare(new) == _strip_for_compare(old):
                return old  # no-op update: no new revision, no event (like GuaranteedUpdate)
            if dry_run:
                return _with_rv(new, int(old_meta["resourceVersion"]))
            if meta.get("deletionTimestamp") and not meta.get("finalizers"):
                self._commit(rt, MODIFIED, key, new)
                return self._commit(rt, DELETED, key, None)
            return self._commit(rt, MODIFIED, key, new)

    def _delete(
        self,
        rt: ResourceType,
        ns: str | None,
        name: str,
        *,
        preconditions: JSONDict | None,
        force: bool = False,
        dry_run: bool = False,
    ) -> JSONDict:
        with self._cond:
            key = rt.key(ns, name)
            old = self._get(rt, ns, name)
            meta = old["metadata"]
            if preconditions:
                if preconditions.get("uid") and preconditions["uid"] != meta.get("uid"):
                    raise conflict(
                        rt,
                        name,
                        f"Precondition failed: UID in precondition: {preconditions['uid']}, "
                        f"UID in object meta: {meta.get('uid')}",
                    )
                prv = preconditions.get("resourceVersion")
                if prv and prv != meta.get("resourceVersion"):
                    raise conflict(
                        rt,
                        name,
                        f"Precondition failed: ResourceVersion in precondition: {prv}, "
                        f"ResourceVersion in object meta: {meta.get('resourceVersion')}",
                    )
            if dry_run:
                return old
            if meta.get("finalizers") and not force:
                if meta.get("deletionTimestamp"):
                    return old
                new = copy.deepcopy(old)
                new["metadata"]["deletionTimestamp"] = _now()
                new["metadata"]["deletionGracePeriodSeconds"] = 0
                return self._commit(rt, MODIFIED, key, new)
            return self._commit(rt, DELETED, key, None)

    # defaulting (a small subset of the real defaulters/allocators)

    def _default(self, rt: ResourceType, obj: JSONDict, old: JSONDict | None) -> None:
        if rt is SERVICES or (rt.group, rt.plural) == ("", "services"):
            self._default_service(obj, old)
        elif (rt.group, rt.plural) == ("discovery.k8s.io", "endpointslices"):
            for p in obj.get("ports") or []:
                if isinstance(p, dict):
                    p.setdefault("protocol", "TCP")

    def _used_service_values(self) -> tuple[set[str], set[int]]:
        ips: set[str] = set()
        ports: set[int] = set()
        for o in self._stores[("", "services")].objects.values():
            spec = o.get("spec") or {}
            ips.update(spec.get("clusterIPs") or [])
            for p in spec.get("ports") or []:
                if p.get("nodePort"):
                    ports.add(int(p["nodePort"]))
            if spec.get("healthCheckNodePort"):
                ports.add(int(spec["healthCheckNodePort"]))
        return ips, ports

    def _alloc_ip(self, used: set[str]) -> str:
        while True:
            self._ip_counter += 1
            ip = str(ipaddress.IPv4Address("10.96.0.0") + self._ip_counter)
            if ip not in used:
                used.add(ip)
                return ip

    def _alloc_port(self, used: set[int]) -> int:
        while True:
            self._port_counter += 1
            if self._port_counter > 32767:
                self._port_counter = 30000
            if self._port_counter not in used:
                used.add(self._port_counter)
                return self._port_counter

    def _default_service(self, obj: JSONDict, old: JSONDict | None) -> None:
        spec = obj.setdefault("spec", {})
        old_spec = (old or {}).get("spec") or {}
        stype = spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        used_ips, used_ports = self._used_service_values()
        if stype != "ExternalName":
            if not spec.get("clusterIP") and old_spec.get("clusterIP"):
                spec["clusterIP"] = old_spec["clusterIP"]
                spec.setdefault("clusterIPs", old_spec.get("clusterIPs"))
            if not spec.get("clusterIP"):
                spec["clusterIP"] = self._alloc_ip(used_ips)
            if not spec.get("clusterIPs"):
                spec["clusterIPs"] = [spec["clusterIP"]]
            if spec["clusterIP"] != "None":
                fam = "IPv6" if ":" in spec["clusterIP"] else "IPv4"
                spec.setdefault("ipFamilies", [fam])
                spec.setdefault("ipFamilyPolicy", "SingleStack")
            spec.setdefault("internalTrafficPolicy", "Cluster")
        old_ports = {
            (p.get("name"), p.get("port"), p.get("protocol", "TCP")): p
            for p in old_spec.get("ports") or []
        }
        for p in spec.get("ports") or []:
            p.setdefault("protocol", "TCP")
            p.setdefault("targetPort", p.get("port"))
            if stype in ("NodePort", "LoadBalancer") and not p.get("nodePort"):
                prev = old_ports.get((p.get("name"), p.get("port"), p["protocol"]))
                p["nodePort"] = (prev or {}).get("nodePort") or self._alloc_port(used_ports)
        if stype in ("NodePort", "LoadBalancer"):
            spec.setdefault("externalTrafficPolicy", "Cluster")
        if stype == "LoadBalancer":
            spec.setdefault("allocateLoadBalancerNodePorts", True)
            if spec.get("externalTrafficPolicy") == "Local" and not spec.get("healthCheckNodePort"):
                spec["healthCheckNodePort"] = old_spec.get(
                    "healthCheckNodePort"
                ) or self._alloc_port(used_ports)
        obj.setdefault("status", {"loadBalancer": {}})

    # ---------------------------------------------------------------- internals: list / watch

    def _wait_for_rv(self, rv: int) -> None:
        """Like watchCache.waitUntilFreshAndBlock: wait up to too_large_rv_wait, then 504."""
        deadline = time.monotonic() + self.too_large_rv_wait
        with self._cond:
            while self._rev < rv:
                left = deadline - time.monotonic()
                if left <= 0 or self._stopping.is_set():
                    raise too_large_resource_version(rv, self._rev)
                self._cond.wait(left)

    @staticmethod
    def _parse_rv(value: str) -> int:
        try:
            rv = int(value)
        except ValueError:
            raise bad_request(f"invalid resource version: {value!r}") from None
        if rv < 0:
            raise bad_request(f"invalid resource version: {value!r}")
        return rv

    @staticmethod
    def _snapshot(st: _Store, rv: int, current: int) -> dict[str, JSONDict]:
        if rv >= current:
            return st.objects
        objs = dict(st.objects)
        for ev in reversed(st.log):
            if ev.rv <= rv:
                break
            if ev.type == ADDED:
                objs.pop(ev.key, None)
            elif ev.prev is not None:
                objs[ev.key] = ev.prev
        return objs

    def _list(self, rt: ResourceType, ns: str | None, params: Mapping[str, str]) -> JSONDict:
        rv_param = params.get("resourceVersion", "")
        rvm = params.get("resourceVersionMatch", "")
        cont = params.get("continue", "")
        causes: list[tuple[str, str, str]] = []
        if rvm:
            if not rv_param:
                causes.append(
                    (
                        "resourceVersionMatch",
                        "Forbidden",
                        "resourceVersionMatch is forbidden unless resourceVersion is provided",
                    )
                )
            if cont:
                causes.append(
                    (
                        "resourceVersionMatch",
                        "Forbidden",
                        "resourceVersionMatch is forbidden when continue is provided",
                    )
                )
            if rvm not in ("Exact", "NotOlderThan"):
                causes.append(
                    (
                        "resourceVersionMatch",
                        "Unsupported value",
                        f'"{rvm}": supported values: "Exact", "NotOlderThan", ""',
                    )
                )
            if rvm == "Exact" and rv_param == "0":
                causes.append(
                    (
                        "resourceVersionMatch",
                        "Forbidden",
                        'resourceVersionMatch "exact" is forbidden for resourceVersion "0"',
                    )
                )
        if "sendInitialEvents" in params:
            causes.append(
                ("sendInitialEvents", "Forbidden", "sendInitialEvents is forbidden for list")
            )
        if causes:
            raise _list_options_invalid(causes)
        pred = _Predicate(
            ns,
            parse_label_selector(params.get("labelSelector", "")),
            parse_field_selector(params.get("fieldSelector", ""), rt),
        )
        try:
            limit = int(params.get("limit") or 0)
        except ValueError:
            raise bad_request(f"invalid limit: {params.get('limit')!r}") from None
        limit = max(limit, 0)
        if self.watch_cache and rv_param == "0" and not cont:
            limit = 0  # served from the watch cache: the whole list, however it was asked

        start_key = ""
        with self._cond:
            st = self._store(rt)
            current = self._rev
            if cont:
                if rv_param and rv_param != "0":
                    raise bad_request(
                        "specifying resource version is not allowed when using continue"
                    )
                start_key, token_rv = _decode_continue(cont)
                if token_rv == -1:
                    snap_rv = current
                elif token_rv < st.history_start:
                    raise expired(
                        "The provided continue parameter is too old to display a consistent list "
                        "result. You can start a new list without the continue parameter, or use "
                        "the continue token in this response to retrieve the remainder of the "
                        "results. Continuing with the provided token results in an inconsistent "
                        "list - objects that were created, modified, or deleted between the time "
                        "the first chunk was returned and now may show up in the list.",
                        list_meta={"continue": _encode_continue(start_key, -1)},
                    )
                else:
                    snap_rv = token_rv
            elif rvm == "Exact" or (not rvm and limit > 0 and rv_param not in ("", "0")):
                want = self._parse_rv(rv_param)
                if want > current:
                    self._wait_for_rv(want)
                    current = self._rev
                if want < st.history_start:
                    raise expired("The resourceVersion for the provided list is too old.")
                snap_rv = want
            else:
                if rv_param not in ("", "0"):
                    want = self._parse_rv(rv_param)
                    if want > current:
                        self._wait_for_rv(want)
                        current = self._rev
                snap_rv = current
            objs = self._snapshot(st, snap_rv, current)
            keys = sorted(k for k in objs if k >= start_key)
            items: list[JSONDict] = []
            items_last_key = ""
            matched_after = 0
            next_key: str | None = None
            for k in keys:
                o = objs[k]
                if not pred.matches(o):
                    continue
                if limit and len(items) >= limit:
                    if next_key is None:
                        next_key = items_last_key + "\x00"
                    matched_after += 1
                    if not pred.empty:
                        break
                    continue
                items.append(o)
                items_last_key = k
        meta: JSONDict = {"resourceVersion": str(snap_rv)}
        if next_key is not None:
            meta["continue"] = _encode_continue(next_key, snap_rv)
            if pred.empty:
                meta["remainingItemCount"] = matched_after
        out_items = []
        for o in items:
            item = dict(o)
            item.pop("kind", None)  # built-in list items carry no TypeMeta, like upstream
            item.pop("apiVersion", None)
            out_items.append(item)
        return {
            "kind": f"{rt.kind}List",
            "apiVersion": rt.group_version,
            "metadata": meta,
            "items": out_items,
        }

    def _open_watch(
        self, rt: ResourceType, ns: str | None, params: Mapping[str, str]
    ) -> tuple[_Watch | None, list[JSONDict]]:
        """Register a watch. Returns (watch, initial events) or (None, [ERROR event])."""
        rvm = params.get("resourceVersionMatch", "")
        sie_raw = params.get("sendInitialEvents")
        send_initial: bool | None = None if sie_raw is None else sie_raw.lower() in ("true", "1")
        causes: list[tuple[str, str, str]] = []
        if send_initial is not None and rvm != "NotOlderThan":
            causes.append(
                (
                    "resourceVersionMatch",
                    "Forbidden",
                    "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                )
            )
        if rvm:
            if send_initial is None:
                causes.append(
                    (
                        "resourceVersionMatch",
                        "Forbidden",
                        "resourceVersionMatch is forbidden for watch unless sendInitialEvents "
                        "is provided",
                    )
                )
            if rvm != "NotOlderThan":
                causes.append(
                    (
                        "resourceVersionMatch",
                        "Unsupported value",
                        f'"{rvm}": supported values: "NotOlderThan"',
                    )
                )
        if causes:
            raise _list_options_invalid(causes)
        pred = _Predicate(
            ns,
            parse_label_selector(params.get("labelSelector", "")),
            parse_field_selector(params.get("fieldSelector", ""), rt),
        )
        allow_bm = params.get("allowWatchBookmarks", "").lower() in ("true", "1")
        rv_param = params.get("resourceVersion", "")
        want = self._parse_rv(rv_param) if rv_param else 0
        if send_initial and want:
            try:
                self._wait_for_rv(want)
            except ApiError as err:
                return None, [{"type": ERROR, "object": err.status()}]
        with self._cond:
            st = self._store(rt)
            current = self._rev
            initial: list[JSONDict] = []
            if send_initial or (send_initial is None and want == 0):
                for k in sorted(st.objects):
                    o = st.objects[k]
                    if pred.matches(o):
                        initial.append({"type": ADDED, "object": o})
                start = current
                if send_initial and allow_bm:
                    initial.append(_bookmark(rt, current, {INITIAL_EVENTS_END_ANNOTATION: "true"}))
            elif want == 0:
                start = current  # sendInitialEvents=false, rv unset/0: start at "now"
            else:
                if want < st.history_start:
                    gone = expired(f"too old resource version: {want} ({st.history_start})")
                    return None, [{"type": ERROR, "object": gone.status()}]
                start = want
                w_tmp = _Watch(rt, pred, want, allow_bm, self.watch_queue_size)
                for ev in st.log:
                    if ev.rv > want and (c := w_tmp.convert(ev)) is not None:
                        initial.append(c)
            w = _Watch(rt, pred, start, allow_bm, self.watch_queue_size)
            self._watches[w.id] = w
            self._cond.notify_all()
            return w, initial

    def _close_watch(self, w: _Watch) -> None:
        with self._cond:
            self._watches.pop(w.id, None)
            self._cond.notify_all()

    def _bookmark_rv(self, w: _Watch) -> int | None:
        """Current revision if no event is pending for ``w`` (so the bookmark never overtakes)."""
        with self._cond:
            if not w.q.empty():
                return None
            return max(self._rev, w.min_rv)

    # ---------------------------------------------------------------- internals: requests

    def _record(self, rec: RequestRecord) -> None:
        with self._cond:
            self._requests.append(rec)
            self._cond.notify_all()

    def _take_failure(self, rec: RequestRecord) -> _Failure | None:
        with self._cond:
            for f in self._failures:
                if f.remaining > 0 and (f.match is None or f.match(rec)):
                    f.remaining -= 1
                    if f.remaining == 0:
                        self._failures.remove(f)
                    return f
            return None

    def _authorized(self, attrs: RequestAttributes) -> bool:
        authz = self.authorizer
        if authz is None:
            return True
        if callable(authz):
            return authz(attrs)
        res = attrs.resource + (f"/{attrs.subresource}" if attrs.subresource else "")
        candidates = {res, f"{res}.{attrs.group}" if attrs.group else res, "*"}
        if attrs.group:
            candidates.add(f"{attrs.resource}.{attrs.group}")
        return any((v, r) in authz for v in (attrs.verb, "*") for r in candidates)


def _event_line(ev: JSONDict) -> bytes:
    """A watch event as the server writes it: compact JSON, one line."""
    return json.dumps(ev, separators=(",", ":")).encode() + b"\n"


def _bookmark(rt: ResourceType, rv: int, annotations: Mapping[str, str] | None = None) -> JSONDict:
    meta: JSONDict = {"resourceVersion": str(rv)}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {
        "type": BOOKMARK,
        "object": {"kind": rt.kind, "apiVersion": rt.group_version, "metadata": meta},
    }


def _encode_continue(start_key: str, rv: int) -> str:
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": start_key}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode_continue(token: str) -> tuple[str, int]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = json.loads(raw)
    except (binascii.Error, ValueError) as exc:
        raise bad_request(f"continue key is not valid: {exc}") from None
    if not isinstance(data, dict) or data.get("v") != "meta.k8s.io/v1":
        raise bad_request(
            "continue key is not valid: server does not recognize this encoded version"
        )
    rv, start = data.get("rv"), data.get("start")
    if not isinstance(rv, int) or rv == 0:
        raise bad_request(
            "continue key is not valid: incorrect encoded start resourceVersion "
            "(version meta.k8s.io/v1)"
        )
    if not isinstance(start, str) or not start:
        raise bad_request(
            "continue key is not valid: encoded start key empty (version meta.k8s.io/v1)"
        )
    return start, rv


# --------------------------------------------------------------------------------------------
# HTTP layer
# --------------------------------------------------------------------------------------------


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    #: As Go's listeners: the kernel's largest backlog (socketserver's 5 drops the SYNs of a
    #: burst of connections, each then retried a second later).
    request_queue_size = socket.SOMAXCONN

    def __init__(
        self, addr: tuple[str, int], handler: type[BaseHTTPRequestHandler], api: FakeApiServer
    ) -> None:
        self.api = api
        if ":" in addr[0]:
            self.address_family = socket.AF_INET6
        super().__init__(addr, handler)

    def get_request(self) -> tuple[Any, Any]:
        request, client_address = super().get_request()
        # As Go sets on every TCP connection: a reply's headers and body, written apart, are
        # not held back for the ACK the client delays (40 ms a request).
        request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return request, client_address

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        api = self.api
        with api._conn_lock:
            api._conns.add(request)
            api._conn_threads.add(threading.current_thread())
        try:
            if isinstance(request, ssl.SSLSocket):
                try:
                    request.do_handshake()
                except OSError:  # (ssl.SSLError is one)
                    self.shutdown_request(request)
                    return
            super().process_request_thread(request, client_address)
        finally:
            with api._conn_lock:
                api._conns.discard(request)
                api._conn_threads.discard(threading.current_thread())

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("fake apiserver: error handling request from %s", client_address, exc_info=True)


_JSON_TYPES = ("application/json", "application/*", "*/*")
_PATCH_TYPES = (
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
)


def _accepts_json(accept: str | None) -> bool:
    if not accept or not accept.strip():
        return True
    for part in accept.split(","):
        fields_ = [p.strip() for p in part.split(";")]
        mt = fields_[0].lower()
        params = dict(p.split("=", 1) for p in fields_[1:] if "=" in p)
        if params.get("q", "1").strip() in ("0", "0.0", "0.00", "0.000"):
            continue
        if "as" in params:  # Table / PartialObjectMetadata conversions: not supported here
            continue
        if mt in _JSON_TYPES:
            return True
    return False


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 300  # idle keep-alive connections are closed after this
    server_version = "kubeplex-fake-apiserver/1.0"
    sys_version = ""
    server: _HTTPServer

    # quiet
    def log_message(self, format: str, *args: Any) -> None:
        log.debug("fake apiserver: " + format, *args)

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def do_PUT(self) -> None:
        self._handle()

    def do_PATCH(self) -> None:
        self._handle()

    def do_DELETE(self) -> None:
        self._handle()

    # ------------------------------------------------------------ plumbing

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks: list[bytes] = []
            while True:
                line = self.rfile.readline()
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send_bytes(
        self, code: int, data: bytes, content_type: str, headers: Mapping[str, str] | None = None
    ) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache, private")
        self.send_header("Audit-Id", str(uuid.uuid4()))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _send_json(self, code: int, obj: Any, headers: Mapping[str, str] | None = None) -> None:
        data = json.dumps(obj, separators=(",", ":")).encode()
        self._set_status(code)
        self._send_bytes(code, data, "application/json", headers)

    def _set_status(self, code: int) -> None:
        # recorded before the response is written, so a test that saw the response sees it
        if self._rec is not None:
            with self.server.api._cond:
                self._rec.status = code
                self.server.api._cond.notify_all()

    def _send_error(self, err: ApiError) -> None:
        self._send_json(err.code, err.status(), err.headers)

    def _reset(self) -> None:
        sock = self.connection
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        try:
            self.rfile.close()
        finally:
            sock.close()

    # ------------------------------------------------------------ request routing

    def _parse_path(self, path: str) -> _ReqInfo:
        api = self.server.api
        parts = [p for p in path.split("/") if p]
        if len(parts) >= 2 and parts[0] == "api":
            group, version, rest = "", parts[1], parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return _ReqInfo(is_resource=False)
        if not rest:
            return _ReqInfo(is_resource=False)
        watch_prefix = False
        if rest[0] == "watch":
            watch_prefix, rest = True, rest[1:]
        ns: str | None = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            ns, rest = rest[1], rest[2:]
        if not rest:
            return _ReqInfo(is_resource=False)
        plural = rest[0]
        name = rest[1] if len(rest) >= 2 else None
        sub = "/".join(rest[2:]) if len(rest) >= 3 else None
        st = api._stores.get((group, plural))
        rt = st.rt if st is not None and st.rt.version == version else None
        method = self.command
        query = parse_qs(urlsplit(self.path).query)
        watch_param = (query.get("watch") or [""])[0].lower() in ("true", "1")
        if method == "GET":
            verb = "watch" if watch_prefix or watch_param else ("get" if name else "list")
        elif method == "POST":
            verb = "create"
        elif method == "PUT":
            verb = "update"
        elif method == "PATCH":
            verb = "patch"
        elif method == "DELETE":
            verb = "delete" if name else "deletecollection"
        else:
            verb = method.lower()
        return _ReqInfo(True, verb, rt, ns, name, sub, group, plural)

    def _handle(self) -> None:
        self._rec: RequestRecord | None = None
        api = self.server.api
        split = urlsplit(self.path)
        path = split.path.rstrip("/") or "/"
        params = {k: v[0] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        try:
            raw_body = self._read_body()
        except (OSError, ValueError):
            self.close_connection = True
            return
        info = self._parse_path(path)
        body: Any = None
        if raw_body:
            try:
                body = json.loads(raw_body)
            except ValueError:
                body = raw_body.decode("utf-8", "replace")
        hdrs = {k.lower(): v for k, v in self.headers.items() if k.lower() != "authorization"}
        if "Authorization" in self.headers:
            hdrs["authorization"] = "<redacted>"
        rec = RequestRecord(
            method=self.command,
            path=path,
            query=params,
            verb=info.verb,
            resource=info.plural,
            group=info.group,
            namespace=info.namespace,
            name=info.name,
            subresource=info.subresource,
            headers=hdrs,
            body=body,
        )
        self._rec = rec
        api._record(rec)

        while not api._running.wait(0.05):
            if api._stopping.is_set():
                self.close_connection = True
                return
        if api._stopping.is_set():
            self.close_connection = True
            return

        try:
            failure = api._take_failure(rec)
            if failure is not None:
                if failure.reset:
                    self._set_status(0)
                    self._reset()
                    return
                raise _injected_error(failure.code, failure.retry_after)
            if api.token is not None:
                # The scheme is case-insensitive, as the real bearer token authenticator has
                # it (a pod's service account token is sent as "bearer ...").
                scheme, _, token = self.headers.get("Authorization", "").partition(" ")
                if scheme.lower() != "bearer" or token != api.token:
                    raise ApiError(401, "Unauthorized", "Unauthorized")
            if not info.is_resource:
                self._serve_nonresource(path)
                return
            self._serve_resource(info, params, body, raw_body)
        except ApiError as err:
            self._send_error(err)
        except OSError:
            self.close_connection = True

    def _serve_nonresource(self, path: str) -> None:
        api = self.server.api
        if path in ("/healthz", "/livez", "/readyz"):
            self._set_status(200)
            self._send_bytes(200, b"ok", "text/plain; charset=utf-8")
            return
        if self.command != "GET":
            raise ApiError(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            )
        if not _accepts_json(self.headers.get("Accept")):
            raise _not_acceptable()
        rts = [st.rt for st in api._stores.values()]
        if path == "/version":
            self._send_json(200, SERVER_VERSION)
        elif path == "/api":
            self._send_json(
                200,
                {
                    "kind": "APIVersions",
                    "versions": ["v1"],
                    "serverAddressByClientCIDRs": [
                        {"clientCIDR": "0.0.0.0/0", "serverAddress": f"{api.host}:{api.port}"}
                    ],
                },
            )
        elif path == "/apis":
            groups: dict[str, list[str]] = {}
            for rt in rts:
                if rt.group:
                    groups.setdefault(rt.group, [])
                    if rt.version not in groups[rt.group]:
                        groups[rt.group].append(rt.version)
            self._send_json(
                200,
                {
                    "kind": "APIGroupList",
                    "apiVersion": "v1",
                    "groups": [_api_group(g, vs) for g, vs in sorted(groups.items())],
                },
            )
        elif (m := re.fullmatch(r"/apis/([^/]+)", path)) and any(
            rt.group == m.group(1) for rt in rts
        ):
            g = m.group(1)
            vs = sorted({rt.version for rt in rts if rt.group == g})
            self._send_json(200, {"kind": "APIGroup", "apiVersion": "v1", **_api_group(g, vs)})
        elif (m := re.fullmatch(r"/api/([^/]+)|/apis/([^/]+)/([^/]+)", path)) and any(
            (rt.group, rt.version) == ((m.group(2) or ""), (m.group(1) or m.group(3))) for rt in rts
        ):
            group = m.group(2) or ""
            version = m.group(1) or m.group(3)
            resources: list[JSONDict] = []
            for rt in rts:
                if (rt.group, rt.version) != (group, version):
                    continue
                entry: JSONDict = {
                    "name": rt.plural,
                    "singularName": rt.singular,
                    "namespaced": rt.namespaced,
                    "kind": rt.kind,
                    "verbs": [
                        "create",
                        "delete",
                        "deletecollection",
                        "get",
                        "list",
                        "patch",
                        "update",
                        "watch",
                    ],
                }
                if rt.short_names:
                    entry["shortNames"] = list(rt.short_names)
                resources.append(entry)
                if rt.status_subresource:
                    resources.append(
                        {
                            "name": f"{rt.plural}/status",
                            "singularName": "",
                            "namespaced": rt.namespaced,
                            "kind": rt.kind,
                            "verbs": ["get", "patch", "update"],
                        }
                    )
            self._send_json(
                200,
                {
                    "kind": "APIResourceList",
                    "apiVersion": "v1",
                    "groupVersion": f"{group}/{version}" if group else version,
                    "resources": resources,
                },
            )
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})

    def _serve_resource(
        self, info: _ReqInfo, params: dict[str, str], body: Any, raw_body: bytes
    ) -> None:
        api = self.server.api
        rt = info.rt
        attrs = RequestAttributes(
            user=api.user,
            verb=info.verb,
            resource=info.plural,
            group=info.group,
            subresource=info.subresource,
            namespace=info.namespace,
            name=info.name,
        )
        if not api._authorized(attrs):
            raise _forbidden(attrs)
        if rt is None or (rt.namespaced is False and info.namespace is not None):
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        if info.subresource and not (info.subresource == "status" and rt.status_subresource):
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        if (
            rt.namespaced
            and info.verb in ("create", "update", "patch", "delete", "get")
            and (info.namespace is None)
        ):
            if info.verb == "create":
                raise ApiError(
                    405,
                    "MethodNotAllowed",
                    "the server does not allow this method on the requested resource",
                )
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        if not _accepts_json(self.headers.get("Accept")):
            raise _not_acceptable()
        ns = info.namespace
        dry_run = "dryRun" in params
        verb = info.verb
        if verb == "watch":
            if info.name:
                fs = params.get("fieldSelector", "")
                params = dict(params)
                params["fieldSelector"] = (fs + "," if fs else "") + f"metadata.name={info.name}"
            self._serve_watch(rt, ns, params)
        elif verb == "list":
            listed = api._list(rt, ns, params)
            if api.stream_lists:
                self._send_list_streamed(listed)
            else:
                self._send_json(200, listed)
        elif verb == "get":
            assert info.name is not None
            rv_param = params.get("resourceVersion", "")
            if rv_param not in ("", "0"):
                want = api._parse_rv(rv_param)
                api._wait_for_rv(want)
            with api._cond:
                self._send_json(200, api._get(rt, ns, info.name))
        elif verb == "create":
            if info.name:
                raise ApiError(
                    405,
                    "MethodNotAllowed",
                    "the server does not allow this method on the requested resource",
                )
            obj = self._object_body(body, raw_body, rt)
            self._send_json(201, api._create(rt, ns, obj, from_api=True, dry_run=dry_run))
        elif verb == "update":
            assert info.name is not None
            obj = self._object_body(body, raw_body, rt)
            with api._cond:
                existed = rt.key(ns, info.name) in api._store(rt).objects
                out = api._update(
                    rt,
                    ns,
                    info.name,
                    obj,
                    from_api=True,
                    subresource=info.subresource,
                    dry_run=dry_run,
                )
            self._send_json(200 if existed else 201, out)
        elif verb == "patch":
            assert info.name is not None
            self._serve_patch(rt, ns, info.name, info.subresource, body, raw_body, dry_run)
        elif verb == "delete":
            assert info.name is not None
            opts = body if isinstance(body, dict) else {}
            out = api._delete(
                rt, ns, info.name, preconditions=opts.get("preconditions"), dry_run=dry_run
            )
            if rt.return_deleted_object or out["metadata"].get("deletionTimestamp"):
                self._send_json(200, out)
            else:
                status: JSONDict = {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Success",
                    "details": {**_details(rt, info.name), "uid": out["metadata"].get("uid")},
                }
                self._send_json(200, status)
        elif verb == "deletecollection":
            listed = api._list(
                rt, ns, {k: v for k, v in params.items() if k in ("labelSelector", "fieldSelector")}
            )
            deleted = []
            for item in listed["items"]:
                m = item["metadata"]
                with contextlib.suppress(ApiError):
                    deleted.append(
                        api._delete(
                            rt, m.get("namespace"), m["name"], preconditions=None, dry_run=dry_run
                        )
                    )
            listed["items"] = deleted
            listed["metadata"] = {"resourceVersion": str(api.resource_version)}
            self._send_json(200, listed)
        else:
            raise ApiError(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            )

    def _object_body(self, body: Any, raw_body: bytes, rt: ResourceType) -> JSONDict:
        ctype = (self.headers.get("Content-Type") or "application/json").split(";")[0].strip()
        if ctype.lower() not in ("application/json", ""):
            raise ApiError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types "
                "include: application/json",
            )
        if not isinstance(body, dict):
            raise bad_request("the object provided is unrecognized (must be a JSON object)")
        api_version = body.get("apiVersion")
        if api_version and api_version != rt.group_version:
            raise bad_request(
                f"the API version in the data ({api_version}) does not match the expected API "
                f"version ({rt.group_version})"
            )
        kind = body.get("kind")
        if kind and kind != rt.kind:
            raise bad_request(
                f"the kind in the data ({kind}) does not match the expected kind ({rt.kind})"
            )
        return body

    def _serve_patch(
        self,
        rt: ResourceType,
        ns: str | None,
        name: str,
        sub: str | None,
        body: Any,
        raw_body: bytes,
        dry_run: bool,
    ) -> None:
        api = self.server.api
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if ctype not in _PATCH_TYPES:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - accepted media types "
                f"include: {', '.join(_PATCH_TYPES)}",
            )
        if isinstance(body, str):
            raise bad_request(f"error decoding patch: {body[:80]!r} is not valid JSON")
        with api._cond:
            cur = api._store(rt).objects.get(rt.key(ns, name))
            if cur is None:
                if ctype == "application/apply-patch+yaml" and isinstance(body, dict):
                    obj = dict(body)
                    obj["metadata"] = {**(obj.get("metadata") or {}), "name": name}
                    self._send_json(201, api._create(rt, ns, obj, from_api=True, dry_run=dry_run))
                    return
                raise not_found(rt, name)
            if ctype == "application/json-patch+json":
                if not isinstance(body, list):
                    raise bad_request("json patch must be a list of operations")
                new = json_patch(cur, body)
            else:
                if not isinstance(body, dict):
                    raise bad_request("patch body must be a JSON object")
                new = merge_patch(cur, body)
            if not isinstance(new, dict):
                raise ApiError(422, "Invalid", "patched object is not an object")
            meta = dict(new.get("metadata") or {})
            # a patch carrying metadata.resourceVersion is a precondition; otherwise it applies
            # to the current object
            if (body if isinstance(body, dict) else {}).get("metadata", {}).get(
                "resourceVersion"
            ) is None:
                meta["resourceVersion"] = cur["metadata"]["resourceVersion"]
            new["metadata"] = meta
            out = api._update(rt, ns, name, new, from_api=True, subresource=sub, dry_run=dry_run)
        self._send_json(200, out)

    # ------------------------------------------------------------ watch

    def _send_list_streamed(self, listed: JSONDict) -> None:
        """A list as upstream's streaming encoder writes it: kind, apiVersion and metadata
        first, then the items one write each, in chunks as Go's server cuts them."""
        self._start_chunked()
        body = _GoChunkedBody(self.wfile.write)
        head = {k: v for k, v in listed.items() if k != "items"}
        body.write(json.dumps(head, separators=(",", ":"))[:-1].encode() + b',"items":[')
        for i, item in enumerate(listed["items"]):
            if i:
                body.write(b",")
            body.write(json.dumps(item, separators=(",", ":")).encode())
        body.write(b"]}")
        body.close()

    def _start_chunked(self) -> None:
        """A 200 whose JSON body follows in chunks (a streamed list, a watch)."""
        self._set_status(200)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.send_header("Audit-Id", str(uuid.uuid4()))
        self.end_headers()

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

    def _write_event(self, ev: JSONDict) -> None:
        self._write_chunk(_event_line(ev))

    def _client_gone(self) -> bool:
        try:
            r, _, _ = select.select([self.connection], [], [], 0)
            if r:
                # The TCP stream's own bytes (under TLS too): nothing left means the client
                # closed it.
                return bool(socket.socket.recv(self.connection, 1, socket.MSG_PEEK) == b"")
        except (OSError, ValueError):
            return True
        return False

    def _serve_watch(self, rt: ResourceType, ns: str | None, params: dict[str, str]) -> None:
        api = self.server.api
        timeout: float | None = api.default_watch_timeout
        if params.get("timeoutSeconds"):
            try:
                timeout = float(params["timeoutSeconds"])
            except ValueError:
                raise bad_request("invalid timeoutSeconds") from None
        broken = api._broken_watch(rt, params)
        if broken is not None:
            self._start_chunked()
            for line in broken:
                self._write_chunk(line)
            self._write_chunk(b"")
            return
        w, initial = api._open_watch(rt, ns, params)
        self._start_chunked()
        # A watch that ends with its last chunk leaves the connection open for the next
        # request, as Go's server does; any other end (client gone, reset, EOF) closes it.
        self.close_connection = True
        if w is None:
            for ev in initial:
                self._write_event(ev)
            self._write_chunk(b"")
            self.close_connection = False
            return
        w.sock = self.connection
        try:
            self.close_connection = not self._watch_loop(api, w, initial, timeout)
        finally:
            api._close_watch(w)

    def _watch_loop(
        self, api: FakeApiServer, w: _Watch, initial: list[JSONDict], timeout: float | None
    ) -> bool:
        """Serve the watch; whether it ended cleanly, with its last chunk written."""
        for ev in initial:
            self._write_event(ev)
        start = time.monotonic()
        deadline = start + timeout if timeout is not None else None
        next_bm = start + api.bookmark_interval
        while True:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                if w.allow_bookmarks and (rv := api._bookmark_rv(w)) is not None:
                    self._write_event(_bookmark(w.rt, rv))
                self._write_chunk(b"")
                return True
            wait = 0.25
            if deadline is not None:
                wait = min(wait, deadline - now)
            if w.allow_bookmarks:
                wait = min(wait, max(0.0, next_bm - now))
            try:
                kind, payload = w.q.get(timeout=max(wait, 0.001))
            except queue.Empty:
                if w.allow_bookmarks and time.monotonic() >= next_bm:
                    rv = api._bookmark_rv(w)
                    if rv is not None:
                        self._write_event(_bookmark(w.rt, rv))
                    next_bm = time.monotonic() + api.bookmark_interval
                elif self._client_gone():
                    return False
                continue
            if kind == "event":
                self._write_event(payload)
            elif kind == "drop":
                mode = cast(str, payload)
                if mode == "close":
                    self._write_chunk(b"")
                    return True
                if mode == "eof":
                    with contextlib.suppress(OSError):
                        self.connection.shutdown(socket.SHUT_RDWR)
                else:
                    self._reset()
                return False
            else:  # stop
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)
                return False


def _api_group(group: str, versions: list[str]) -> JSONDict:
    return {
        "name": group,
        "versions": [{"groupVersion": f"{group}/{v}", "version": v} for v in versions],
        "preferredVersion": {"groupVersion": f"{group}/{versions[0]}", "version": versions[0]},
    }


def _not_acceptable() -> ApiError:
    return ApiError(
        406, "NotAcceptable", "only the following media types are accepted: application/json"
    )


def _forbidden(a: RequestAttributes) -> ApiError:
    res = a.resource + (f"/{a.subresource}" if a.subresource else "")
    qualified = f"{a.resource}.{a.group}" if a.group else a.resource
    scope = f'in the namespace "{a.namespace}"' if a.namespace else "at the cluster scope"
    why = f'User "{a.user}" cannot {a.verb} resource "{res}" in API group "{a.group}" {scope}'
    head = f'{qualified} "{a.name}"' if a.name else qualified
    details: JSONDict = {}
    if a.name:
        details["name"] = a.name
    if a.group:
        details["group"] = a.group
    details["kind"] = a.resource
    return ApiError(403, "Forbidden", f"{head} is forbidden: {why}", details)


def _injected_error(code: int, retry_after: int | None) -> ApiError:
    reasons = {
        400: "BadRequest",
        401: "Unauthorized",
        403: "Forbidden",
        404: "NotFound",
        409: "Conflict",
        410: "Expired",
        429: "TooManyRequests",
        503: "ServiceUnavailable",
        504: "Timeout",
    }
    reason = reasons.get(code, "InternalError")
    message = {
        429: "Too many requests, please try again later.",
        503: "the server is currently unable to handle the request",
        504: "Timeout: request did not complete within the allowed duration",
        500: "Internal error occurred: injected failure",
    }.get(code, f"injected failure ({code})")
    details: JSONDict | None = (
        {"causes": [{"message": "injected failure"}]} if code == 500 else None
    )
    headers: dict[str, str] = {}
    if retry_after is not None:
        details = {**(details or {}), "retryAfterSeconds": retry_after}
        headers["Retry-After"] = str(retry_after)
    return ApiError(code, reason, message, details, headers=headers)
