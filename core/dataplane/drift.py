"""Drift: where what the kernel holds for a Service port (``Backend.inspect``) differs from
what kubeplex would program now (``kubeplex.core.model.expectations``).

The kernel's entry lines are each mode's own syntax (rules, map elements, virtual services);
they are read here only for what every syntax prints as words: host addresses (``10.0.0.1``,
``10.0.0.1/32``, ``[fd00::1]:80``, ``10.0.0.1:80/tcp``), port numbers, and the verdict words
REJECT, DROP and ACCEPT (anything else forwards). Comments are left out first, so a Service's
name never counts.

Besides, a mode compares the chains it owns whole, rule by rule in its own syntax
(``diff_rules``, with the mode's key of a rule): any rule there it did not render is drift.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from difflib import SequenceMatcher

from kubeplex.core.dataplane.backend import ProgrammedService, RuleDrift
from kubeplex.core.model.expectations import (
    DROP,
    FORWARD,
    NODE_PORT,
    REJECT,
    Expectation,
    Frontend,
)

ACCEPT = "accept"
#: Shares closer than this are the same (iptables prints probabilities to 10 digits).
SHARE_TOLERANCE = 0.01

_COMMENTS = re.compile(r'(?:--comment|comment) (?:"[^"]*"|\S+)|"[^"]*"')
_BRACKETED = re.compile(r"^\[([0-9a-fA-F:.]+)\](?::(\d+))?$")
_PORTED4 = re.compile(r"^(\d+\.\d+\.\d+\.\d+):(\d+)$")
#: A protocol after an address and port (the ebpf mode's map keys: ``10.0.0.1:80/tcp``).
_PROTOCOL_SUFFIX = re.compile(r"(:\d+)/(?:tcp|udp|sctp)$", re.IGNORECASE)
_STRIP = "{}();,"


@dataclass(frozen=True)
class EntryFacts:
    """What one entry line says, whatever its syntax."""

    line: str
    addresses: frozenset[str]
    #: Networks that are not one host (e.g. 127.0.0.0/8), as the line prints them.
    networks: frozenset[str]
    ports: frozenset[int]
    verdict: str

    @property
    def loopback(self) -> bool:
        """The line is for loopback destinations (localhost NodePorts)."""
        nets = (ipaddress.ip_network(n, strict=False) for n in self.networks)
        return any(n.is_loopback for n in nets) or any(
            ipaddress.ip_address(a).is_loopback for a in self.addresses
        )


def read_entry(line: str) -> EntryFacts:
    addresses: set[str] = set()
    networks: set[str] = set()
    ports: set[int] = set()
    verdict = FORWARD
    for raw in _COMMENTS.sub(" ", line).split():
        token = raw.strip(_STRIP)
        lowered = token.lower()
        if lowered == "reject" or lowered.startswith("reject-"):
            verdict = REJECT
        elif lowered == "drop" and verdict != REJECT:
            verdict = DROP
        elif lowered == "accept" and verdict == FORWARD:
            verdict = ACCEPT
        if token.isdigit():
            if 0 < int(token) < 65536:
                ports.add(int(token))
            continue
        host, port = _split_port(token)
        if port is not None:
            ports.add(port)
        try:
            net = ipaddress.ip_network(host, strict=False)
        except ValueError:
            continue
        if net.num_addresses == 1:
            addresses.add(str(net.network_address))
        else:
            networks.add(str(net))
    return EntryFacts(line, frozenset(addresses), frozenset(networks), frozenset(ports), verdict)


def _split_port(token: str) -> tuple[str, int | None]:
    """``[ip]:port`` and ``ip4:port`` (either followed by ``/protocol``) apart; anything
    else as it is."""
    token = _PROTOCOL_SUFFIX.sub(r"\1", token)
    m = _BRACKETED.match(token) or _PORTED4.match(token)
    if m is None:
        return token, None
    return m.group(1), int(m.group(2)) if m.group(2) else None


def covers(facts: EntryFacts, frontend: Frontend, service_addresses: Iterable[str]) -> bool:
    """Whether the entry is one where ``frontend``'s traffic enters."""
    if frontend.port not in facts.ports:
        return False
    if frontend.kind == NODE_PORT:
        return not facts.addresses & set(service_addresses)
    return frontend.address in facts.addresses


@dataclass(frozen=True)
class Drift:
    """One difference between the kernel and what kubeplex would program now."""

    kind: str
    #: What it is about: a frontend, an endpoint target, or the service port.
    subject: str
    expected: str
    found: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {
            "kind": self.kind,
            "subject": self.subject,
            "expected": self.expected,
            "found": self.found,
            "message": self.message,
        }


@dataclass(frozen=True)
class Matched:
    """The kernel's entries by the frontend they serve (``match``)."""

    by_frontend: dict[Frontend, list[EntryFacts]] = field(default_factory=dict)
    #: Entries that serve no frontend of the expectation.
    unmatched: list[EntryFacts] = field(default_factory=list)
    #: Entries of the health-check NodePort (modes open it differently; never drift).
    health_check: list[EntryFacts] = field(default_factory=list)


def match(expectation: Expectation, entries: Sequence[str]) -> Matched:
    out = Matched({f: [] for f in expectation.frontends})
    for line in entries:
        facts = read_entry(line)
        hits = [f for f in expectation.frontends if covers(facts, f, expectation.addresses)]
        for f in hits:
            out.by_frontend[f].append(facts)
        if hits:
            continue
        if expectation.health_check_node_port in facts.ports:
            out.health_check.append(facts)
        else:
            out.unmatched.append(facts)
    return out


def compare(expectation: Expectation | None, view: ProgrammedService | None) -> list[Drift]:
    """Every difference between the expectation (None: kubeplex would program nothing) and
    the kernel's view (None: the kernel holds nothing) of one service port in one family."""
    if expectation is None and view is None:
        return []
    if expectation is None:
        assert view is not None
        return [
            Drift(
                "not-expected",
                view.service,
                "nothing",
                ", ".join(view.objects or view.entries) or "entries",
                f"the kernel holds {view.service} in {view.family.value}, which kubeplex would "
                "not program now (stale rules)",
            )
        ]
    name = str(expectation.service)
    if view is None:
        return [
            Drift(
                "not-programmed",
                name,
                "programmed",
                "nothing",
                f"the kernel holds nothing of {name} in {expectation.family.value}",
            )
        ]
    out = _frontend_drift(expectation, match(expectation, view.entries))
    out += _endpoint_drift(expectation, view)
    if view.masquerade != expectation.masquerade:
        want = "masqueraded" if expectation.masquerade else "not masqueraded"
        got = "masqueraded" if view.masquerade else "not masqueraded"
        out.append(
            Drift("masquerade", name, want, got, f"{name}: traffic is {got}; kubeplex: {want}")
        )
    if view.affinity_seconds != expectation.affinity_seconds:
        want = _seconds(expectation.affinity_seconds)
        got = _seconds(view.affinity_seconds)
        out.append(
            Drift("affinity", name, want, got, f"{name}: session affinity {got}; kubeplex: {want}")
        )
    # Rule by rule, last: the differences above in the mode's words, and any the model misses.
    return out + [_rule_drift(d) for d in view.rule_drift]


def _seconds(value: int | None) -> str:
    return "none" if value is None else f"{value}s"


def _frontend_drift(expectation: Expectation, matched: Matched) -> list[Drift]:
    out = []
    for frontend, found in matched.by_frontend.items():
        verdicts = {f.verdict for f in found}
        if not found:
            out.append(
                Drift(
                    "missing-entry",
                    str(frontend),
                    frontend.verdict,
                    "no entry",
                    f"{frontend.kind} {frontend}: no entry in the kernel (kubeplex would "
                    f"{frontend.verdict} it); was a rule deleted by hand?",
                )
            )
            continue
        if frontend.verdict not in verdicts:
            out.append(
                Drift(
                    "wrong-verdict",
                    str(frontend),
                    frontend.verdict,
                    ", ".join(sorted(verdicts)),
                    f"{frontend.kind} {frontend}: the kernel would {' / '.join(sorted(verdicts))}; "
                    f"kubeplex would {frontend.verdict}",
                )
            )
            continue
        extra = verdicts - {frontend.verdict} - frontend.also
        if extra:
            lines = [f.line for f in found if f.verdict in extra]
            out.append(
                Drift(
                    "extra-verdict",
                    str(frontend),
                    frontend.verdict,
                    ", ".join(sorted(extra)),
                    f"{frontend.kind} {frontend}: the kernel also holds {lines[0]!r}",
                )
            )
    for facts in matched.unmatched:
        out.append(
            Drift(
                "unexpected-entry",
                facts.line,
                "no entry",
                facts.line,
                f"the kernel holds an entry kubeplex would not program now: {facts.line}",
            )
        )
    return out


def _endpoint_drift(expectation: Expectation, view: ProgrammedService) -> list[Drift]:
    name = str(expectation.service)
    want = {e.target: e for e in expectation.endpoints}
    got = {e.target: e for e in view.endpoints}
    out = []
    for target, e in want.items():
        if target not in got:
            out.append(
                Drift(
                    "missing-endpoint",
                    target,
                    "present",
                    "missing",
                    f"{name}: endpoint {target} is not programmed",
                )
            )
            continue
        share = got[target].share
        if e.share is not None and share is not None and abs(share - e.share) > SHARE_TOLERANCE:
            out.append(
                Drift(
                    "share",
                    target,
                    f"{e.share:.3f}",
                    f"{share:.3f}",
                    f"{name}: endpoint {target} gets {share:.1%} of new connections, "
                    f"not {e.share:.1%}",
                )
            )
    for target, view_ep in got.items():
        # Kept at no share of new connections (a real server at weight 0 waiting for its
        # connections to close): graceful termination, not drift.
        if target not in want and view_ep.share != 0:
            out.append(
                Drift(
                    "stale-endpoint",
                    target,
                    "absent",
                    "present",
                    f"{name}: the kernel still sends to {target}, which is no endpoint now",
                )
            )
    return out


# --- whole chains ------------------------------------------------------------------------------

#: What a rule difference is called in a ``Drift`` and in the repaired-drift metric.
RULE_KINDS = {"extra": "extra-rule", "missing": "missing-rule", "changed": "changed-rule"}


def diff_rules(
    chain: str,
    expected: Sequence[str],
    found: Sequence[str],
    key: Callable[[str], Hashable],
) -> list[RuleDrift]:
    """Every rule ``found`` in ``chain`` (the kernel's, as its tool prints them) that differs
    from the ``expected`` ones (as the mode renders them), in order: two rules are the same
    when their ``key`` is (the mode's reading of a rule, whatever the printing)."""
    want = [key(r) for r in expected]
    have = [key(r) for r in found]
    if want == have:
        return []
    out: list[RuleDrift] = []
    matcher = SequenceMatcher(None, want, have, autojunk=False)
    for op, w0, w1, h0, h1 in matcher.get_opcodes():
        if op == "equal":
            continue
        paired = min(w1 - w0, h1 - h0)
        for i in range(paired):
            out.append(RuleDrift(chain, "changed", found[h0 + i], expected[w0 + i]))
        out += [RuleDrift(chain, "missing", expected=r) for r in expected[w0 + paired : w1]]
        out += [RuleDrift(chain, "extra", found=r) for r in found[h0 + paired : h1]]
    return out


def diff_chains(
    expected: Mapping[str, Sequence[str]],
    found: Mapping[str, Sequence[str]],
    key: Callable[[str], Hashable],
) -> list[RuleDrift]:
    """``diff_rules`` of every chain of either side (a chain one side lacks has no rules)."""
    out: list[RuleDrift] = []
    for chain in dict.fromkeys([*expected, *found]):
        out += diff_rules(chain, expected.get(chain, ()), found.get(chain, ()), key)
    return out


def _rule_drift(d: RuleDrift) -> Drift:
    kind = RULE_KINDS.get(d.change, d.change)
    if d.change == "extra":
        message = f"chain {d.chain} holds a rule kubeplex would not write: {d.found}"
    elif d.change == "missing":
        message = f"chain {d.chain} lacks a rule kubeplex would write: {d.expected}"
    else:
        message = f"chain {d.chain} holds {d.found} where kubeplex would write {d.expected}"
    return Drift(kind, d.chain, d.expected or "no rule", d.found or "no rule", message)


def summary(drift: Iterable[RuleDrift]) -> str:
    """Per chain, how many rules differ and how ("KUBE-SVC-X: 1 extra; KUBE-SEP-Y: 2 missing"),
    for a log line."""
    by_chain: dict[str, dict[str, int]] = {}
    for d in drift:
        counts = by_chain.setdefault(d.chain, {})
        counts[d.change] = counts.get(d.change, 0) + 1
    return "; ".join(
        f"{chain}: " + ", ".join(f"{n} {change}" for change, n in counts.items())
        for chain, counts in by_chain.items()
    )
