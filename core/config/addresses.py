"""Addresses as Go's net package and apimachinery parse them: IPs, CIDRs, host:port, port ranges.

Python's ``ipaddress`` is more lenient in places (IPv6 zones, non-numeric prefixes); these
helpers refuse what upstream kube-proxy refuses.
"""

from __future__ import annotations

import ipaddress
import re

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def net_split_host_port(address: str) -> tuple[str, str]:
    """Go's net.SplitHostPort: "host:port" or "[host]:port"; the host may not hold a colon
    unless bracketed."""
    if address.startswith("["):
        end = address.find("]")
        if end < 0 or address[end + 1 : end + 2] != ":":
            raise ValueError(address)
        host, port = address[1:end], address[end + 2 :]
    else:
        host, sep, port = address.rpartition(":")
        if not sep or ":" in host:
            raise ValueError(address)
    if any(c in host for c in "[]") or any(c in port for c in "[]"):
        raise ValueError(address)
    return host, port


def append_port_if_needed(address: str, port: int) -> str:
    """proxyutil.AppendPortIfNeeded: a bare IP gets the default port, anything else is left
    for validation to judge."""
    try:
        net_split_host_port(address)
        return address
    except ValueError:
        pass
    ip = parse_ip(address)
    if ip is None:
        return address
    return f"{address}:{port}" if ip.version == 4 else f"[{address}]:{port}"


def parse_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if "%" in text:  # Go rejects IPv6 zones here; Python would accept them
        return None
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def parse_cidr(text: str) -> IPNetwork | None:
    """Go's net.ParseCIDR: "addr/prefix" with a numeric prefix; host bits may be set."""
    address, sep, prefix = text.partition("/")
    if not sep or not (prefix.isascii() and prefix.isdigit()) or parse_ip(address) is None:
        return None
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        return None


def is_port_range(text: str) -> bool:
    """k8s.io/apimachinery's PortRange: "", "port", "low-high" or "base+size", all <= 65535."""
    value = text.strip()
    if not value:
        return True
    match = re.fullmatch(r"([0-9]+)(?:([-+])([0-9]+))?", value)
    if match is None:
        return False
    low = int(match[1])
    high = low
    if match[2] is not None:
        high = int(match[3]) if match[2] == "-" else low + int(match[3])
    return low <= high <= 65535
