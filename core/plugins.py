"""Finding dataplane backends: the ``kubeplex.backends`` entry-point group, through stevedore.

Only the selected backend's module is imported: listing uses entry-point metadata alone.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

from stevedore import DriverManager

from kubeplex.core.backend import Backend, BackendContext
from kubeplex.core.errors import KubeplexError

GROUP = "kubeplex.backends"
BUILTIN_MODES = ("iptables", "nftables", "ipvs", "kernelspace")


def available() -> dict[str, EntryPoint]:
    """Installed backends by mode name, without importing any of them."""
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def known_modes() -> tuple[str, ...]:
    return tuple(sorted(set(BUILTIN_MODES) | set(available())))


def load_backend(mode: str, ctx: BackendContext) -> Backend:
    if mode not in available():
        installed = ", ".join(sorted(available())) or "none"
        raise KubeplexError(f"mode {mode!r}: no backend installed for it (installed: {installed})")
    try:
        manager: DriverManager[type[Backend]] = DriverManager(
            GROUP, mode, invoke_on_load=False, on_load_failure_callback=_reraise
        )
    except KubeplexError:
        raise
    except Exception as err:
        raise KubeplexError(f"backend {mode!r} failed to load: {err}") from err
    cls = manager.driver
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise KubeplexError(f"backend {mode!r}: entry point is not a kubeplex Backend class")
    return cls(ctx)


def _reraise(_manager: object, entry_point: EntryPoint, err: BaseException) -> None:
    raise KubeplexError(
        f"backend {entry_point.name!r} ({entry_point.value}) failed to import: {err!r}"
    ) from err
