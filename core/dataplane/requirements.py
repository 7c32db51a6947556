"""What a backend needs on a node (``[backends.MODE.requires]``), and what this node lacks."""

from __future__ import annotations

import os
import platform as _platform
import re
import shutil
import sys
from pathlib import Path

from kubeplex.core.dataplane.trust import TrustedBackend


def this_platform() -> str:
    return "windows" if sys.platform == "win32" else sys.platform


def _release_tuple(release: str) -> tuple[int, ...]:
    m = re.match(r"\d+(\.\d+)*", release)
    return tuple(int(p) for p in m.group(0).split(".")) if m else ()


def kernel_module_available(name: str, release: str | None = None) -> bool:
    """Loaded or built in (``/sys/module``), or loadable (``modules.builtin``/``modules.dep``)."""
    wanted = name.replace("-", "_")
    if Path("/sys/module", wanted).exists():
        return True
    moddir = Path("/lib/modules", release or _platform.release())
    for index in ("modules.builtin", "modules.dep"):
        try:
            text = (moddir / index).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            base = line.split(":", 1)[0].rsplit("/", 1)[-1]
            if base.split(".ko", 1)[0].replace("-", "_") == wanted:
                return True
    return False


def missing_on_node(entry: TrustedBackend) -> list[str]:
    """What this node lacks of what ``entry`` declares (empty: all there)."""
    here = this_platform()
    missing: list[str] = []
    if here not in entry.platforms:
        missing.append(f"platform {' or '.join(entry.platforms)} required, this node runs {here}")
        return missing  # the rest describes another kind of node
    req = entry.requires
    missing += [
        f"executable {t!r} not found in PATH" for t in req.executables if not shutil.which(t)
    ]
    release = _platform.release()
    missing += [
        f"kernel module {m!r} is not loaded, built in or loadable "
        f"(/sys/module, /lib/modules/{release})"
        for m in req.kernel_modules
        if not kernel_module_available(m, release)
    ]
    missing += [f"{p} does not exist" for p in req.paths if not os.path.exists(p)]
    if req.min_kernel and here == "linux":
        have = _release_tuple(release)
        if have < _release_tuple(req.min_kernel):
            missing.append(f"kernel {release} is older than the required {req.min_kernel}")
    return missing
