"""Go ``time.Duration`` strings ("1m30s", "500ms", "-1s") as float seconds.

kube-proxy's config file carries ``metav1.Duration`` values, which are parsed by Go's
``time.ParseDuration`` and printed by ``Duration.String``; this module reproduces both so a
file means the same here as upstream and errors print values the way users wrote them.
"""

from __future__ import annotations

__all__ = ["DurationError", "format_duration", "parse_duration"]

_NS_PER_UNIT = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # MICRO SIGN, accepted by Go
    "\u03bcs": 1_000,  # GREEK SMALL LETTER MU, accepted by Go
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60 * 1_000_000_000,
    "h": 3600 * 1_000_000_000,
}
# Go durations are int64 nanoseconds; anything larger is an overflow error upstream too.
_MAX_NS = (1 << 63) - 1


class DurationError(ValueError):
    """``text`` is not a Go duration; ``reason`` says why (e.g. ``unknown unit "d"``)."""

    def __init__(self, text: str, reason: str) -> None:
        super().__init__(f"invalid duration {_quote(text)}: {reason}")
        self.text = text
        self.reason = reason


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def parse_duration(text: str) -> float:
    """Parse a Go duration string into seconds, with Go's grammar:
    ``[-+]?([0-9]*(\\.[0-9]*)?[a-z]+)+``; a bare ``0`` is the only unit-less value."""
    s = text
    negative = False
    if s[:1] in ("-", "+"):
        negative = s[0] == "-"
        s = s[1:]
    if s == "0":
        return 0.0
    if not s:
        raise DurationError(text, "empty" if not text else "no number")
    total = 0
    while s:
        i = 0
        while i < len(s) and s[i].isascii() and s[i].isdigit():
            i += 1
        whole, s = s[:i], s[i:]
        frac = ""
        if s.startswith("."):
            j = 1
            while j < len(s) and s[j].isascii() and s[j].isdigit():
                j += 1
            frac, s = s[1:j], s[j:]
        if not whole and not frac:
            raise DurationError(text, "expected a number")
        k = 0
        while k < len(s) and s[k] != "." and not (s[k].isascii() and s[k].isdigit()):
            k += 1
        unit, s = s[:k], s[k:]
        if not unit:
            raise DurationError(text, "missing unit")
        if unit not in _NS_PER_UNIT:
            raise DurationError(text, f"unknown unit {_quote(unit)}")
        scale = _NS_PER_UNIT[unit]
        # Go truncates each number's sub-nanosecond part ("1.5ns0.5ns" is 1ns).
        total += int(whole or "0") * scale + (int(frac) * scale // 10 ** len(frac) if frac else 0)
        if total > _MAX_NS:
            raise DurationError(text, "out of range")
    return (-total if negative else total) / 1e9


def _fraction(value: int, precision: int) -> tuple[str, int]:
    """Split ``value`` into (".ddd" without trailing zeros, value // 10**precision)."""
    whole, rest = divmod(value, 10**precision)
    digits = f"{rest:0{precision}d}".rstrip("0") if precision else ""
    return ("." + digits if digits else ""), whole


def format_duration(seconds: float) -> str:
    """Print seconds the way Go's ``Duration.String`` does: "0s", "500ms", "1m30s", "1h0m0s"."""
    ns = round(seconds * 1e9)
    sign = "-" if ns < 0 else ""
    u = abs(ns)
    if u == 0:
        return "0s"
    if u < 1_000_000_000:
        if u < 1_000:
            precision, unit = 0, "ns"
        elif u < 1_000_000:
            precision, unit = 3, "\u00b5s"
        else:
            precision, unit = 6, "ms"
        frac, whole = _fraction(u, precision)
        return f"{sign}{whole}{frac}{unit}"
    frac, secs = _fraction(u, 9)
    out = f"{secs % 60}{frac}s"
    minutes = secs // 60
    if minutes:
        out = f"{minutes % 60}m{out}"
        hours = minutes // 60
        if hours:
            out = f"{hours}h{out}"
    return sign + out
