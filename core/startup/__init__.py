"""What kubeplex does to start sooner, in one place, with one switch that turns it all off.

- :mod:`~kubeplex.core.startup.codecache`: the methods ``@dataclass`` writes, compiled when the
  image is built and read at each start;
- :mod:`~kubeplex.core.startup.packages`: the ``kubernetes`` package registered without running
  its ``__init__``;
- :mod:`~kubeplex.core.startup.deferred`: the kubeconfig loader imported without what only its
  OIDC token refresh calls;
- :mod:`~kubeplex.core.startup.collector`: the one owner of the cyclic garbage collector, paused
  while work allocates much and frees little, and frozen once after the initial lists.

Each reaches into Python or an outside package. ``KUBEPLEX_STARTUP_TRICKS=0`` in the
environment turns every one off, so that after an upgrade of Python or a dependency a start
with and without them (tests/api/test_startup_switch.py) says whether they still hold. This
package imports nothing of kubeplex: every layer may use it.
"""

from __future__ import annotations

import os

__all__ = ["SWITCH", "enabled"]

#: The environment variable that turns the start-up tricks off when it is ``0``.
SWITCH = "KUBEPLEX_STARTUP_TRICKS"


def enabled() -> bool:
    """True unless the environment turns the tricks off (``KUBEPLEX_STARTUP_TRICKS=0``)."""
    return os.environ.get(SWITCH, "1").strip() != "0"
