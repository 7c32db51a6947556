"""The HTTP serving loop the health and metrics servers run on, one per test."""

from __future__ import annotations

from collections.abc import Iterator

from kubeplex.core.daemon.httpserving import HTTPServing


def serving_loop() -> Iterator[HTTPServing]:
    """A running loop, stopped afterwards (a ``serving`` fixture yields from this)."""
    loop = HTTPServing()
    try:
        yield loop
    finally:
        loop.stop()
