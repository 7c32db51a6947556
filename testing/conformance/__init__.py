"""The conformance kit for dataplane backends: run it against any backend by its mode name.

One mode-neutral suite in two tiers, both loading the backend the way ``kubeplex run`` does
(its entry point, allowed by the trust list in effect; ``--plugins FILE`` or
``plugins_file=`` to use another list):

* **render** (``render.py``) — no root needed: the render contract (full, deterministic, pure,
  ``invalidate``, partial renders after an apply) and what the other hooks say of an applied
  state (``apply`` sends exactly ``kernel_inputs()``, ``inspect`` reads it back, ``cleanup``
  reports and ``leftovers`` is empty after it). What needs an applied state is applied to the
  mode's in-memory kernel of ``kubeplex.testing.fakes`` where there is one, else inside a
  private network namespace (root) or in place.
* **kernel** (``kernel.py``, ``dualstack.py``) — root, network namespaces: traffic in the
  two-node lab (ClusterIP spread, NodePorts, traffic policies, affinity, hairpin, UDP,
  LoadBalancer IPs and source ranges, scaling), and the kernel's own account of it through
  the contract: ``inspect`` (even split, counters a partial sync keeps), ``leftovers`` (after a
  removal, after ``cleanup``), and a kernel seam whose ``writes`` refuse (the old rules
  stay). All cases share one lab per mode, dual-stack if the backend declares ``ipv6``.
  Skipped for a backend that declares ``render-only``.

A case that needs a capability (``session-affinity``, ``ipv6``, ``localhost-nodeports``,
``load-balancer-source-ranges``, ``reject-unused-clusterip-ports``) runs only for a backend
that declares it; where ``inspect`` returns None (the contract's "cannot read back"), the
cases check traffic only, and those about counters are skipped.

From a shell (prints a pass/fail table; exit 0 if nothing failed, 1 otherwise)::

    python -m kubeplex.testing.conformance MODE [--kernel] [--plugins FILE] [--only CHECK]

From pytest, in a backend package's tests::

    from kubeplex.testing.conformance import kernel_tests, render_contract_tests

    test_render_contract = render_contract_tests("recording", plugins_file="plugins.toml")
    TestKernel = kernel_tests("recording", plugins_file="plugins.toml")
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from kubeplex.testing.conformance.common import KIT_CAPABILITIES, Case, Result, Skip
from kubeplex.testing.conformance.render import (
    NEW_ENDPOINT,
    RENDER_CASES,
    RenderSubject,
    feed,
    one_endpoint_more,
    seed_objects,
)
from kubeplex.testing.conformance.runner import (
    ALL_CASES,
    KERNEL_CASES,
    ModeKit,
    kernel_unavailable,
    linux_modes,
    main,
    run,
    table,
)

__all__ = [
    "ALL_CASES",
    "KERNEL_CASES",
    "KIT_CAPABILITIES",
    "NEW_ENDPOINT",
    "RENDER_CASES",
    "Case",
    "ModeKit",
    "RenderSubject",
    "Result",
    "Skip",
    "feed",
    "kernel_tests",
    "kernel_unavailable",
    "linux_modes",
    "main",
    "one_endpoint_more",
    "params",
    "render_contract_tests",
    "run",
    "seed_objects",
    "table",
]

PluginsFile = str | os.PathLike[str] | None


# pytest is imported only by those who use the kit from pytest.
def render_contract_tests(mode: str, *, plugins_file: PluginsFile = None) -> Callable[..., None]:
    """A pytest test function, one test per render check: ``test_x = render_contract_tests(m)``."""
    from kubeplex.testing.conformance import harness

    return harness.render_contract_tests(mode, plugins_file=plugins_file)


def kernel_tests(mode: str, *, plugins_file: PluginsFile = None) -> type:
    """A pytest test class (one lab for all its tests), marked ``kernel``."""
    from kubeplex.testing.conformance import harness

    return harness.kernel_tests(mode, plugins_file=plugins_file)


def params(cases: Sequence[Case] = ALL_CASES) -> list[Any]:
    """Each case as a ``pytest.param`` (id: its name; kernel cases marked ``kernel``)."""
    from kubeplex.testing.conformance import harness

    return harness.params(cases)
