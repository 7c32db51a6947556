"""The cluster state as the API source fills it: closed until the initial lists are complete,
and never seen halfway through a relist."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable
from typing import Any

from kubeplex.core.model.cluster import ClusterState, ErrorSink
from kubeplex.core.model.errors import KubeplexError
from kubeplex.core.model.graph import ProxyState
from kubeplex.core.model.types import IPFamily


class GatedClusterState(ClusterState):
    """A :class:`ClusterState` that cannot be checked out before the initial sync, nor in the
    middle of a relist.

    ``checkout()`` blocks until :meth:`open` (the API source calls it once the Services,
    EndpointSlices and Node lists are all complete) and takes the batch lock, which the source
    holds while it applies a relist: a sync sees the cluster before or after a relist, never
    half of one, and never a cluster whose lists are incomplete (which would delete the rules
    of every Service not listed yet).
    """

    def __init__(
        self,
        node_name: str,
        families: Iterable[IPFamily] = (IPFamily.IPv4, IPFamily.IPv6),
        on_invalid: ErrorSink | None = None,
    ) -> None:
        super().__init__(node_name, families, on_invalid)
        self._gate = threading.Condition(threading.RLock())
        self._open = False
        self._closed = False

    def batch(self) -> contextlib.AbstractContextManager[Any]:
        """Hold while applying several changes that must be seen together."""
        return self._gate

    def open(self) -> None:
        with self._gate:
            self._open = True
            self._gate.notify_all()

    def close(self) -> None:
        """The source gave up: a blocked checkout raises instead of waiting forever."""
        with self._gate:
            self._closed = True
            self._gate.notify_all()

    @property
    def is_open(self) -> bool:
        return self._open

    def checkout(self, full: bool = False) -> ProxyState:
        with self._gate:
            while not self._open:
                if self._closed:
                    raise KubeplexError(
                        "the Kubernetes API source stopped before its initial sync: "
                        "nothing may be programmed from an incomplete cluster"
                    )
                self._gate.wait()
            return super().checkout(full)
