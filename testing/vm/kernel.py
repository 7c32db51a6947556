"""The guest kernel: a stock distribution kernel package, fetched once into a cache folder.

The package ``linux-image-amd64`` (Debian) or ``linux-image-generic`` (Ubuntu) depends on the
versioned image package; that package (and, on Ubuntu, its ``linux-modules*`` packages) is
fetched with ``apt-get download``, unpacked with ``dpkg-deb -x`` into the cache and indexed with
``depmod -b``. Nothing is installed: the host's /boot and /lib/modules are never touched.

Cache layout: ``<cache>/kernels/<package>_<version>/`` is the unpacked tree (``boot/vmlinuz-*``,
``lib/modules/<release>/``); it appears only complete (built under a temporary name, renamed
last), so a killed fetch leaves no half tree, and two runs racing both end with one tree.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

# Meta packages that name the current kernel, in the order tried. The plain flavour: Debian's
# cloud flavour has IPVS but no 9p, which the guest's root filesystem needs.
META_PACKAGES = ("linux-image-amd64", "linux-image-generic")
_IMAGE_RE = re.compile(r"linux-image-(?:unsigned-)?(\d[\w.+~-]*)")
_DEP_RE = re.compile(r"^\s*\|?(?:Pre)?Depends:\s*(\S+)")


class KernelError(RuntimeError):
    """The guest kernel cannot be had (no package, no apt, a failed fetch)."""


@dataclass(frozen=True)
class KernelPackage:
    """A versioned image package and the module packages that go with it."""

    name: str  # linux-image-6.1.0-57-amd64
    version: str  # 6.1.192-3
    extras: tuple[str, ...] = ()  # Ubuntu's linux-modules-<release>[-extra]

    @property
    def folder_name(self) -> str:
        return f"{self.name}_{self.version}".replace(":", "%")


@dataclass(frozen=True)
class GuestKernel:
    """An unpacked kernel in the cache."""

    root: Path  # the unpacked tree
    release: str  # uname -r of the guest

    @property
    def vmlinuz(self) -> Path:
        return self.root / "boot" / f"vmlinuz-{self.release}"

    @property
    def modules(self) -> Path:
        return self.root / "lib" / "modules" / self.release


def default_cache() -> Path:
    """``$KUBEPLEX_VM_CACHE``, else ``~/.cache/kubeplex/vm``."""
    env = os.environ.get("KUBEPLEX_VM_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "kubeplex" / "vm"


def _apt_cache(*args: str) -> str:
    if shutil.which("apt-cache") is None:
        raise KernelError("apt-cache is missing (a Debian or Ubuntu host is needed)")
    cp = subprocess.run(["apt-cache", *args], capture_output=True, text=True, check=False)
    return cp.stdout if cp.returncode == 0 else ""


def meta_depends(depends_text: str) -> dict[str, list[str]]:
    """Package -> the names it Depends/PreDepends on, from an ``apt-cache depends`` answer
    (packages apt does not know come as ``<name>`` with nothing under them)."""
    table: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in depends_text.splitlines():
        if not line.startswith(" "):
            name = line.strip()
            current = None if name.startswith("<") else table.setdefault(name, [])
            continue
        m = _DEP_RE.match(line)
        if m and current is not None:
            current.append(m.group(1))
    return table


def show_fields(show_text: str) -> tuple[str | None, list[str]]:
    """(Version, the names in Depends) of one ``apt-cache show --no-all-versions`` record."""
    version = re.search(r"^Version:\s*(\S+)", show_text, re.MULTILINE)
    deps = re.search(r"^Depends:\s*(.*)$", show_text, re.MULTILINE)
    names = []
    if deps:
        for alt in deps.group(1).split(","):
            names += [a.strip().split()[0] for a in alt.split("|") if a.strip()]
    return (version.group(1) if version else None), names


def resolve_package() -> KernelPackage:
    """The image package the distribution's meta package points at now (asks apt's lists)."""
    table = meta_depends(_apt_cache("depends", *META_PACKAGES))
    for meta in META_PACKAGES:
        deps = table.get(meta, [])
        images = [d for d in deps if _IMAGE_RE.fullmatch(d)]
        if not images:
            continue
        version, image_deps = show_fields(_apt_cache("show", "--no-all-versions", images[0]))
        if version is None:
            continue
        # Ubuntu splits the modules off the image; Debian ships them inside it.
        extras = sorted({d for d in [*deps, *image_deps] if d.startswith("linux-modules")})
        return KernelPackage(images[0], version, tuple(extras))
    raise KernelError(
        f"no kernel package found ({' or '.join(META_PACKAGES)}): run `apt-get update`"
    )


def release_of(root: Path) -> str:
    """The one kernel release an unpacked tree holds (``lib/modules/<release>``)."""
    mods = root / "lib" / "modules"
    releases = sorted(p.name for p in mods.iterdir()) if mods.is_dir() else []
    releases = [r for r in releases if (root / "boot" / f"vmlinuz-{r}").exists()]
    if len(releases) != 1:
        raise KernelError(f"{root}: expected one kernel with its vmlinuz, found {releases}")
    return releases[0]


def cached_kernels(cache: Path) -> list[GuestKernel]:
    """Complete trees in the cache, newest first (by modification time)."""
    base = cache / "kernels"
    if not base.is_dir():
        return []
    found: list[tuple[float, GuestKernel]] = []
    for d in base.iterdir():
        if d.name.startswith(".") or not (d / ".complete").exists():
            continue
        try:
            found.append((d.stat().st_mtime, GuestKernel(d, release_of(d))))
        except KernelError:
            continue
    return [k for _, k in sorted(found, key=lambda t: t[0], reverse=True)]


def lookup(cache: Path, pkg: KernelPackage) -> GuestKernel | None:
    """The cached tree of ``pkg``, if complete."""
    d = cache / "kernels" / pkg.folder_name
    if (d / ".complete").exists():
        return GuestKernel(d, release_of(d))
    return None


def fetch(cache: Path, pkg: KernelPackage) -> GuestKernel:
    """Download and unpack ``pkg`` into the cache (or return the tree already there)."""
    have = lookup(cache, pkg)
    if have is not None:
        return have
    for tool in ("apt-get", "dpkg-deb", "depmod"):
        if shutil.which(tool) is None:
            raise KernelError(f"{tool} is missing (packages apt, dpkg, kmod)")
    base = cache / "kernels"
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".fetch-", dir=base))
    try:
        debs = work / "debs"
        debs.mkdir()
        # apt's download sandbox user must be able to write there, else it warns (harmless).
        os.chmod(work, 0o755)
        os.chmod(debs, 0o777)
        names = [f"{pkg.name}={pkg.version}", *pkg.extras]
        cp = subprocess.run(
            ["apt-get", "download", "-q", *names],
            cwd=debs,
            capture_output=True,
            text=True,
            check=False,
        )
        if cp.returncode != 0:
            raise KernelError(f"apt-get download {' '.join(names)}: {cp.stderr.strip()}")
        tree = work / "tree"
        for deb in sorted(debs.glob("*.deb")):
            subprocess.run(["dpkg-deb", "-x", str(deb), str(tree)], check=True)
        shutil.rmtree(debs)
        release = release_of(tree)
        dep = subprocess.run(
            ["depmod", "-b", str(tree), release], capture_output=True, text=True, check=False
        )
        if dep.returncode != 0:
            raise KernelError(f"depmod -b {tree} {release}: {dep.stderr.strip()}")
        (tree / ".complete").write_text(f"{pkg.name} {pkg.version}\n")
        final = base / pkg.folder_name
        try:
            tree.rename(final)
        except OSError:
            # Another run finished first: use its tree.
            if lookup(cache, pkg) is None:
                raise
        _prune(base, keep=final)
        return GuestKernel(final, release)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _prune(base: Path, keep: Path) -> None:
    """Remove the trees of older packages (a new one replaces them)."""
    for d in base.iterdir():
        if d != keep and not d.name.startswith(".") and (d / ".complete").exists():
            shutil.rmtree(d, ignore_errors=True)


def ensure(cache: Path | None = None) -> GuestKernel:
    """The guest kernel: the current package's tree, fetched if missing.

    When apt cannot name the current package (no lists, offline), the newest cached tree is
    used, so a machine that fetched once keeps working.
    """
    cache = cache or default_cache()
    try:
        pkg = resolve_package()
    except KernelError:
        have = cached_kernels(cache)
        if have:
            return have[0]
        raise
    return fetch(cache, pkg)


def available(cache: Path | None = None) -> str | None:
    """None when a kernel is cached or can be fetched; else why not, in one line."""
    cache = cache or default_cache()
    if cached_kernels(cache):
        return None
    try:
        pkg = resolve_package()
    except KernelError as exc:
        return str(exc)
    if lookup(cache, pkg) is not None:
        return None
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            return f"{tool} is missing: the guest kernel package cannot be fetched"
    return None
