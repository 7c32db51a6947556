"""The mode's settings from the trust list (``[backends.ebpf.options]``): where it attaches and
where it pins. Checked at construction, each bad one named by its key."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kubeplex.backends.ebpf.layout import DEFAULT_BPFFS
from kubeplex.core.dataplane.mounts import MOUNTS, mount_points
from kubeplex.core.model.errors import FieldError, InvalidObject

#: Where the options are written, as errors name them.
WHERE = "[backends.ebpf.options]"


def cgroup2_root(mounts: Path = MOUNTS) -> str:
    """The node's cgroup2 mount (the first one listed), where the programs see every process;
    /sys/fs/cgroup when none is mounted (the requirements then say so)."""
    found = mount_points("cgroup2", mounts)
    return str(found[0]) if found else "/sys/fs/cgroup"


@dataclass(frozen=True)
class EbpfOptions:
    #: The cgroup2 folder the programs attach to: every process in it and below is served.
    cgroup: Path
    #: The bpffs mount the maps and links are pinned under (in its kubeplex/ folder).
    bpffs: Path

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> EbpfOptions:
        """InvalidObject naming each unknown key and each value that is not an absolute path."""
        errors = [
            FieldError(key, "unknown option") for key in raw if key not in ("cgroup", "bpffs")
        ]
        paths: dict[str, Path] = {}
        for key in ("cgroup", "bpffs"):
            value = raw.get(key)
            if value is None:
                continue
            if not isinstance(value, str) or not value.startswith("/"):
                errors.append(FieldError(key, f"must be an absolute path, not {value!r}"))
            else:
                paths[key] = Path(value)
        if errors:
            raise InvalidObject(WHERE, errors)
        return cls(
            cgroup=paths.get("cgroup") or Path(cgroup2_root()),
            bpffs=paths.get("bpffs") or Path(DEFAULT_BPFFS),
        )

    def on_node(self, cgroup: Path | None, bpffs: Path | None) -> EbpfOptions:
        """These options where the node has a cgroup or a bpffs folder of its own (the
        backend context's): the node's win."""
        return replace(self, cgroup=cgroup or self.cgroup, bpffs=bpffs or self.bpffs)
