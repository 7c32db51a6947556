"""Errors that name the object and the field a user has to fix."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


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
    """A dataplane could not render or apply; the previous rules stay in place."""
