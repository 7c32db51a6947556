"""Cluster state from a folder (or file) of YAML/JSON manifests: the embedded default source.

Services, EndpointSlices, Nodes and ServiceCIDRs (also inside ``kind: List``), multi-document
files allowed; other kinds are ignored. The folder is polled for changes, and only the difference
to what was loaded before is fed to the trackers, exactly as watch events would be.

What the folder says is followed, what it fails to say is not taken as a deletion:

* A change is applied once the folder has looked the same for ``settle_polls`` polls in a row
  (0.5 s to 1 s by default), so a file caught mid-write is never applied half. The first load
  is immediate. A folder that never goes quiet (a writer rewriting a file every 200 ms) would
  never be followed: after ``max_wait_polls`` polls (5 s) of waiting it is applied as it is.
* A folder, subfolder or file that cannot be read (no permission, vanished mid-walk, the root
  removed) keeps the objects it had; that is logged once, and followed again once readable.
  Like kube-proxy cut off from its API server, the rules stay as they were.
* A file truncated to zero bytes is taken as one being rewritten (``>`` in a shell, a tool
  that truncates, then writes): its objects stay until it has been empty for
  ``empty_grace_polls`` polls (10 s by default); a file emptied on purpose then loses them.
* A file that cannot be used (invalid YAML, a bound of manifest_loader broken, anything that
  raises) keeps its last good objects; one error names the file. Every removal is logged with
  the file the object came from.
* Parsed files are cached by their stat key: an unchanged file is not read again when another
  one changes.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.errors import InputUnavailable, bare, shown
from kubeplex.core.sources import manifest_loader
from kubeplex.core.sources.manifest_scan import SUFFIXES, FolderScan, StatKey, scan, stat_key

__all__ = ["CLUSTER_SCOPED", "KINDS", "SUFFIXES", "ManifestProblem", "ManifestSource"]

log = logging.getLogger(__name__)

KINDS = ("Service", "EndpointSlice", "Node", "ServiceCIDR")
#: Kinds without a namespace.
CLUSTER_SCOPED = ("Node", "ServiceCIDR")

#: (kind, namespace, name); the namespace is "" for cluster-scoped kinds.
Ident = tuple[str, str, str]
Objects = dict[Ident, Mapping[str, Any]]


class ManifestsUnavailable(InputUnavailable):
    """The manifests path cannot be read at the first load: there is no last state to keep."""


@dataclass(frozen=True)
class ManifestProblem:
    file: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.message}"


@dataclass(frozen=True)
class _Parsed:
    """One version of one file: its objects (None: unusable, keep the last good ones)."""

    key: StatKey
    objects: Objects | None
    problems: tuple[ManifestProblem, ...]


class _ChangedSinceScan(Exception):
    """A file changed between the scan that settled and its read: wait for quiet again."""


def _short(value: Any, limit: int = 60) -> str:
    return shown(value, limit)  # bounded: a 10 MB value or an alias bomb stays one short line


def describe(ident: Ident) -> str:
    kind, ns, name = ident
    return f"{kind} {bare(ns)}/{bare(name)}" if ns else f"{kind} {bare(name)}"


def _objects(doc: Mapping[str, Any], where: str, problems: list[str]) -> Iterator[Any]:
    """The objects of a document, ``kind: List`` unwrapped (``where`` names it in problems)."""
    if doc.get("kind") != "List":
        yield doc
        return
    items = doc.get("items")
    if items is None:
        return
    if not isinstance(items, list):
        problems.append(f"{where}items: must be a list, got {_short(items)}")
        return
    for i, item in enumerate(items):
        if isinstance(item, Mapping):
            yield from _objects(item, where, problems)
        else:
            problems.append(f"{where}items[{i}]: must be a mapping, got {_short(item)}")


def _identity(obj: Mapping[str, Any], where: str, problems: list[str]) -> Ident | None:
    kind = str(obj["kind"])
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if name is None:
        problems.append(f"{where}{kind} without metadata.name")
        return None
    if not isinstance(name, str) or not name:
        problems.append(f"{where}{kind}: metadata.name: must be a string, got {_short(name)}")
        return None
    assert isinstance(meta, Mapping)
    if kind in CLUSTER_SCOPED:
        return (kind, "", name)
    ns = meta.get("namespace")
    if ns is None:
        ns = "default"
    if not isinstance(ns, str) or not ns:
        problems.append(
            f"{where}{kind} {bare(name)}: metadata.namespace: must be a string, got {_short(ns)}"
        )
        return None
    return (kind, ns, name)


def objects_of(docs: list[Any]) -> tuple[Objects, list[str]]:
    """The objects of the kinds kubeplex reads, by identity, and what is wrong with the rest."""
    found: Objects = {}
    problems: list[str] = []
    for index, doc in enumerate(docs):
        if doc is None:
            continue
        where = f"document {index + 1}: "
        if not isinstance(doc, Mapping):
            problems.append(f"{where}not a mapping")
            continue
        for obj in _objects(doc, where, problems):
            if not isinstance(obj.get("kind"), str) or obj["kind"] not in KINDS:
                continue
            ident = _identity(obj, where, problems)
            if ident is not None:
                found[ident] = obj
    return found, problems


class ManifestSource:
    def __init__(
        self,
        path: Path | str,
        cluster: ClusterState,
        poll_interval: float = 0.5,
        settle_polls: int = 2,
        empty_grace_polls: int = 20,
        max_wait_polls: int = 10,
    ) -> None:
        self.path = Path(path)
        self.cluster = cluster
        self.poll_interval = poll_interval
        #: Polls in a row that must see the same folder before a change is applied.
        self.settle_polls = max(1, settle_polls)
        #: Polls a file that had objects may stay empty before it loses them.
        self.empty_grace_polls = empty_grace_polls
        #: Polls a change may wait for the folder to go quiet before it is applied anyway.
        self.max_wait_polls = max(self.settle_polls, max_wait_polls)
        self.problems: list[ManifestProblem] = []
        self._loaded: Objects = {}
        self._origin: dict[Ident, Path] = {}
        self._by_file: dict[Path, Objects] = {}  # the objects in effect, per file
        self._parsed: dict[Path, _Parsed] = {}
        self._applied: tuple[object, ...] | None = None  # signature of the scan in effect
        self._pending: tuple[object, ...] | None = None
        self._quiet = 0
        self._polls = 0
        self._waiting_since: int | None = None  # the poll that first saw an unapplied change
        self._restless = False  # applied without waiting for quiet since it was last quiet
        self._empty_since: dict[Path, int] = {}  # empty files whose objects are held
        self._logged: set[str] = set()
        self._root_error: str | None = None
        self._last_crash = ""

    # --- the loop ---------------------------------------------------------------------------

    def load(self) -> bool:
        """Read the manifests now (no debounce) and feed what changed to the trackers.
        True if anything changed. At the first load a missing or unreadable path is an error."""
        found = scan(self.path)
        if found.root_error is not None and self._applied is None:
            raise ManifestsUnavailable(f"manifests path {self.path} {found.root_error}")
        return self._apply(found, strict=False)

    def poll(self) -> bool:
        """One look at the folder; applies a change once it has settled. True if it did."""
        self._polls += 1
        found = scan(self.path)
        sig = found.signature
        if sig == self._applied:
            self._pending = self._waiting_since = None
            self._restless = False
            if any(self._polls - s >= self.empty_grace_polls for s in self._empty_since.values()):
                return self._apply(found, strict=True)
            return False
        if self._waiting_since is None:
            self._waiting_since = self._polls
        if sig != self._pending:
            self._pending, self._quiet = sig, 0
        self._quiet += 1
        if self._quiet < self.settle_polls:
            if self._polls - self._waiting_since + 1 < self.max_wait_polls:
                return False
            if not self._restless:  # once until the folder is quiet again
                log.warning(
                    "manifests folder %s has not been quiet for %g s; applying it as it is",
                    self.path,
                    self.max_wait_polls * self.poll_interval,
                )
            self._restless = True
        return self._apply(found, strict=True)

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self.poll_interval):
            try:
                self.poll()
            except Exception as err:  # a bug, not bad input (that is caught per file)
                crash = f"{type(err).__name__}: {err}"
                if crash != self._last_crash:
                    log.exception("reading manifests from %s failed; retrying", self.path)
                self._last_crash = crash
                self._applied = self._pending = None  # look at everything again

    # --- one settled scan ----------------------------------------------------------------------

    def _apply(self, found: FolderScan, strict: bool) -> bool:
        if found.root_error is not None:
            self._root_unreadable(found.root_error)
            self._applied = found.signature
            return False
        if self._root_error is not None:
            log.warning("manifests folder %s can be read again", self.path)
            self._root_error = None
        problems: list[ManifestProblem] = []
        current: dict[Path, Objects] = {}
        try:
            for file, key in found.files.items():
                current[file] = self._objects_of_file(file, key, strict, problems)
        except _ChangedSinceScan:
            self._pending = None
            return False
        for where, why in found.unreadable.items():
            kept = {
                f: objs
                for f, objs in self._by_file.items()
                if f not in current and f.is_relative_to(where)
            }
            current.update(kept)
            count = sum(len(objs) for objs in kept.values())
            problems.append(
                ManifestProblem(
                    str(where),
                    f"{why}; keeping the {count} objects"
                    f" of its {len(kept)} files until it can be read",
                )
            )
        self._parsed = {f: p for f, p in self._parsed.items() if f in current}
        self._empty_since = {f: s for f, s in self._empty_since.items() if f in current}
        self._by_file = dict(sorted(current.items()))
        changed = self._feed(problems)
        self._applied = found.signature
        self._waiting_since = None
        self._report(problems)
        return changed

    def _root_unreadable(self, why: str) -> None:
        if why != self._root_error:
            log.error(
                "manifests folder %s %s; keeping the last state (%d objects) until it can be read",
                self.path,
                why,
                len(self._loaded),
            )
            self._root_error = why
        self.problems = [ManifestProblem(str(self.path), why)]
        self._logged = {str(p) for p in self.problems}

    def _objects_of_file(
        self, file: Path, key: StatKey, strict: bool, problems: list[ManifestProblem]
    ) -> Objects:
        parsed = self._parsed.get(file)
        if parsed is None or parsed.key != key:
            parsed = self._parse(file, key, strict)
            self._parsed[file] = parsed
        problems.extend(parsed.problems)
        previous = self._by_file.get(file, {})
        if parsed.objects is None:
            return previous
        if parsed.objects or key[3] != 0 or not previous:
            self._empty_since.pop(file, None)
            return parsed.objects
        # Zero bytes where objects were: most likely a writer between truncating and writing.
        if file not in self._empty_since:
            self._empty_since[file] = self._polls
            log.warning(
                "%s is empty; keeping its %d objects for now (it may be being written); they are "
                "removed if it stays empty for %d polls",
                file,
                len(previous),
                self.empty_grace_polls,
            )
        if self._polls - self._empty_since[file] < self.empty_grace_polls:
            return previous
        log.warning("%s has stayed empty: removing its %d objects", file, len(previous))
        del self._empty_since[file]
        return {}

    def _parse(self, file: Path, key: StatKey, strict: bool) -> _Parsed:
        def unusable(message: str) -> _Parsed:
            kept = len(self._by_file.get(file, {}))
            if kept:
                message += f"; keeping its last {kept} good objects"
            return _Parsed(key, None, (ManifestProblem(str(file), message),))

        try:
            fd = os.open(file, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            if strict:
                raise _ChangedSinceScan() from None
            return unusable("vanished while being read")
        except OSError as err:
            return unusable(f"cannot read: {err.strerror or err}")
        try:
            st = os.fstat(fd)
            if stat_key(st) != key:
                if strict:
                    raise _ChangedSinceScan()
                key = stat_key(st)
            data = manifest_loader.read_bounded(fd, st.st_size)
            docs = manifest_loader.load_documents(str(file), data)
            objects, found = objects_of(docs)
        except manifest_loader.ManifestFileError as err:
            return unusable(str(err))
        except OSError as err:
            return unusable(f"cannot read: {err.strerror or err}")
        except _ChangedSinceScan:
            raise
        except Exception as err:  # whatever it is, it is this file's: name it, load the rest
            return unusable(f"cannot be loaded: {type(err).__name__}: {_short(str(err), 200)}")
        finally:
            os.close(fd)
        return _Parsed(key, objects, tuple(ManifestProblem(str(file), p) for p in found))

    def _feed(self, problems: list[ManifestProblem]) -> bool:
        """Feed the difference between the files' objects and what is loaded to the cluster."""
        desired: Objects = {}
        origin: dict[Ident, Path] = {}
        for file, objs in self._by_file.items():
            for ident, obj in objs.items():
                if ident in desired:
                    problems.append(
                        ManifestProblem(str(file), f"{describe(ident)} also in {origin[ident]}")
                    )
                desired[ident] = obj
                origin[ident] = file
        changed = False
        loaded: Objects = {}
        for kind in KINDS:  # Services before their slices, as watch events usually come
            for ident, obj in desired.items():
                if ident[0] != kind:
                    continue
                previous = self._loaded.get(ident)
                if previous is obj or previous == obj:
                    loaded[ident] = obj
                elif self._set(ident, obj, origin[ident], problems):
                    loaded[ident] = obj
                    changed = True
                elif previous is not None:
                    loaded[ident] = previous
        for ident in [i for i in self._loaded if i not in desired]:
            self._delete(ident)
            changed = True
        self._loaded = loaded
        self._origin = {i: origin[i] for i in loaded}
        return changed

    def _set(
        self, ident: Ident, obj: Mapping[str, Any], file: Path, problems: list[ManifestProblem]
    ) -> bool:
        kind, where = ident[0], str(file)
        try:
            if kind == "Service":
                self.cluster.set_service(obj, origin=where)
            elif kind == "EndpointSlice":
                self.cluster.set_endpoint_slice(obj, origin=where)
            elif kind == "ServiceCIDR":
                self.cluster.set_service_cidr(obj, origin=where)
            else:
                self.cluster.set_node(obj, origin=where)
        except Exception as err:  # a crash on one object must not stop the others
            problems.append(
                ManifestProblem(
                    where,
                    f"{describe(ident)}: cannot be loaded: {type(err).__name__}: "
                    f"{_short(str(err), 200)}",
                )
            )
            return False
        return True

    def _delete(self, ident: Ident) -> None:
        kind, ns, name = ident
        if kind == "Service":
            self.cluster.delete_service(ns, name)
        elif kind == "EndpointSlice":
            self.cluster.delete_endpoint_slice(ns, name)
        elif kind == "ServiceCIDR":
            self.cluster.delete_service_cidr(name)
        what = f"removed {describe(ident)} (it was in {self._origin.get(ident)})"
        if kind == "Node":
            what += "; its last labels and addresses stay in effect"
        log.info("%s", what)

    def _report(self, problems: list[ManifestProblem]) -> None:
        """Keep the problems of this load; log each one once while it lasts."""
        self.problems = problems
        for problem in problems:
            if str(problem) not in self._logged:
                log.error("%s", problem)
        self._logged = {str(p) for p in problems}
