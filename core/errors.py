"""Errors that name the object and the field a user has to fix."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kubeplex.core.model import IPFamily


class KubeplexError(Exception):
    """Base of every error kubeplex reports to a user."""


class FieldError(KubeplexError):
    """One bad field: ``path`` is dotted (``iptables.minSyncPeriod``), ``message`` says why."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message


class InvalidObject(KubeplexError):
    """An object (a config file, a Service, an EndpointSlice) with one or more bad fields.

    ``where`` names the object, e.g. ``Service default/web`` or ``config.yaml``.
    """

    def __init__(self, where: str, errors: Iterable[FieldError]) -> None:
        self.where = where
        self.errors: Sequence[FieldError] = tuple(errors)
        lines = "; ".join(str(e) for e in self.errors)
        super().__init__(f"{where}: {lines}" if where else lines)


class BackendError(KubeplexError):
    """A dataplane could not render or apply; the message says what the kernel holds.

    ``families`` are the IP families whose sync failed (None: all of them), so failure
    metrics count only those.
    """

    def __init__(self, message: str, families: Iterable[IPFamily] | None = None) -> None:
        super().__init__(message)
        self.families: tuple[IPFamily, ...] | None = None if families is None else tuple(families)
