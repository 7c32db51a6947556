"""normalize_ip gives what ipaddress gives (its canonical text), or refuses what it refuses;
the fast IPv4 check returns the text it was given only when that is the canonical text."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubeplex.core.model.types import normalize_ip


def canonical(text: str) -> str | None:
    if "%" in text:
        return None
    try:
        return str(ipaddress.ip_address(text.strip()))
    except ValueError:
        return None


def normalized(text: str) -> str | None:
    try:
        return normalize_ip(text)
    except ValueError:
        return None


ODD = [
    "10.0.0.1",
    "0.0.0.0",
    "255.255.255.255",
    "256.0.0.1",
    "10.0.0.01",
    "010.0.0.1",
    "10.0.0",
    "10.0.0.1.2",
    "10..0.1",
    "10.0.0.1.",
    ".10.0.0.1",
    " 10.0.0.2",
    "10.0.0.2\n",
    "10.0.0.2 x",
    "1e1.0.0.1",
    "0x0a.0.0.1",
    "+1.0.0.1",
    "\u0661\u0660.0.0.1",  # Arabic-Indic digits: str.isdigit, no IP
    "10.0.0.1\x00",
    "10.0.0.1%eth0",
    "",
    "::ffff:10.0.0.1",
    "2001:DB8::1",
    "fe80::1%eth0",
]


@pytest.mark.parametrize("text", ODD)
def test_odd_addresses(text: str) -> None:
    assert normalized(text) == canonical(text)


@settings(max_examples=2000, deadline=None)
@given(st.text(alphabet="0123456789. \t\nx:%a", max_size=20))
def test_any_text(text: str) -> None:
    assert normalized(text) == canonical(text)


@settings(max_examples=500, deadline=None)
@given(st.ip_addresses(v=4))
def test_every_ipv4_address_comes_back_as_written(address: ipaddress.IPv4Address) -> None:
    assert normalize_ip(str(address)) == str(address)


def test_a_str_subclass_comes_back_as_a_plain_str() -> None:
    class Text(str):
        pass

    got = normalize_ip(Text("10.0.0.1"))
    assert got == "10.0.0.1" and type(got) is str
