"""The guest's initramfs: busybox (static) as ``/init``'s shell and the few modules needed to
mount the root filesystem (virtio-pci, 9p over virtio, overlayfs).

``/init`` mounts the host's ``/`` (9p, read-only) under a tmpfs overlay, the run's control
folder and the shared project folder, then ``switch_root``\\ s into the overlay and hands over to
the run's second stage (a script in the control folder, run by the host's own shell). Any
failure powers the guest off at once, so the host never waits for a dead boot.

The archive is a newc cpio written here (no ``cpio`` tool needed), cached per kernel release
and content hash.
"""

from __future__ import annotations

import gzip
import hashlib
import lzma
import os
import shutil
import stat
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

# The modules the boot needs, by name; their dependencies come from modules.dep.
BOOT_MODULES = ("virtio_pci", "9pnet_virtio", "9p", "overlay")
# 9p mount tags (qemu ``mount_tag``) and where the control folder appears in the guest.
ROOT_TAG = "kpxroot"
CTL_TAG = "kpxctl"
SHARE_TAG = "kpxshare"
GUEST_CTL = "/run/kubeplex-vm"
# Bigger 9p messages: fewer round trips through the emulated virtio queue.
MSIZE = 262144

_NINEP = f"trans=virtio,version=9p2000.L,msize={MSIZE}"

INIT_SCRIPT = f"""#!/bin/busybox sh
# Stage 1 (initramfs): mount the overlay root and the shares, then switch_root.
/bin/busybox mkdir -p /bin /proc /sys /dev
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
fail() {{
  echo "kubeplex-vm: init: $*" > /dev/console
  echo o > /proc/sysrq-trigger
  while :; do sleep 1; done
}}
for m in $(cat /modules.order); do
  insmod "/modules/$m" || fail "insmod $m"
done
mkdir -p /lower /upper /newroot
mount -t 9p -o {_NINEP},ro,cache=loose {ROOT_TAG} /lower || fail "mount of the host root"
mount -t tmpfs -o mode=0755 upper /upper
mkdir -p /upper/data /upper/work
mount -t overlay -o lowerdir=/lower,upperdir=/upper/data,workdir=/upper/work overlay /newroot \\
  || fail "overlay root"
mount -t tmpfs -o mode=0755,nosuid,nodev run /newroot/run
mkdir -p /newroot{GUEST_CTL}
mount -t 9p -o {_NINEP} {CTL_TAG} /newroot{GUEST_CTL} || fail "mount of the control folder"
mount -t tmpfs -o mode=1777,nosuid,nodev tmp /newroot/tmp
share="$(cat /newroot{GUEST_CTL}/share)"
mkdir -p "/newroot$share"
# cache=loose: only the guest touches the share while it runs, and imports are faster with it.
mount -t 9p -o {_NINEP},cache=loose {SHARE_TAG} "/newroot$share" || fail "mount of $share"
mount --move /proc /newroot/proc
mount --move /sys /newroot/sys
mount --move /dev /newroot/dev
exec switch_root /newroot /bin/sh {GUEST_CTL}/stage2.sh
"""


class InitramfsError(RuntimeError):
    """A module the boot needs is missing or cannot be read."""


# ------------------------------------------------------------------------------- cpio (newc)


@dataclass(frozen=True)
class Entry:
    """One archive member: a directory, a regular file or a symlink (``data`` = target)."""

    name: str
    mode: int
    data: bytes = b""


def _pad(n: int) -> bytes:
    return b"\0" * (-n % 4)


def newc(entries: Iterable[Entry], *, mtime: int = 0) -> bytes:
    """A newc ("070701") cpio archive of ``entries``, with the trailer."""
    out = bytearray()
    for ino, entry in enumerate([*entries, Entry("TRAILER!!!", 0)], start=1):
        name = entry.name.encode() + b"\0"
        nlink = 2 if stat.S_ISDIR(entry.mode) else 1
        fields = (ino, entry.mode, 0, 0, nlink, mtime, len(entry.data), 0, 0, 0, 0, len(name), 0)
        header = b"070701" + b"".join(b"%08X" % f for f in fields)
        out += header + name + _pad(len(header) + len(name))
        out += entry.data + _pad(len(entry.data))
    return bytes(out)


def parse_newc(blob: bytes) -> list[Entry]:
    """The members of a newc archive (for checks), trailer excluded."""
    entries: list[Entry] = []
    pos = 0
    while True:
        if blob[pos : pos + 6] != b"070701":
            raise ValueError(f"bad cpio magic at {pos}")
        fields = [int(blob[pos + 6 + 8 * i : pos + 14 + 8 * i], 16) for i in range(13)]
        mode, size, namesize = fields[1], fields[6], fields[11]
        pos += 110
        name = blob[pos : pos + namesize - 1].decode()
        pos += namesize + (-(110 + namesize) % 4)
        data = blob[pos : pos + size]
        pos += size + (-size % 4)
        if name == "TRAILER!!!":
            return entries
        entries.append(Entry(name, mode, data))


# ------------------------------------------------------------------------------------ modules


def _mod_name(path: str) -> str:
    base = path.rsplit("/", 1)[-1]
    return base.split(".ko", 1)[0].replace("-", "_")


def _parse_dep(text: str) -> dict[str, tuple[str, list[str]]]:
    """modules.dep: name -> (path, dependency paths)."""
    table: dict[str, tuple[str, list[str]]] = {}
    for line in text.splitlines():
        if ":" not in line:
            continue
        path, _, deps = line.partition(":")
        table[_mod_name(path)] = (path.strip(), deps.split())
    return table


def load_order(modules_dir: Path, wanted: Sequence[str]) -> list[str]:
    """Paths (relative to ``modules_dir``) to insert, dependencies first; built-ins skipped."""
    table = _parse_dep((modules_dir / "modules.dep").read_text())
    builtin_path = modules_dir / "modules.builtin"
    builtin = set()
    if builtin_path.exists():
        builtin = {_mod_name(p) for p in builtin_path.read_text().split()}
    order: list[str] = []
    for name in wanted:
        name = name.replace("-", "_")
        if name in builtin:
            continue
        if name not in table:
            raise InitramfsError(f"module {name} is neither built in nor in {modules_dir}")
        path, deps = table[name]
        # modules.dep lists the deepest dependencies last: insert them first.
        for p in [*reversed(deps), path]:
            if p not in order:
                order.append(p)
    return order


def module_bytes(path: Path) -> bytes:
    """A module's ELF bytes (busybox insmod takes them as they are, so decompress here)."""
    data = path.read_bytes()
    if path.name.endswith(".ko.xz"):
        return lzma.decompress(data)
    if path.name.endswith(".ko.gz"):
        return gzip.decompress(data)
    if path.name.endswith(".ko.zst"):
        if shutil.which("zstd") is None:
            raise InitramfsError(f"{path.name} is zstd-compressed and zstd is missing")
        return subprocess.run(["zstd", "-dcq"], input=data, capture_output=True, check=True).stdout
    return data


# ------------------------------------------------------------------------------------ archive


def is_static_elf(path: Path) -> bool:
    """True for an ELF executable without an interpreter (runs with no libraries around)."""
    try:
        with path.open("rb") as f:
            head = f.read(64)
            if head[:4] != b"\x7fELF" or head[4] != 2:  # 64-bit ELF only
                return False
            order: Literal["little", "big"] = "little" if head[5] == 1 else "big"
            phoff = int.from_bytes(head[32:40], order)
            phentsize = int.from_bytes(head[54:56], order)
            phnum = int.from_bytes(head[56:58], order)
            f.seek(phoff)
            table = f.read(phentsize * phnum)
    except OSError:
        return False
    for i in range(phnum):
        if int.from_bytes(table[i * phentsize : i * phentsize + 4], order) == 3:  # PT_INTERP
            return False
    return True


def find_busybox() -> Path | None:
    """A static busybox (package busybox-static), or None."""
    for cand in ("/bin/busybox", "/usr/bin/busybox", shutil.which("busybox")):
        if cand and is_static_elf(Path(cand)):
            return Path(cand)
    return None


def entries(busybox: Path, modules_dir: Path, wanted: Sequence[str]) -> list[Entry]:
    """The archive's members: /init, /bin/busybox, /modules/* and /modules.order."""
    order = load_order(modules_dir, wanted)
    members = [
        Entry("bin", stat.S_IFDIR | 0o755),
        Entry("bin/busybox", stat.S_IFREG | 0o755, busybox.read_bytes()),
        Entry("init", stat.S_IFREG | 0o755, INIT_SCRIPT.encode()),
        Entry("modules", stat.S_IFDIR | 0o755),
    ]
    names: list[str] = []
    for rel in order:
        name = f"{_mod_name(rel)}.ko"
        names.append(name)
        members.append(
            Entry(f"modules/{name}", stat.S_IFREG | 0o644, module_bytes(modules_dir / rel))
        )
    members.append(Entry("modules.order", stat.S_IFREG | 0o644, ("\n".join(names) + "\n").encode()))
    return members


def build(cache: Path, release: str, modules_dir: Path, busybox: Path) -> Path:
    """The initramfs for ``release`` (built once per content, then taken from the cache)."""
    members = entries(busybox, modules_dir, BOOT_MODULES)
    blob = newc(members)
    digest = hashlib.sha256(blob).hexdigest()[:16]
    out_dir = cache / "initramfs"
    out = out_dir / f"{release}-{digest}.cpio"
    if out.exists():
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}")
    tmp.write_bytes(blob)
    tmp.replace(out)
    for old in out_dir.glob(f"{release}-*.cpio"):
        if old != out:
            old.unlink(missing_ok=True)
    return out
