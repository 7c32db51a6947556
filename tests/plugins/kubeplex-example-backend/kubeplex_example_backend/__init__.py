"""An example out-of-tree kubeplex backend: it records what it would program.

``render`` turns the graph into JSON lines, one per service port and IP family, in a stable
order (so the same state always renders the same text)::

    {"family": "IPv4", "op": "full"}                       a full render starts each family so
    {"family": "IPv4", "op": "set", "service": "default/web", "clusterIP": ..., "endpoints": ...}
    {"family": "IPv4", "op": "delete", "service": "default/gone"}     partial renders only

A partial render holds only the changed service ports; nothing changed renders "".

``apply`` merges the lines into the applied state and writes that state, exactly as a full
render of it prints, to ``<directory>/<node>.jsonl`` (write to a temporary file, then rename:
the old file stays if anything fails). The directory is ``directory`` in this backend's
``[backends.recording.options]`` of the trust list; without one, the state stays in memory
(:attr:`RecordingBackend.applied_text`). ``cleanup`` deletes the file and forgets the state,
and says so; ``leftovers`` names what is applied, ``inspect`` reads one service port back.

It has no kernel seam and reads nothing before a render (``Backend[None, None]``), so
``observe`` is the default (None) and ``render`` ignores the observation.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import (
    Backend,
    BackendContext,
    CleanupReport,
    EndpointView,
    ProgrammedService,
    Rendered,
    SyncResult,
)
from kubeplex.core.model.errors import BackendError
from kubeplex.core.model.graph import ProxyState, ServiceGraph
from kubeplex.core.model.types import IPFamily, ServicePortName

__all__ = ["RecordedFamily", "RecordingBackend", "RecordingRendered"]

MODE = "recording"


def _line(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


class RecordedFamily:
    """What one render says about one IP family."""

    def __init__(self, family: IPFamily, full: bool, lines: dict[str, str | None]) -> None:
        self.family = family
        self.full = full
        #: Service port ("ns/name:port") -> its JSON line, or None: delete it.
        self.lines = lines

    def text(self) -> str:
        out = [_line({"family": self.family.value, "op": "full"})] if self.full else []
        for key in sorted(self.lines):
            line = self.lines[key]
            out.append(
                line
                if line is not None
                else _line({"family": self.family.value, "op": "delete", "service": key})
            )
        return "".join(f"{ln}\n" for ln in out)


class RecordingRendered(Rendered):
    def __init__(self, families: list[RecordedFamily]) -> None:
        self.families = families

    @property
    def full(self) -> bool:
        return any(f.full for f in self.families)

    def __str__(self) -> str:
        return "".join(f.text() for f in self.families)


def service_line(graph: ServiceGraph, spn: ServicePortName) -> str:
    svc = graph.services[spn]
    eps = graph.categorized(spn)
    return _line(
        {
            "family": graph.family.value,
            "op": "set",
            "service": str(spn),
            "protocol": svc.protocol.value,
            "clusterIP": svc.cluster_ip,
            "port": svc.port,
            "nodePort": svc.node_port,
            "externalIPs": list(svc.external_ips),
            "loadBalancerIPs": list(svc.load_balancer_vips),
            "sessionAffinitySeconds": (
                svc.sticky_max_age_seconds if svc.session_affinity_client_ip else 0
            ),
            "internalTrafficPolicy": "Local" if svc.internal_policy_local else "Cluster",
            "externalTrafficPolicy": "Local" if svc.external_policy_local else "Cluster",
            "clusterEndpoints": [ep.address for ep in eps.cluster],
            "localEndpoints": [ep.address for ep in eps.local],
        }
    )


class RecordingBackend(Backend[None, None]):
    mode = MODE
    capabilities = frozenset({"ipv6", "render-only"})

    def __init__(self, ctx: BackendContext) -> None:
        super().__init__(ctx)
        directory = plugins.backend_options(MODE).get("directory")
        self.directory: Path | None = Path(str(directory)) if directory else None
        #: The applied state per family: service port -> line (what the "kernel" holds).
        self.applied: dict[IPFamily, dict[str, str]] = {}
        #: Every rendered text handed to apply, oldest first (a test double's memory).
        self.history: list[str] = []
        self._force_full = True

    # --- render: pure -----------------------------------------------------------------------

    def render(self, state: ProxyState, observed: None = None) -> RecordingRendered:
        force, self._force_full = self._force_full, False
        families = []
        for family in self.ctx.families:
            graph = state.graphs.get(family)
            if graph is None:
                continue
            changes = state.changes[family]
            if changes.full or force:
                lines: dict[str, str | None] = {
                    str(spn): service_line(graph, spn) for spn in graph.services
                }
                families.append(RecordedFamily(family, True, lines))
            elif changes.services:
                lines = {
                    str(spn): service_line(graph, spn) if spn in graph.services else None
                    for spn in changes.services
                }
                families.append(RecordedFamily(family, False, lines))
        return RecordingRendered(families)

    def invalidate(self) -> None:
        self._force_full = True

    # --- apply: atomic ----------------------------------------------------------------------

    @property
    def file(self) -> Path | None:
        return self.directory / f"{self.ctx.node_name}.jsonl" if self.directory else None

    @property
    def applied_text(self) -> str:
        """The applied state, as a full render of it prints."""
        return str(
            RecordingRendered(
                [
                    RecordedFamily(f, True, dict(self.applied[f]))
                    for f in self.ctx.families
                    if f in self.applied
                ]
            )
        )

    def prepare(self) -> None:
        if self.directory is not None:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
            except OSError as err:
                raise BackendError(f"recording: cannot create {self.directory}: {err}") from err

    def apply(self, rendered: Rendered) -> SyncResult:
        if not isinstance(rendered, RecordingRendered):
            raise BackendError(f"recording: cannot apply a {type(rendered).__name__}")
        new = {f: dict(lines) for f, lines in self.applied.items()}
        for fam in rendered.families:
            state = {} if fam.full else new.get(fam.family, {})
            for key, line in fam.lines.items():
                if line is None:
                    state.pop(key, None)
                else:
                    state[key] = line
            new[fam.family] = state
        old, self.applied = self.applied, new
        try:
            self._write(self.applied_text)
        except OSError as err:
            self.applied = old  # the old file is still in place
            raise BackendError(f"recording: cannot write {self.file}: {err}") from err
        self.history.append(str(rendered))
        return SyncResult(
            full=rendered.full,
            counts={"services": sum(len(v) for v in self.applied.values())},
        )

    def _write(self, text: str) -> None:
        file = self.file
        if file is None:
            return
        fd, tmp = tempfile.mkstemp(prefix=f".{file.name}.", dir=file.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(text)
            os.replace(tmp, file)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def cleanup(self, keep: Collection[str] = (), drain: bool = False) -> CleanupReport:
        removed = self.leftovers()
        file = self.file
        if file is not None:
            try:
                file.unlink(missing_ok=True)
            except OSError as err:
                raise BackendError(f"recording: cannot delete {file}: {err}") from err
        self.applied = {}
        self.invalidate()
        return CleanupReport(MODE, tuple(removed))

    def leftovers(self) -> list[str]:
        """The applied service ports, then the file that holds them."""
        out = [
            f"recording {family.value} service {key}"
            for family in self.ctx.families
            for key in sorted(self.applied.get(family, {}))
        ]
        file = self.file
        if file is not None and file.exists():
            out.append(f"recording file {file}")
        return out

    def inspect(self, service_port: ServicePortName) -> list[ProgrammedService]:
        """What the applied state holds for ``service_port`` (from memory: it is the state)."""
        out = []
        for family in self.ctx.families:
            line = self.applied.get(family, {}).get(str(service_port))
            if line is None:
                continue
            doc = json.loads(line)
            eps = doc["clusterEndpoints"]
            out.append(
                ProgrammedService(
                    service=str(service_port),
                    family=family,
                    entries=(line,),
                    endpoints=tuple(
                        EndpointView(target=ep, share=1 / len(eps) if eps else None) for ep in eps
                    ),
                    affinity_seconds=doc["sessionAffinitySeconds"] or None,
                )
            )
        return out

    def describe(self) -> list[str]:
        where = str(self.file) if self.file else "memory"
        return [*super().describe(), f"records to {where}"]
