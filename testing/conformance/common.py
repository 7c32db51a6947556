"""What both suites of the conformance kit share: cases, results, skips, capability gates."""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

Outcome = Literal["pass", "fail", "skip"]

#: The capabilities the kit acts on: a case that needs one runs only for a backend that
#: declares it (in its class and in the trust list; ``capabilities-declared`` checks both
#: agree). Nothing is skipped by mode name.
KIT_CAPABILITIES = frozenset(
    {
        "ipv6",
        "load-balancer-source-ranges",
        "localhost-nodeports",
        "reject-unused-clusterip-ports",
        "render-only",
        "session-affinity",
        "socket-load-balancing",
    }
)


class Skip(Exception):
    """A check that cannot run here (says why); neither a pass nor a failure."""


@dataclass(frozen=True)
class Case:
    suite: str
    name: str
    doc: str
    func: Callable[[Any], None]
    #: Capabilities the backend must declare for the case to run at all.
    needs: frozenset[str] = field(default_factory=frozenset)

    def skip_reason(self, capabilities: Iterable[str]) -> str | None:
        """Why this case does not apply to a backend with ``capabilities``, or None."""
        missing = sorted(self.needs - frozenset(capabilities))
        if missing:
            return f"the backend does not declare {', '.join(missing)}"
        return None


def case(suite: str, name: str, doc: str, func: Callable[[Any], None], *needs: str) -> Case:
    unknown = set(needs) - KIT_CAPABILITIES
    assert not unknown, f"case {name} needs capabilities the kit does not know: {unknown}"
    return Case(suite, name, doc, func, frozenset(needs))


@dataclass(frozen=True)
class Result:
    suite: str
    name: str
    outcome: Outcome
    detail: str = ""
    seconds: float = 0.0


def check(condition: object, message: str) -> None:
    """An assertion that survives ``python -O`` and says what went wrong."""
    if not condition:
        raise AssertionError(message)


def diff(message: str, a: object, b: object) -> str:
    la, lb = str(a).splitlines(), str(b).splitlines()
    for i, (x, y) in enumerate(zip(la, lb, strict=False)):
        if x != y:
            return f"{message}: line {i + 1}: {x!r} != {y!r}"
    return f"{message}: {len(la)} lines vs {len(lb)}"


def text_arguments(args: Iterable[object]) -> list[str]:
    """The texts among a seam call's arguments (a text, or a sequence of texts or of values
    that print as what they send, like the IPVS mode's operations), in order.

    Enum members are labels (an IP family), not texts sent to the kernel.
    """
    out: list[str] = []
    for arg in args:
        if isinstance(arg, enum.Enum):
            continue
        if isinstance(arg, str):
            out.append(arg)
        elif isinstance(arg, list | tuple):
            out += [str(a) for a in arg if _prints_as_sent(a)]
    return out


def _prints_as_sent(value: object) -> bool:
    if isinstance(value, enum.Enum):
        return False
    return isinstance(value, str) or type(value).__str__ is not object.__str__
