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


#: Where modprobe reads its configuration, in kmod's order: a file hides a file of the same
#: name in a later folder.
MODPROBE_DIRS = (
    "etc/modprobe.d",
    "run/modprobe.d",
    "usr/local/lib/modprobe.d",
    "lib/modprobe.d",
    "usr/lib/modprobe.d",
)
#: Commands an ``install`` rule runs to make a module unloadable (the usual way to disable one).
_REFUSING = frozenset({"false", "true"})


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _modprobe_rules(root: Path) -> list[tuple[Path, list[str]]]:
    """Every rule of the modprobe configuration (file, words), continuation lines joined."""
    files: dict[str, Path] = {}
    for folder in MODPROBE_DIRS:
        try:
            found = sorted((root / folder).glob("*.conf"))
        except OSError:
            continue
        for f in found:
            files.setdefault(f.name, f)
    rules = []
    for name in sorted(files):
        text = _read(files[name]) or ""
        for line in text.replace("\\\n", " ").splitlines():
            words = line.split("#", 1)[0].split()
            if words:
                rules.append((files[name], words))
    return rules


def _cmdline_list(cmdline: str, key: str) -> set[str]:
    """The modules a ``key=a,b`` kernel parameter names (every occurrence)."""
    out: set[str] = set()
    for word in cmdline.split():
        if word.startswith(f"{key}="):
            out |= {m.replace("-", "_") for m in word.split("=", 1)[1].split(",") if m}
    return out


def _basename(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def _same(module: str, wanted: str) -> bool:
    """Whether ``module`` names ``wanted`` (the kernel takes - and _ as one)."""
    return module.replace("-", "_") == wanted


def _listed(index: str, wanted: str) -> bool:
    """Whether a modules.dep or modules.builtin text lists module ``wanted``."""
    return any(
        _same(_basename(line.split(":", 1)[0].strip()).split(".ko", 1)[0], wanted)
        for line in index.splitlines()
    )


def module_unavailable(
    name: str, release: str | None = None, *, on_demand: bool = True, root: Path = Path("/")
) -> str | None:
    """Why kernel module ``name`` is neither there nor loadable on this node, naming what is
    missing or what stops it; None when it is loaded, built in or loadable.

    ``on_demand``: the kernel loads it through one of its aliases (a generic netlink family,
    a link kind, an nfnetlink subsystem), which a modprobe.d ``blacklist`` stops; a module the
    kernel asks for by its own name (an IPVS scheduler) is loaded despite one. ``root``: where
    the node's /sys, /proc, /lib/modules and modprobe.d are (another tree in tests).
    """
    wanted = name.replace("-", "_")
    if (root / "sys/module" / wanted).exists():
        return None
    moddir = root / "lib/modules" / (release or _platform.release())
    builtin = _read(moddir / "modules.builtin")
    if builtin is not None and _listed(builtin, wanted):
        return None
    lack = f"kernel module {name!r} is not loaded"
    if (_read(root / "proc/sys/kernel/modules_disabled") or "").strip() == "1":
        return f"{lack}, and this kernel loads no more modules (kernel.modules_disabled = 1)"
    cmdline = _read(root / "proc/cmdline") or ""
    if wanted in _cmdline_list(cmdline, "module_blacklist"):
        return f"{lack}, and the kernel command line forbids it (module_blacklist={name})"
    if not moddir.is_dir():
        return f"{lack}, and {moddir}, where it would be loaded from, does not exist"
    dep = _read(moddir / "modules.dep")
    if dep is None:
        return f"{lack}, and {moddir} has no modules.dep to load it from"
    if not _listed(dep, wanted):
        return f"{lack}, built in or in {moddir / 'modules.dep'}"
    if (_read(root / "proc/sys/kernel/modprobe") or "x").strip() == "":
        return f"{lack}, and the kernel loads no module on demand (kernel.modprobe is empty)"
    rules = [(path, w) for path, w in _modprobe_rules(root) if w[1:2] and _same(w[1], wanted)]
    for path, words in rules:
        if words[0] == "install" and words[2:3] and _basename(words[2]) in _REFUSING:
            return f"{lack}, and {path} runs `{' '.join(words[2:])}` instead of loading it"
    if not on_demand:
        return None
    where = [str(path) for path, words in rules if words[0] == "blacklist"]
    if wanted in _cmdline_list(cmdline, "modprobe.blacklist"):
        where.append(f"the kernel command line (modprobe.blacklist={name})")
    if where:
        return (
            f"{lack} and is blacklisted in {', '.join(where)}, so the kernel does not load it "
            f"when asked: load it on the node (modprobe {name}) or lift the blacklist"
        )
    return None


def kernel_module_available(name: str, release: str | None = None) -> bool:
    """Loaded or built in, or loadable (see ``module_unavailable``)."""
    return module_unavailable(name, release) is None


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
    missing += [why for m in req.kernel_modules if (why := module_unavailable(m, release))]
    missing += [f"{p} does not exist" for p in req.paths if not os.path.exists(p)]
    if req.min_kernel and here == "linux":
        have = _release_tuple(release)
        if have < _release_tuple(req.min_kernel):
            missing.append(f"kernel {release} is older than the required {req.min_kernel}")
    return missing
