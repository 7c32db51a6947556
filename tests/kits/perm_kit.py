"""File permissions that bind even root: the calling thread drops CAP_DAC_OVERRIDE and
CAP_DAC_READ_SEARCH from its effective set for a while, so the kernel checks modes (chmod 000
means EACCES) as it would for a kube-proxy running without them. Capabilities are per thread on
Linux, and they stay in the permitted set, so they are raised again afterwards."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
from collections.abc import Iterator

_LINUX_CAPABILITY_VERSION_3 = 0x20080522
CAP_DAC_OVERRIDE = 1
CAP_DAC_READ_SEARCH = 2


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def _caps() -> tuple[_Header, ctypes.Array[_Data]]:
    header = _Header(_LINUX_CAPABILITY_VERSION_3, 0)  # pid 0: this thread
    data = (_Data * 2)()
    if _libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget failed")
    return header, data


def _set(header: _Header, data: ctypes.Array[_Data]) -> None:
    if _libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def can_drop_dac() -> bool:
    """True if this thread is root with the DAC capabilities (so dropping them means something)."""
    if os.geteuid() != 0:
        return False
    _, data = _caps()
    mask = (1 << CAP_DAC_OVERRIDE) | (1 << CAP_DAC_READ_SEARCH)
    return data[0].permitted & mask == mask


@contextlib.contextmanager
def without_dac_override() -> Iterator[None]:
    """File modes apply to this thread (root included) inside the block."""
    header, data = _caps()
    saved = data[0].effective
    data[0].effective = saved & ~((1 << CAP_DAC_OVERRIDE) | (1 << CAP_DAC_READ_SEARCH))
    _set(header, data)
    try:
        yield
    finally:
        header, data = _caps()
        data[0].effective = saved
        _set(header, data)
