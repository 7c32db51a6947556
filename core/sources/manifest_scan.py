"""What a manifest folder holds right now: its files and their stat keys, and what could not be
read (a folder without permission, one that vanished mid-walk, a missing root).

Hidden names (a leading dot) are skipped: that is how kubelet lays out a ConfigMap volume
(``..data`` and ``..2026_01_01_00_00_00.123`` hold the data, the visible names are symlinks
through ``..data``), and how editors name their temporary files. Symlinks are followed; a file
or folder reached twice (by a link or a loop) is read once, under its first name.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

SUFFIXES = (".yaml", ".yml", ".json")

#: What identifies one version of a file: a rewrite, a rename over it (the ConfigMap ``..data``
#: swap), a chmod or a truncation each change it.
StatKey = tuple[int, int, int, int, int]


def stat_key(st: os.stat_result) -> StatKey:
    return (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_mode)


@dataclass(frozen=True)
class FolderScan:
    #: Every manifest file by path, in sorted order, with its stat key.
    files: dict[Path, StatKey] = field(default_factory=dict)
    #: Folders and files that could not be looked at, and why.
    unreadable: dict[Path, str] = field(default_factory=dict)
    #: Why the root itself cannot be read (missing, no permission), or None.
    root_error: str | None = None

    @property
    def signature(self) -> tuple[object, ...]:
        """Equal for two scans exactly when nothing visible changed."""
        return (
            self.root_error,
            tuple(self.files.items()),
            tuple(sorted(self.unreadable.items())),
        )


def _why(err: OSError) -> str:
    return err.strerror or str(err)


def scan(root: Path) -> FolderScan:
    try:
        st = root.stat()
    except FileNotFoundError:
        return FolderScan(root_error="does not exist")
    except OSError as err:
        return FolderScan(root_error=f"cannot be read: {_why(err)}")
    if not stat.S_ISDIR(st.st_mode):
        return FolderScan(files={root: stat_key(st)})
    files: dict[Path, StatKey] = {}
    unreadable: dict[Path, str] = {}
    seen_dirs = {(st.st_dev, st.st_ino)}
    seen_files: set[tuple[int, int]] = set()
    pending = [root]
    while pending:
        folder = pending.pop()
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as err:
            if folder == root:
                return FolderScan(root_error=f"cannot be read: {_why(err)}")
            unreadable[folder] = f"cannot read folder: {_why(err)}"
            continue
        subfolders = []
        for entry in entries:
            if entry.name.startswith("."):
                continue
            path = Path(entry.path)
            try:
                est = entry.stat()  # follows symlinks
            except FileNotFoundError:
                continue  # a dangling symlink, or gone since the listing: not a file now
            except OSError as err:
                unreadable[path] = f"cannot read: {_why(err)}"
                continue
            ident = (est.st_dev, est.st_ino)
            if stat.S_ISDIR(est.st_mode):
                if ident not in seen_dirs:
                    seen_dirs.add(ident)
                    subfolders.append(path)
            elif stat.S_ISREG(est.st_mode) and path.suffix in SUFFIXES and ident not in seen_files:
                seen_files.add(ident)
                files[path] = stat_key(est)
        pending.extend(reversed(subfolders))  # depth first, in name order
    return FolderScan(dict(sorted(files.items())), unreadable)
