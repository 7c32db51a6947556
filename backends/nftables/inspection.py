"""What the kernel holds for one Service port, read back from ``nft list table``.

A service port owns chains named after it (``service-``, ``local-``, ``external-``,
``firewall-`` + its base), the endpoint chains its ``numgen ... vmap`` sends to, and their
affinity sets; it enters the table through elements of the shared maps that jump to its
chains (or, without endpoints, that carry its name as their comment).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from kubeplex.backends.nftables import names
from kubeplex.backends.nftables.listing import (
    ListedTable,
    chain_drift,
    parse_table,
    rendered_chains,
)
from kubeplex.core.dataplane.backend import EndpointView, ProgrammedService
from kubeplex.core.model.types import IPFamily, ServicePortName

#: The shared maps whose elements lead to a service port.
ENTRY_MAPS = (
    names.SERVICE_IPS,
    names.SERVICE_NODEPORTS,
    names.FIREWALL_IPS,
    names.NO_ENDPOINT_SERVICES,
    names.NO_ENDPOINT_NODEPORTS,
)
_NUMGEN = re.compile(r"numgen (?:random|inc) mod (\d+) vmap \{ (.*) \}")
_SLOT = re.compile(r"^(\d+) : (?:goto|jump) (\S+)$")
_DNAT = re.compile(r"\bdnat (?:ip6? )?to (\S+)")
_COUNTER = re.compile(r"\bcounter packets (\d+) bytes (\d+)")
_VERDICT = re.compile(r" : (?:goto|jump) (\S+)$")
_COMMENT = re.compile(r' comment "([^"]*)"')


def programmed(
    spn: ServicePortName,
    family: IPFamily,
    text: str,
    rendered: Mapping[str, str] | None = None,
) -> ProgrammedService | None:
    """``spn``'s part of the table listed in ``text`` (None: nothing of it is there).
    ``rendered``: the service port's own chains as the mode renders them now (chain -> its
    "add rule" lines), to compare them whole with (None: not compared)."""
    table = parse_table(text)
    base = names.service_base(spn)
    own = [
        prefix + base
        for prefix in (
            names.SERVICE_PREFIX,
            names.LOCAL_PREFIX,
            names.EXTERNAL_PREFIX,
            names.FIREWALL_PREFIX,
        )
        if prefix + base in table.chains
    ]
    endpoints, slots, total = _endpoint_chains(table, own)
    chains = [*own, *endpoints]
    affinity = [
        names.AFFINITY_PREFIX + c[len(names.ENDPOINT_PREFIX) :]
        for c in endpoints
        if names.AFFINITY_PREFIX + c[len(names.ENDPOINT_PREFIX) :] in table.sets
    ]
    entries = _entries(table, spn, family, set(own))
    if not (chains or entries):
        return None
    views = []
    for chain in endpoints:
        rules = table.chains.get(chain, [])
        target = next((m.group(1) for r in rules if (m := _DNAT.search(r))), "")
        counted = next((m for r in rules if (m := _COUNTER.search(r))), None)
        # An endpoint only the other chain's vmap reaches has no slot in the main one.
        weight = slots.get(chain)
        views.append(
            EndpointView(
                target=target,
                share=weight / total if total and weight is not None else None,
                weight=weight,
                packets=int(counted.group(1)) if counted else None,
                bytes=int(counted.group(2)) if counted else None,
            )
        )
    timeouts = [t for s in affinity if (t := table.sets[s].timeout) is not None]
    rule_drift = []
    if rendered is not None:
        table_name = f"{'ip6' if family is IPFamily.IPv6 else 'ip'} {names.TABLE}"
        # A chain the kernel holds that the mode no longer renders: every rule is extra.
        expected: dict[str, list[str]] = {c: [] for c in chains}
        for chain, block in rendered.items():
            expected[chain] = rendered_chains(block, table_name).get(chain, [])
        rule_drift = chain_drift(expected, table.chains)
    masquerade = any(
        f"jump {names.MARK_MASQ}" in rule for c in chains for rule in table.chains.get(c, [])
    )
    return ProgrammedService(
        service=str(spn),
        family=family,
        entries=tuple(entries),
        endpoints=tuple(views),
        masquerade=masquerade,
        affinity_seconds=max(timeouts) if timeouts else None,
        packets=None,  # the shared maps' elements carry no counters
        objects=tuple([*chains, *affinity]),
        rule_drift=tuple(rule_drift),
    )


def _endpoint_chains(table: ListedTable, own: list[str]) -> tuple[list[str], dict[str, int], int]:
    """The endpoint chains of the service's vmap (its cluster chain's, else its local
    chain's), how many slots each has, and the vmap's size; endpoints only the other chain
    reaches come after, without slots."""
    slots: dict[str, int] = {}
    total = 0
    found: list[str] = []
    for chain in own:
        if not chain.startswith((names.SERVICE_PREFIX, names.LOCAL_PREFIX)):
            continue
        for rule in table.chains[chain]:
            m = _NUMGEN.search(rule)
            if m is None:
                continue
            counted = not total
            if counted:
                total = int(m.group(1))
            for item in m.group(2).split(", "):
                slot = _SLOT.match(item.strip())
                if slot is None:
                    continue
                target = slot.group(2)
                if target not in found:
                    found.append(target)
                if counted:
                    slots[target] = slots.get(target, 0) + 1
    return found, slots, total


def _entries(
    table: ListedTable, spn: ServicePortName, family: IPFamily, own: set[str]
) -> list[str]:
    fam = "ip6" if family is IPFamily.IPv6 else "ip"
    out = []
    for name in ENTRY_MAPS:
        listed = table.sets.get(name)
        for element in listed.elements if listed is not None else ():
            verdict = _VERDICT.search(element)
            note = _COMMENT.search(element)
            if (verdict and verdict.group(1) in own) or (note and note.group(1) == str(spn)):
                out.append(f"element {fam} {names.TABLE} {name} {{ {element} }}")
    return out
