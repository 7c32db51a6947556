"""One manifest file's documents, parsed within bounds.

A manifest folder is written by people and by tools, and kubeplex runs as root: a file must not
be able to exhaust memory, the stack, or the time of every later sync. Three bounds hold for
each file:

* **size**: at most MAX_FILE_BYTES (64 MiB; the API server takes 3 MiB per object, but one
  file may hold a ``kind: List`` of a whole cluster: 10,000 Services with 10 endpoints each are
  13 MB of JSON). A larger file is refused from its size alone, before it is read.
* **depth**: at most MAX_DEPTH (100) nested mappings and lists; Kubernetes objects need about
  ten. Deeper data would blow Python's recursion limit wherever it is compared or printed.
* **aliases**: YAML anchors and aliases may make the document at most MAX_ALIAS_EXPANSION nodes
  and characters bigger than the file's own text (a 699-byte "billion laughs" stands for
  387 million strings). A recursive alias is refused too.

libyaml (CSafeLoader) parses files without anchors as before; only a file with an ``&`` goes
through the guarded path that measures the node graph (each shared node once) before building
the Python objects.

A file without anchors is first built straight from libyaml's events (:func:`_load_plain`):
CSafeLoader spends most of its time composing a node per value and resolving each plain
scalar through Python calls (bench/manifests_dump.py measures it on an API dump). That path
takes only what it can build exactly as CSafeLoader would (strings, plain null, bool and decimal
int scalars resolved by CSafeLoader's own resolver table, mappings with simple keys, sequences,
no tags, no aliases) and hands anything else, errors included, to CSafeLoader.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import yaml
from yaml import events as _events
from yaml.resolver import Resolver as _Resolver

MAX_FILE_BYTES = 64 * 2**20
MAX_DEPTH = 100
MAX_ALIAS_EXPANSION = 1_000_000

# libyaml's parser where PyYAML was built with it: an order of magnitude faster on big folders.
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


_CONTAINERS = frozenset({dict, list})


class ManifestFileError(Exception):
    """A file that cannot be used; the message says why (and where, if it can)."""


def read_bounded(fd: int, size: int, max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of an open file whose fstat gave ``size``; refuses a file over the bound
    without reading it (and stops reading if it grew past the bound meanwhile)."""
    if size > max_bytes:
        raise ManifestFileError(_too_big(size, max_bytes))
    chunks: list[bytes] = []
    total = 0
    while chunk := os.read(fd, max(size, 1 << 16)):
        total += len(chunk)
        if total > max_bytes:
            raise ManifestFileError(_too_big(total, max_bytes))
        chunks.append(chunk)
    return b"".join(chunks)


def _too_big(size: int, max_bytes: int) -> str:
    return f"is {size} bytes, more than the {max_bytes // 2**20} MiB a manifest file may have"


def load_documents(path: str, data: bytes) -> list[Any]:
    """The documents of one file (JSON if it ends in ``.json``, else YAML), within the bounds.
    Raises ManifestFileError with a message fit for one log line."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ManifestFileError(f"not UTF-8 text: byte {err.start}") from None
    if path.endswith(".json"):
        docs = [_load_json(text)]
    elif "&" in text:  # an anchor: aliases can expand it, measure before building
        return _load_yaml_guarded(text)
    else:
        docs = _load_yaml(text)
    for doc in docs:
        check_depth(doc)
    return docs


def _load_json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ManifestFileError(f"line {err.lineno}: invalid JSON: {err.msg}") from None
    except RecursionError:  # the C scanner stops at Python's recursion limit
        raise ManifestFileError(_too_deep()) from None


def _load_yaml(text: str) -> list[Any]:
    docs = _load_plain(text)
    if docs is not None:
        return docs
    try:
        return list(yaml.load_all(text, Loader=_Loader))
    except yaml.YAMLError as err:
        raise ManifestFileError(_yaml_problem(err)) from None
    except RecursionError:
        raise ManifestFileError(_too_deep()) from None


# ------------------------------------------------------------------ YAML from libyaml's events

_CParser: Any = getattr(getattr(yaml, "_yaml", None), "CParser", None)
_SCALAR, _MAP, _SEQ, _END, _SKIP = range(5)
_EVENT_KINDS: dict[type, int] = {
    _events.ScalarEvent: _SCALAR,
    _events.MappingStartEvent: _MAP,
    _events.SequenceStartEvent: _SEQ,
    _events.MappingEndEvent: _END,
    _events.SequenceEndEvent: _END,
    _events.StreamStartEvent: _SKIP,
    _events.DocumentStartEvent: _SKIP,
    _events.DocumentEndEvent: _SKIP,
    _events.StreamEndEvent: _SKIP,
}
_STR = "tag:yaml.org,2002:str"
_BOOLS = {"yes": True, "no": False, "true": True, "false": False, "on": True, "off": False}
_DECIMAL = re.compile(r"[-+]?(?:0|[1-9][0-9]*)\Z")
_NO_KEY = object()
_MISSING = object()


class _NeedsCSafeLoader(Exception):
    """Something the event path does not build itself: CSafeLoader does it."""


def _resolve_plain_scalar(value: str) -> Any:
    """A plain scalar as CSafeLoader makes it: its Resolver's implicit table picks the tag,
    SafeConstructor's conversion for str, null, bool and decimal int (others raise
    _NeedsCSafeLoader)."""
    table = _Resolver.yaml_implicit_resolvers
    candidates = table.get(value[0] if value else "", []) + table.get(None, [])
    tag = _STR
    for candidate, pattern in candidates:
        if pattern.match(value):
            tag = candidate
            break
    if tag == _STR:
        return value
    if tag == "tag:yaml.org,2002:null":
        return None
    if tag == "tag:yaml.org,2002:bool":
        return _BOOLS[value.lower()]
    if tag == "tag:yaml.org,2002:int" and _DECIMAL.match(value):
        return int(value)
    raise _NeedsCSafeLoader(tag)


def _load_plain(text: str) -> list[Any] | None:
    """The documents of ``text`` built from libyaml's events, exactly as CSafeLoader builds
    them; None when the text holds anything this does not build (or is not valid YAML)."""
    if _CParser is None:
        return None
    parser = _CParser(text)
    try:
        return _build(parser.get_event)
    except Exception:  # _NeedsCSafeLoader, or a YAML error: CSafeLoader parses it and says so
        return None
    finally:
        parser.dispose()


def _build(next_event: Any) -> list[Any]:
    docs: list[Any] = []
    # The open container, whether it is a mapping, and its key waiting for a value (_NO_KEY:
    # none); the enclosing ones as (container, is_mapping, key) on the stack.
    current: Any = docs
    in_mapping = False
    key: Any = _NO_KEY
    stack: list[tuple[Any, bool, Any]] = []
    seen: dict[str, Any] = {}  # plain scalars resolved so far: a dump repeats most of them
    scalar_event = _events.ScalarEvent
    kinds = _EVENT_KINDS
    container: Any
    while True:
        event = next_event()
        if type(event) is scalar_event:
            if event.tag is not None or event.anchor is not None:
                raise _NeedsCSafeLoader("anchor or tag")
            value = event.value
            if event.implicit[0]:  # plain: resolved; quoted or block: a string
                got = seen.get(value, _MISSING)
                if got is _MISSING:
                    got = seen[value] = _resolve_plain_scalar(value)
                value = got
            if not in_mapping:
                current.append(value)
            elif key is _NO_KEY:
                key = value
            else:
                current[key] = value
                key = _NO_KEY
            continue
        kind = kinds.get(type(event))
        if kind is None:  # an alias
            raise _NeedsCSafeLoader(type(event).__name__)
        if kind == _SKIP:
            if type(event) is _events.StreamEndEvent:
                return docs
            continue
        if kind == _END:
            current, in_mapping, key = stack.pop()
            continue
        if event.tag is not None or event.anchor is not None:
            raise _NeedsCSafeLoader("anchor or tag")
        container = {} if kind == _MAP else []
        if not in_mapping:
            current.append(container)
        elif key is _NO_KEY:
            raise _NeedsCSafeLoader("a mapping or sequence as a key")
        else:
            current[key] = container
            key = _NO_KEY
        stack.append((current, in_mapping, key))
        current, in_mapping, key = container, kind == _MAP, _NO_KEY


def _yaml_problem(err: yaml.YAMLError) -> str:
    mark = getattr(err, "problem_mark", None)
    where = f"line {mark.line + 1}: " if mark is not None else ""
    problem = getattr(err, "problem", None) or str(err)
    return f"{where}invalid YAML: {problem}"


def _too_deep() -> str:
    return f"nested deeper than {MAX_DEPTH} levels"


def check_depth(doc: Any, limit: int = MAX_DEPTH) -> None:
    """Refuse data nested deeper than ``limit``. Level by level, without recursion; only for
    data without shared parts (JSON, YAML without anchors), where this visits each node once."""
    level = [doc] if type(doc) in _CONTAINERS else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            raise ManifestFileError(_too_deep())
        # The exact types (what the parsers build), a set lookup: twice as fast as isinstance.
        level = [
            v
            for o in level
            for v in (o.values() if type(o) is dict else o)
            if type(v) in _CONTAINERS
        ]


def _load_yaml_guarded(text: str) -> list[Any]:
    loader = _Loader(text)
    budget = len(text) + MAX_ALIAS_EXPANSION
    try:
        docs = []
        while loader.check_node():
            node = loader.get_node()
            measure(node, budget)
            docs.append(loader.construct_document(node))
        return docs
    except yaml.YAMLError as err:
        raise ManifestFileError(_yaml_problem(err)) from None
    except RecursionError:
        raise ManifestFileError(_too_deep()) from None
    finally:
        loader.dispose()


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def measure(root: yaml.Node, budget: int) -> None:
    """Refuse a composed document whose expansion (aliases followed: one unit per node and per
    character of a scalar) exceeds ``budget``, that nests deeper than MAX_DEPTH, or that
    contains itself. Each distinct node is visited once, however often it is aliased."""
    done: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded size, depth)
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            on_path.discard(key)
            kids = [done[id(c)] for c in _children(node)]
            if isinstance(node, yaml.ScalarNode):
                size, depth = 1 + len(node.value), 0
            else:
                size = 1 + sum(k[0] for k in kids)
                depth = 1 + max((k[1] for k in kids), default=0)
            if depth > MAX_DEPTH:
                raise ManifestFileError(_too_deep())
            if size > budget:
                raise ManifestFileError(
                    f"line {node.start_mark.line + 1}: aliases expand the document beyond "
                    f"{MAX_ALIAS_EXPANSION} nodes and characters more than its text"
                )
            done[key] = (size, depth)
            continue
        if key in done:
            continue
        if key in on_path:
            raise ManifestFileError(
                f"line {node.start_mark.line + 1}: recursive alias (a node that contains itself)"
            )
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in done)
