"""What the maps hold for one Service port (``kubeplex inspect``), read back from the maps at
the places the last render gave it: its entry points, its endpoints (each with its share: one
slot of ``count``), its affinity timeout."""

from __future__ import annotations

import errno

from kubeplex.backends.ebpf import layout
from kubeplex.backends.ebpf.plan import RENDERED_MAPS, MapSeam, describe_key, describe_value
from kubeplex.backends.ebpf.render import Contribution
from kubeplex.core.dataplane.backend import EndpointView, ProgrammedService
from kubeplex.core.model.types import IPFamily, ServicePortName


def _read(seam: MapSeam, name: str, key: bytes) -> bytes | None:
    try:
        return seam.lookup(name, key)
    except OSError as err:
        if err.errno == errno.ENOENT:
            return None
        raise


def programmed(
    seam: MapSeam, family: IPFamily, spn: ServicePortName, part: Contribution
) -> ProgrammedService | None:
    """The Service port's entries as the maps hold them (None: none of them is there)."""
    entries: list[str] = []
    counts: dict[int, int] = {}
    affinity: int | None = None
    for name, key in part.entries:
        value = _read(seam, name, key)
        if value is None:
            continue
        svc_id, count, flags, timeout = layout.SVC_VALUE.unpack(value)
        # Without endpoints the program fails the connect (upstream's REJECT).
        refused = " refused (REJECT)" if count == 0 else ""
        entries.append(
            f"{name} {describe_key(name, key)} -> {describe_value(name, value)}{refused}"
        )
        counts[svc_id] = count
        if flags & layout.FLAG_AFFINITY:
            affinity = timeout
    if not entries:
        return None
    endpoints: dict[str, EndpointView] = {}
    backends = layout.BACKENDS.name
    for svc_id, count in counts.items():
        for slot in range(count):
            value = _read(seam, backends, layout.backend_key(svc_id, slot))
            if value is not None:
                target = describe_value(backends, value)
                endpoints.setdefault(target, EndpointView(target, share=1 / count))
    return ProgrammedService(
        service=str(spn),
        family=family,
        entries=tuple(entries),
        endpoints=tuple(endpoints.values()),
        affinity_seconds=affinity,
        objects=tuple(f"svc {svc_id:#010x}" for svc_id in counts),
    )


def held_entries(seam: MapSeam) -> list[str]:
    """Every entry of the maps the render writes, as the plan prints it: Services by the
    ``svc 0x...`` that ``programmed`` names them by (a map not pinned holds nothing)."""
    lines: list[str] = []
    for name in RENDERED_MAPS:
        try:
            entries = seam.dump(name)
        except OSError:
            continue
        lines += [
            f"{name} {describe_key(name, k)} -> {describe_value(name, v)}"
            for k, v in entries.items()
        ]
    return lines


def delete_held(seam: MapSeam) -> list[str]:
    """Deletes every entry of the rendered maps through a seam that has no pins to remove
    (the fake's); returns what they held, as ``held_entries`` says."""
    lines = held_entries(seam)
    for name in RENDERED_MAPS:
        try:
            keys = list(seam.dump(name))
        except OSError:
            continue
        for key in keys:
            seam.delete(name, key)
    return lines
