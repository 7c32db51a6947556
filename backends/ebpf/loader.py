"""Loads the ebpf mode's programs, pins their maps and links under the bpffs folder and attaches
them to a cgroup2 folder; adopts what an earlier start pinned; detaches and unpins it all.

Pinned, the data path outlives the daemon: a restart (or a crash) keeps every connection
translated, and the next start adopts the pinned links and maps instead of loading again, as
the netfilter modes keep their rules.

    <bpffs>/kubeplex/kpx_svc4 ...      the maps (layout.MAPS), by name
    <bpffs>/kubeplex/links/connect4 ... one cgroup link per program (layout.PROGRAMS)
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kubeplex.backends.ebpf import libbpf
from kubeplex.backends.ebpf.layout import (
    DEFAULT_BPFFS,
    MAPS,
    PIN_FOLDER,
    PROGRAM_PREFIX,
    PROGRAMS,
    MapLayout,
)

#: Where scripts/build-bpf.sh puts the compiled programs, inside the package.
OBJECT_PATH = Path(__file__).parent / "objects" / "kubeplex_lb.bpf.o"

#: A folder in the pin folder while ``cleanup(drain=True)`` keeps the reverse path (drain.py):
#: its time is when the drain began. A start (the mode back again) removes it.
DRAINING = "draining"

# statfs(2) f_type of the two file systems the mode needs (linux/magic.h).
BPF_FS_MAGIC = 0xCAFE4A11
CGROUP2_SUPER_MAGIC = 0x63677270


class LoaderError(RuntimeError):
    """The bpffs folder or the cgroup given is not what the mode needs."""


def filesystem_magic(path: Path) -> int:
    """statfs(2)'s f_type of path (the first field of struct statfs)."""
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(256)  # larger than any struct statfs
    if libc.statfs(str(path).encode(), buf) != 0:
        err = ctypes.get_errno()
        raise LoaderError(f"{path}: {os.strerror(err)}")
    return int.from_bytes(buf.raw[: ctypes.sizeof(ctypes.c_long)], sys.byteorder)


@dataclass
class BpfMap:
    """A pinned map, opened by fd: the operations the render's plan is applied with."""

    layout: MapLayout
    fd: int

    @property
    def name(self) -> str:
        return self.layout.name

    def update(self, key: bytes, value: bytes) -> None:
        libbpf.map_update(self.fd, key, value)

    def lookup(self, key: bytes) -> bytes | None:
        return libbpf.map_lookup(self.fd, key, self.layout.value.size)

    def delete(self, key: bytes) -> bool:
        return libbpf.map_delete(self.fd, key)

    def keys(self) -> Iterator[bytes]:
        key = libbpf.map_next_key(self.fd, None, self.layout.key.size)
        while key is not None:
            yield key
            key = libbpf.map_next_key(self.fd, key, self.layout.key.size)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """A dump; an entry deleted meanwhile is skipped."""
        for key in list(self.keys()):
            value = self.lookup(key)
            if value is not None:
                yield key, value

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@dataclass
class Dataplane:
    """What a start found or made: the maps by name, and whether it adopted pinned links
    (``attached`` lists the programs this start attached itself)."""

    maps: dict[str, BpfMap]
    attached: list[str] = field(default_factory=list)

    @property
    def adopted(self) -> bool:
        return not self.attached

    def close(self) -> None:
        """Closes the fds only: the pinned maps and links stay."""
        for m in self.maps.values():
            m.close()


def detach(pin: Path) -> None:
    """Detaches the link pinned at ``pin`` from its cgroup (already detached: nothing)."""
    with contextlib.suppress(libbpf.LibbpfError):
        fd = libbpf.obj_get(str(pin))
        try:
            libbpf.link_detach(fd, str(pin))
        finally:
            os.close(fd)


class Loader:
    """The mode's pinned state under one bpffs folder."""

    def __init__(self, bpffs: Path | str = DEFAULT_BPFFS, object_path: Path = OBJECT_PATH) -> None:
        self.bpffs = Path(bpffs)
        self.folder = self.bpffs / PIN_FOLDER
        self.links = self.folder / "links"
        self.object_path = object_path

    def missing(self) -> str | None:
        """None when the programs can be loaded here, else why not."""
        if not self.object_path.is_file():
            return f"{self.object_path} is missing (scripts/build-bpf.sh builds it)"
        return libbpf.available()

    def start(self, cgroup: Path | str) -> Dataplane:
        """Attaches to the cgroup2 folder, adopting each pinned link still attached there and
        every pinned map (its entries kept); loads the object only for what is missing."""
        if filesystem_magic(self.bpffs) != BPF_FS_MAGIC:
            raise LoaderError(f"bpffs folder {self.bpffs} is not a bpf file system mount")
        if filesystem_magic(Path(cgroup)) != CGROUP2_SUPER_MAGIC:
            raise LoaderError(f"cgroup {cgroup} is not a cgroup2 folder")
        with contextlib.suppress(FileNotFoundError):
            (self.folder / DRAINING).rmdir()
        cgroup_fd = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
        try:
            cgroup_id = os.fstat(cgroup_fd).st_ino
            maps_pinned = all((self.folder / m.name).exists() for m in MAPS)
            adopted = [p for p in PROGRAMS if self._adopt_link(p, cgroup_id)]
            missing = [p for p in PROGRAMS if p not in adopted]
            if missing or not maps_pinned:
                # An adopted link's program uses the maps it was loaded with: when one of them
                # is no longer pinned, the link is switched to a program on the pinned maps.
                self._load(cgroup_fd, missing, [] if maps_pinned else adopted)
        finally:
            os.close(cgroup_fd)
        return Dataplane(self.open_maps(), attached=missing)

    def open_maps(self) -> dict[str, BpfMap]:
        """The pinned maps, opened (LibbpfError when one is not pinned); LoaderError when one
        is not of this layout (pinned by another version: cleanup removes it)."""
        maps: dict[str, BpfMap] = {}
        try:
            for m in MAPS:
                path = str(self.folder / m.name)
                maps[m.name] = BpfMap(m, libbpf.obj_get(path))
                found = libbpf.map_info(maps[m.name].fd, path)
                wanted = (m.key.size, m.value.size, m.max_entries)
                if found != wanted:
                    raise LoaderError(
                        f"pinned map {path} has (key, value, entries) {found}, "
                        f"not {wanted}: another version's; cleanup removes it"
                    )
        except BaseException:
            for opened in maps.values():
                opened.close()
            raise
        return maps

    def _adopt_link(self, program: str, cgroup_id: int) -> bool:
        """True when the pinned link of program is attached to this cgroup; a link pinned for
        another cgroup (or for one since removed) is detached and unpinned."""
        pin = self.links / program
        if not pin.exists():
            return False
        fd = libbpf.obj_get(str(pin))
        try:
            _prog_id, attached_to = libbpf.link_cgroup(fd, str(pin))
            if attached_to == cgroup_id:
                return True
            with contextlib.suppress(libbpf.LibbpfError):
                libbpf.link_detach(fd, str(pin))
        finally:
            os.close(fd)
        pin.unlink()
        return False

    def _load(self, cgroup_fd: int, attach: list[str], update: list[str]) -> None:
        """Loads the object on the pinned maps (pinning those missing); attaches and pins the
        programs of attach, and switches the pinned links of update to the new programs."""
        self.links.mkdir(parents=True, exist_ok=True)
        path = str(self.object_path)
        obj = libbpf.open_object(path)
        try:
            for m in MAPS:
                libbpf.set_map_pin_path(libbpf.find_map(obj, m.name), str(self.folder / m.name))
            libbpf.load_object(obj, path)
            for program in update:
                prog = libbpf.find_program(obj, PROGRAM_PREFIX + program)
                pin = str(self.links / program)
                fd = libbpf.obj_get(pin)
                try:
                    libbpf.link_update(fd, libbpf.program_fd(prog, program), pin)
                finally:
                    os.close(fd)
            for program in attach:
                prog = libbpf.find_program(obj, PROGRAM_PREFIX + program)
                link = libbpf.attach_cgroup(prog, cgroup_fd, f"attach {program}")
                try:
                    libbpf.pin_link(link, str(self.links / program))
                finally:
                    libbpf.release_link(link)
        finally:
            # The pinned maps and links hold what they need; the object's own fds go.
            libbpf.close_object(obj)

    def attached(self, cgroup: Path | str) -> list[str]:
        """The programs whose pinned link is attached to the cgroup2 folder (a read: nothing
        is detached). OSError (LibbpfError) where a pin cannot be read."""
        cgroup_id = os.stat(cgroup).st_ino
        found = []
        for program in PROGRAMS:
            pin = self.links / program
            if not pin.exists():
                continue
            fd = libbpf.obj_get(str(pin))
            try:
                if libbpf.link_cgroup(fd, str(pin))[1] == cgroup_id:
                    found.append(program)
            finally:
                os.close(fd)
        return found

    def leftovers(self) -> list[str]:
        """Everything pinned under the folder (what cleanup removes)."""
        if not self.folder.exists():
            return []
        return sorted(str(p) for p in self.folder.rglob("*") if not p.is_dir())

    def cleanup(self) -> list[str]:
        """Detaches every pinned link, unpins links and maps and removes the folder; returns
        what it removed. Removing a map's last pin (and fd) deletes it."""
        removed = self.leftovers()
        if self.links.exists():
            for pin in sorted(self.links.iterdir()):
                detach(pin)
        for path in sorted(self.folder.rglob("*"), reverse=True) if self.folder.exists() else []:
            if path.is_dir():
                path.rmdir()
            else:
                path.unlink()
        if self.folder.exists():
            self.folder.rmdir()
        return removed
