"""Cluster state from a folder (or file) of YAML/JSON manifests: the embedded default source.

Services, EndpointSlices, Nodes and ServiceCIDRs (also inside ``kind: List``), multi-document
files allowed; other kinds are ignored. The folder is polled for changes, and only the difference
to what was loaded before is fed to the trackers, exactly as watch events would be.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kubeplex.core.cluster import ClusterState

log = logging.getLogger(__name__)

KINDS = ("Service", "EndpointSlice", "Node", "ServiceCIDR")
#: Kinds without a namespace.
CLUSTER_SCOPED = ("Node", "ServiceCIDR")
# libyaml's parser where PyYAML was built with it: an order of magnitude faster on big folders.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
SUFFIXES = (".yaml", ".yml", ".json")


@dataclass(frozen=True)
class ManifestProblem:
    file: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.message}"


def _files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    return sorted(p for p in root.rglob("*") if p.suffix in SUFFIXES and p.is_file())


def _objects(doc: Any) -> Iterator[Mapping[str, Any]]:
    if isinstance(doc, Mapping) and doc.get("kind") == "List":
        for item in doc.get("items") or []:
            yield from _objects(item)
    elif isinstance(doc, Mapping):
        yield doc


def _identity(obj: Mapping[str, Any]) -> tuple[str, str, str] | None:
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
        return None
    ns = "" if obj.get("kind") in CLUSTER_SCOPED else str(meta.get("namespace", "default"))
    return (str(obj.get("kind")), ns, meta["name"])


class ManifestSource:
    def __init__(self, path: Path | str, cluster: ClusterState, poll_interval: float = 1.0) -> None:
        self.path = Path(path)
        self.cluster = cluster
        self.poll_interval = poll_interval
        self._loaded: dict[tuple[str, str, str], Mapping[str, Any]] = {}
        self._by_file: dict[Path, dict[tuple[str, str, str], Mapping[str, Any]]] = {}
        self._signature: tuple[tuple[str, int, int], ...] = ()
        self.problems: list[ManifestProblem] = []

    def _scan_signature(self) -> tuple[tuple[str, int, int], ...]:
        sig = []
        for p in _files(self.path):
            try:
                st = p.stat()
            except OSError:
                continue
            sig.append((str(p), st.st_mtime_ns, st.st_size))
        return tuple(sig)

    def _read(self, file: Path) -> dict[tuple[str, str, str], Mapping[str, Any]] | None:
        """Objects of one file; None if the file cannot be parsed at all (keep what it had)."""
        try:
            text = file.read_text()
            if file.suffix == ".json":
                docs = [json.loads(text)]
            else:
                docs = list(yaml.load_all(text, Loader=_Loader))
        except json.JSONDecodeError as err:
            self.problems.append(
                ManifestProblem(str(file), f"line {err.lineno}: invalid JSON: {err.msg}")
            )
            return None
        except (OSError, UnicodeDecodeError) as err:
            self.problems.append(ManifestProblem(str(file), f"cannot read: {err}"))
            return None
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f"line {mark.line + 1}: " if mark is not None else ""
            problem = getattr(err, "problem", None) or str(err)
            self.problems.append(ManifestProblem(str(file), f"{where}invalid YAML: {problem}"))
            return None
        found: dict[tuple[str, str, str], Mapping[str, Any]] = {}
        for index, doc in enumerate(docs):
            if doc is None:
                continue
            if not isinstance(doc, Mapping):
                self.problems.append(
                    ManifestProblem(str(file), f"document {index + 1}: not a mapping")
                )
                continue
            for obj in _objects(doc):
                if obj.get("kind") not in KINDS:
                    continue
                ident = _identity(obj)
                if ident is None:
                    self.problems.append(
                        ManifestProblem(
                            str(file),
                            f"document {index + 1}: {obj.get('kind')} without metadata.name",
                        )
                    )
                    continue
                found[ident] = obj
        return found

    def load(self) -> bool:
        """Read the manifests and feed what changed to the trackers. True if anything changed."""
        if not self.path.exists():
            raise FileNotFoundError(f"manifests path {self.path} does not exist")
        self.problems = []
        self._signature = self._scan_signature()
        current: dict[Path, dict[tuple[str, str, str], Mapping[str, Any]]] = {}
        for file in _files(self.path):
            objs = self._read(file)
            current[file] = objs if objs is not None else self._by_file.get(file, {})
        self._by_file = current
        desired: dict[tuple[str, str, str], Mapping[str, Any]] = {}
        origin: dict[tuple[str, str, str], Path] = {}
        for file, objs in current.items():
            for ident, obj in objs.items():
                if ident in desired:
                    self.problems.append(
                        ManifestProblem(
                            str(file), f"{ident[0]} {ident[1]}/{ident[2]} also in {origin[ident]}"
                        )
                    )
                desired[ident] = obj
                origin[ident] = file
        changed = False
        # Nodes first (locality), then Services, then slices: the order watch events usually come.
        for kind in KINDS:
            for ident, obj in desired.items():
                if ident[0] == kind and self._loaded.get(ident) != obj:
                    self._set(kind, obj, origin[ident])
                    changed = True
        for ident in [i for i in self._loaded if i not in desired]:
            kind, ns, name = ident
            if kind == "Service":
                self.cluster.delete_service(ns, name)
            elif kind == "EndpointSlice":
                self.cluster.delete_endpoint_slice(ns, name)
            elif kind == "ServiceCIDR":
                self.cluster.delete_service_cidr(name)
            changed = True
        self._loaded = desired
        for problem in self.problems:
            log.error("%s", problem)
        return changed

    def _set(self, kind: str, obj: Mapping[str, Any], file: Path) -> None:
        if kind == "Service":
            self.cluster.set_service(obj, origin=str(file))
        elif kind == "EndpointSlice":
            self.cluster.set_endpoint_slice(obj, origin=str(file))
        elif kind == "ServiceCIDR":
            self.cluster.set_service_cidr(obj, origin=str(file))
        else:
            self.cluster.set_node(obj, origin=str(file))

    def poll(self) -> bool:
        """Reload if any file changed since the last load."""
        if self._scan_signature() == self._signature:
            return False
        return self.load()

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self.poll_interval):
            try:
                self.poll()
            except Exception:  # a vanished folder must not end the daemon
                log.exception("reading manifests from %s failed", self.path)
