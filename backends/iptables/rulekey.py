"""When an iptables rule as rendered and one as ``iptables-save`` prints it are the same rule.

The tool prints a rule in its own canonical form, not as it was written: options in the
order of its match modules, ``/32`` after a host address, ``-m tcp`` before ``--dport``,
probabilities to 11 digits, marks without leading zeros, ``--or-mark`` as ``--set-xmark``,
and options left at their default spelled out (``--reject-with icmp-port-unreachable``).
``rule_key`` reads either form into the same key: the rule's options, each with its values
in a canonical spelling, as a sorted tuple (which option comes first never changes what a
kubeplex rule does).
"""

from __future__ import annotations

import ipaddress
import re
import shlex

#: Long option names the tool prints short.
_SHORT = {
    "--source": "-s",
    "--destination": "-d",
    "--protocol": "-p",
    "--jump": "-j",
    "--goto": "-g",
    "--match": "-m",
    "--in-interface": "-i",
    "--out-interface": "-o",
}
#: Match modules the tool adds by itself for a protocol's options (``-p tcp --dport 80``).
_IMPLICIT_MODULES = frozenset({"tcp", "udp", "sctp", "icmp", "icmp6", "icmpv6"})
#: Options the tool prints with their default value when a rule left them out.
_DEFAULTS = frozenset(
    {
        "--reject-with icmp-port-unreachable",
        "--reject-with icmp6-port-unreachable",
        "--rsource",
        "--mask 255.255.255.255",
        "--mask ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
    }
)
_HEX = re.compile(r"0x[0-9a-fA-F]+")
_FULL_MASK = 0xFFFFFFFF


def rule_key(rule: str) -> tuple[str, ...]:
    """The rule's options in a canonical spelling, sorted; ``-A CHAIN`` left out."""
    try:
        words = shlex.split(rule)
    except ValueError:  # an unbalanced quote: not one of ours, compared as it is
        words = rule.split()
    if words[:1] in (["-A"], ["-I"]) and len(words) > 1:
        words = words[2:]
    groups: list[list[str]] = []
    negated = False
    for word in words:
        if word == "!":
            negated = True
            continue
        if word.startswith("-") and len(word) > 1 and not word[1].isdigit():
            groups.append([("! " if negated else "") + _SHORT.get(word, word)])
        elif groups:
            groups[-1].append(("! " if negated else "") + word)
        else:
            groups.append([word])
        negated = False
    out = []
    for group in groups:
        canonical = _canonical(group[0], group[1:])
        if canonical is not None:
            out.append(" ".join(canonical))
    return tuple(sorted(out))


def _canonical(option: str, values: list[str]) -> list[str] | None:
    """One option with its values as the tool prints them (None: it prints nothing)."""
    bare = option.removeprefix("! ")
    if bare == "-m" and values and values[0] in _IMPLICIT_MODULES:
        return None
    if " ".join([option, *values]) in _DEFAULTS:
        return None
    if bare in ("-s", "-d") and len(values) == 1:
        return [option, _network(values[0])]
    if bare == "--probability" and len(values) == 1:
        try:
            return [option, f"{float(values[0]):.4f}"]
        except ValueError:
            return [option, *values]
    if bare in ("--ctstate", "--state") and len(values) == 1:
        return [option, ",".join(sorted(values[0].split(",")))]
    if bare in ("--or-mark", "--xor-mark", "--and-mark", "--set-mark") and len(values) == 1:
        return ["--set-xmark", _xmark(bare, values[0])]
    return [option, *(_HEX.sub(_hex, v) for v in values)]


def _network(text: str) -> str:
    try:
        return str(ipaddress.ip_network(text, strict=False))
    except ValueError:
        return text


def _hex(m: re.Match[str]) -> str:
    return hex(int(m.group(0), 16))


def _xmark(option: str, value: str) -> str:
    """A MARK target's option as the tool prints every one of them: ``--set-xmark V/M``."""
    mark, _, mask = value.partition("/")
    try:
        bits = int(mark, 0)
        given = int(mask, 0) if mask else None
    except ValueError:
        return value
    if option == "--or-mark":
        pair = (bits, bits)
    elif option == "--xor-mark":
        pair = (bits, 0)
    elif option == "--and-mark":
        pair = (0, ~bits & _FULL_MASK)
    else:
        pair = (bits, _FULL_MASK if given is None else given)
    return f"{hex(pair[0])}/{hex(pair[1])}"
