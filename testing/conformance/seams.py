"""Wrappers around a backend's kernel seam: one that refuses every write, one that records them.

Both go by the seam's own ``writes`` class attribute (the contract: the methods through which
``apply`` writes), so they work for any backend whose seam declares it; every other method
is the real seam's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from kubeplex.core.dataplane.backend import Backend
from kubeplex.core.model.errors import BackendError
from kubeplex.testing.conformance.common import Skip, check, text_arguments

#: What a refused write says (the kit looks for it in the sync's error).
REFUSAL = "simulated kernel refusal"


def writes_of(kernel: object) -> tuple[str, ...]:
    """The seam's write methods; AssertionError if it declares none (the contract asks it)."""
    writes = getattr(type(kernel), "writes", None)
    check(
        isinstance(writes, tuple) and writes and all(isinstance(w, str) for w in writes),
        f"the kernel seam {type(kernel).__name__} declares no `writes` (a tuple of the "
        "methods apply writes through)",
    )
    assert isinstance(writes, tuple)
    missing = [w for w in writes if not callable(getattr(kernel, w, None))]
    check(not missing, f"{type(kernel).__name__}.writes names methods it lacks: {missing}")
    return writes


class _Wrapped:
    """Forwards everything to ``inner``; the methods in ``writes`` go through ``on_write``."""

    def __init__(
        self, inner: object, writes: tuple[str, ...], on_write: Callable[[str, Any], Any]
    ) -> None:
        self._inner = inner
        self._writes = writes
        self._on_write = on_write
        self.writes = writes

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name in self._writes:
            return lambda *args, **kwargs: self._on_write(name, (attr, args, kwargs))
        return attr


def refusing(kernel: object) -> _Wrapped:
    """The seam, with every write raising BackendError (as a kernel refusing the input)."""

    def refuse(name: str, call: Any) -> Any:
        raise BackendError(f"{REFUSAL} ({type(kernel).__name__}.{name})")

    return _Wrapped(kernel, writes_of(kernel), refuse)


class Recorder:
    """The seam, with every text handed to a write method recorded before it is sent (a call
    with bytes among its arguments as one text of the method and its arguments)."""

    def __init__(self, kernel: object) -> None:
        self.sent: list[str] = []
        self.seam = _Wrapped(kernel, writes_of(kernel), self._write)

    def _write(self, name: str, call: Any) -> Any:
        method, args, kwargs = call
        values = [*args, *kwargs.values()]
        if any(isinstance(v, bytes) for v in values):
            # A call of raw values (a BPF map operation) is one text: the method, then its
            # arguments, bytes in hex ("update kpx_svc4 KEYHEX VALUEHEX").
            self.sent.append(
                " ".join([name, *(v.hex() if isinstance(v, bytes) else str(v) for v in values)])
            )
        else:
            self.sent += text_arguments(values)
        return method(*args, **kwargs)


def seam_of(backend: Backend) -> object:
    """The backend's kernel seam; Skip for a backend without one (nothing to wrap)."""
    kernel = getattr(backend, "kernel", None)
    if kernel is None:
        raise Skip("the backend has no kernel seam (Backend.kernel is None)")
    return kernel


@contextlib.contextmanager
def swapped(backend: Backend, seam: object) -> Iterator[None]:
    """``backend.kernel`` is ``seam`` inside the block, the real one again after it."""
    real = backend.kernel
    backend.kernel = seam
    try:
        yield
    finally:
        backend.kernel = real
