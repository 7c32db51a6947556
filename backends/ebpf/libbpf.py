"""A thin ctypes binding of the system's libbpf (libbpf.so.1): only what the loader needs.

libbpf 1.x reports errors as a negative errno from int functions, and as NULL with errno set
from those returning a pointer (so libbpf_get_error, the 0.x way, is not needed). Every
failure here is a LibbpfError naming the operation and its object.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import struct
from functools import cache
from typing import Final, NewType

#: The library's soname (libbpf1's); a machine without it has no ebpf mode.
SONAME: Final = "libbpf.so.1"

ObjectPtr = NewType("ObjectPtr", int)
ProgramPtr = NewType("ProgramPtr", int)
MapPtr = NewType("MapPtr", int)
LinkPtr = NewType("LinkPtr", int)

_P = ctypes.c_void_p
_S = ctypes.c_char_p
_I = ctypes.c_int

# name: (result, arguments)
_SIGNATURES: Final[dict[str, tuple[type | None, list[type]]]] = {
    "bpf_object__open_file": (_P, [_S, _P]),
    "bpf_object__load": (_I, [_P]),
    "bpf_object__close": (None, [_P]),
    "bpf_object__find_program_by_name": (_P, [_P, _S]),
    "bpf_object__find_map_by_name": (_P, [_P, _S]),
    "bpf_map__set_pin_path": (_I, [_P, _S]),
    "bpf_map__fd": (_I, [_P]),
    "bpf_program__attach_cgroup": (_P, [_P, _I]),
    "bpf_program__fd": (_I, [_P]),
    "bpf_link_update": (_I, [_I, _I, _P]),
    "bpf_link__pin": (_I, [_P, _S]),
    "bpf_link__destroy": (_I, [_P]),
    "bpf_obj_get": (_I, [_S]),
    "bpf_obj_get_info_by_fd": (_I, [_I, _P, ctypes.POINTER(ctypes.c_uint32)]),
    "bpf_link_detach": (_I, [_I]),
    "bpf_map_update_elem": (_I, [_I, _P, _P, ctypes.c_uint64]),
    "bpf_map_lookup_elem": (_I, [_I, _P, _P]),
    "bpf_map_delete_elem": (_I, [_I, _P]),
    "bpf_map_get_next_key": (_I, [_I, _P, _P]),
    "bpf_map_lookup_batch": (_I, [_I, _P, _P, _P, _P, ctypes.POINTER(ctypes.c_uint32), _P]),
}

#: The errors of a batch lookup the map type or the kernel does not have (before 5.6 the
#: command is unknown: EINVAL; a map type without it: the kernel's ENOTSUPP, 524).
BATCH_REFUSED: Final = frozenset({errno.EINVAL, errno.EOPNOTSUPP, 524})
#: Entries asked for per batch call.
BATCH_ENTRIES: Final = 4096

# Map update flags (linux/bpf.h).
BPF_ANY: Final = 0
BPF_NOEXIST: Final = 1
BPF_EXIST: Final = 2


class LibbpfError(OSError):
    """A libbpf call failed: errno and strerror as OSError's, with what was being done."""

    def __init__(self, err: int, what: str) -> None:
        super().__init__(err, f"{what}: {os.strerror(err)}")
        self.what = what


class LibbpfMissing(RuntimeError):
    """The system has no libbpf.so.1."""


@cache
def library() -> ctypes.CDLL:
    """libbpf.so.1 with every function used here typed; LibbpfMissing when it is not there."""
    try:
        lib = ctypes.CDLL(SONAME, use_errno=True)
    except OSError as exc:
        found = ctypes.util.find_library("bpf")
        if found is None:
            raise LibbpfMissing(f"{SONAME} not found (install libbpf1): {exc}") from exc
        lib = ctypes.CDLL(found, use_errno=True)
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


def available() -> str | None:
    """None when libbpf can be used, else why not."""
    try:
        library()
    except LibbpfMissing as exc:
        return str(exc)
    return None


def _check(rc: int, what: str) -> int:
    if rc < 0:
        raise LibbpfError(-rc, what)
    return rc


def _pointer(ptr: int | None, what: str) -> int:
    if not ptr:
        raise LibbpfError(ctypes.get_errno() or errno.EINVAL, what)
    return ptr


def open_object(path: str) -> ObjectPtr:
    return ObjectPtr(_pointer(library().bpf_object__open_file(path.encode(), None), f"open {path}"))


def load_object(obj: ObjectPtr, path: str) -> None:
    _check(library().bpf_object__load(obj), f"load {path}")


def close_object(obj: ObjectPtr) -> None:
    library().bpf_object__close(obj)


def find_program(obj: ObjectPtr, name: str) -> ProgramPtr:
    ptr = library().bpf_object__find_program_by_name(obj, name.encode())
    return ProgramPtr(_pointer(ptr, f"find program {name}"))


def find_map(obj: ObjectPtr, name: str) -> MapPtr:
    return MapPtr(
        _pointer(library().bpf_object__find_map_by_name(obj, name.encode()), f"find map {name}")
    )


def set_map_pin_path(map_: MapPtr, path: str) -> None:
    """Load reuses the map pinned at path (its entries kept), or pins the new one there."""
    _check(library().bpf_map__set_pin_path(map_, path.encode()), f"pin path {path}")


def map_fd(map_: MapPtr) -> int:
    return _check(library().bpf_map__fd(map_), "map fd")


def attach_cgroup(prog: ProgramPtr, cgroup_fd: int, what: str) -> LinkPtr:
    return LinkPtr(_pointer(library().bpf_program__attach_cgroup(prog, cgroup_fd), what))


def program_fd(prog: ProgramPtr, what: str) -> int:
    return _check(library().bpf_program__fd(prog), f"fd of {what}")


def link_update(fd: int, prog_fd: int, what: str) -> None:
    """Switches the link to another program, atomically: the hook is never left empty."""
    _check(library().bpf_link_update(fd, prog_fd, None), f"update {what}")


def pin_link(link: LinkPtr, path: str) -> None:
    _check(library().bpf_link__pin(link, path.encode()), f"pin link {path}")


def release_link(link: LinkPtr) -> None:
    """Frees the handle and closes its fd; the link stays attached while it is pinned.
    (bpf_link__disconnect first would keep the fd open, and the link with it.)"""
    library().bpf_link__destroy(link)


def obj_get(path: str) -> int:
    """A new fd of the object pinned at path."""
    return _check(library().bpf_obj_get(path.encode()), f"open pinned {path}")


def link_detach(fd: int, what: str) -> None:
    _check(library().bpf_link_detach(fd), f"detach {what}")


def _info(fd: int, what: str) -> bytes:
    """bpf_obj_get_info_by_fd's answer, zero-filled past what this kernel writes."""
    buf = ctypes.create_string_buffer(128)  # more than the heads read here
    size = ctypes.c_uint32(len(buf))
    _check(library().bpf_obj_get_info_by_fd(fd, buf, ctypes.byref(size)), f"info of {what}")
    return buf.raw


# struct bpf_link_info's head and its cgroup member: type, id, prog_id, then the union (8-aligned).
_LINK_INFO_CGROUP: Final = struct.Struct("=III4xQI")


def link_cgroup(fd: int, what: str) -> tuple[int, int]:
    """(program id, cgroup id) of a cgroup link; the cgroup id is its folder's inode number."""
    _type, _id, prog_id, cgroup_id, _attach = _LINK_INFO_CGROUP.unpack_from(_info(fd, what))
    return prog_id, cgroup_id


# struct bpf_map_info's head: type, id, key_size, value_size, max_entries.
_MAP_INFO: Final = struct.Struct("=IIIII")


def map_info(fd: int, what: str) -> tuple[int, int, int]:
    """(key size, value size, max entries) of a map."""
    _type, _id, key_size, value_size, max_entries = _MAP_INFO.unpack_from(_info(fd, what))
    return key_size, value_size, max_entries


def map_update(fd: int, key: bytes, value: bytes, flags: int = BPF_ANY) -> None:
    _check(library().bpf_map_update_elem(fd, key, value, flags), "map update")


def map_lookup(fd: int, key: bytes, value_size: int) -> bytes | None:
    buf = ctypes.create_string_buffer(value_size)
    rc = library().bpf_map_lookup_elem(fd, key, buf)
    if rc == -errno.ENOENT:
        return None
    _check(rc, "map lookup")
    return buf.raw


def map_delete(fd: int, key: bytes) -> bool:
    """False when the key was not there."""
    rc = library().bpf_map_delete_elem(fd, key)
    if rc == -errno.ENOENT:
        return False
    _check(rc, "map delete")
    return True


def map_next_key(fd: int, key: bytes | None, key_size: int) -> bytes | None:
    """The key after key (the first when None); None past the last."""
    buf = ctypes.create_string_buffer(key_size)
    rc = library().bpf_map_get_next_key(fd, key, buf)
    if rc == -errno.ENOENT:
        return None
    _check(rc, "map next key")
    return buf.raw


def map_lookup_batch(
    fd: int, key_size: int, value_size: int, chunk: int = BATCH_ENTRIES
) -> list[tuple[bytes, bytes]]:
    """Every entry, ``chunk`` at a time (BPF_MAP_LOOKUP_BATCH, kernel 5.6+): a LibbpfError
    with an errno of BATCH_REFUSED where the map or the kernel has no batch lookup. A hash
    map hands out whole buckets: one larger than ``chunk`` (ENOSPC) is asked for again with
    room for it."""
    lib = library()
    # The position between calls: a bucket number for hash maps, a key for the others.
    position = [ctypes.create_string_buffer(max(key_size, 8)) for _ in range(2)]
    after: ctypes.Array[ctypes.c_char] | None = None
    out: list[tuple[bytes, bytes]] = []
    while True:
        keys = ctypes.create_string_buffer(key_size * chunk)
        values = ctypes.create_string_buffer(value_size * chunk)
        count = ctypes.c_uint32(chunk)
        next_position = position[1] if after is position[0] else position[0]
        rc = lib.bpf_map_lookup_batch(
            fd, after, next_position, keys, values, ctypes.byref(count), None
        )
        if rc == -errno.ENOSPC and count.value == 0:
            chunk *= 2
            continue
        if rc < 0 and rc != -errno.ENOENT:
            raise LibbpfError(-rc, "map lookup batch")
        raw_keys, raw_values = keys.raw, values.raw
        out += [
            (
                raw_keys[i * key_size : (i + 1) * key_size],
                raw_values[i * value_size : (i + 1) * value_size],
            )
            for i in range(count.value)
        ]
        if rc == -errno.ENOENT:  # past the last entry
            return out
        after = next_position
