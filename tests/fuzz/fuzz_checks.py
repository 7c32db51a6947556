"""The fuzz suite's properties, shared by the ClusterState, manifests and API source tests:
render with every in-tree backend, and check what came out."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kits.render_kit import config
from kube_strategies import MARKER, NODE, Broken, GoodService

from kubeplex.backends.iptables import IptablesBackend
from kubeplex.backends.iptables import names as ipt_names
from kubeplex.backends.kernelspace import KernelspaceBackend
from kubeplex.backends.nftables import NftablesBackend
from kubeplex.backends.nftables import names as nft_names
from kubeplex.core.dataplane.backend import Backend, BackendContext
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.errors import FieldError, InvalidObject
from kubeplex.core.model.types import IPFamily
from kubeplex.testing import fakes

FAMILIES = (IPFamily.IPv4, IPFamily.IPv6)
BASE_CONFIG = {"clusterCIDR": "10.244.0.0/16,fd00:244::/48", "hostnameOverride": NODE}


def backends() -> dict[str, Backend]:
    """One fresh backend per in-tree mode; render only (no kernel, no root)."""
    made: dict[str, Backend] = {}
    for mode, cls in (
        ("iptables", IptablesBackend),
        ("nftables", NftablesBackend),
        ("kernelspace", KernelspaceBackend),
    ):
        cfg = config({"mode": mode, **BASE_CONFIG})
        # In-memory kernels: nothing of the host (its nfacct counters) reaches a render.
        kernel = fakes.FakeIptables(nfacct=False) if mode == "iptables" else fakes.for_mode(mode)
        backend: Backend = cls(BackendContext(cfg, NODE, FAMILIES, kernel=kernel))
        backend.prepare()
        made[mode] = backend
    return made


def render_all(cluster: ClusterState) -> dict[str, str]:
    """The full sync of every mode for the cluster's state now."""
    state = cluster.checkout(full=True)
    return {mode: str(b.render(state)) for mode, b in backends().items()}


@dataclass
class Rejections:
    """An ErrorSink that keeps every rejection with the object it was about."""

    seen: list[tuple[InvalidObject, Mapping[str, Any]]] = field(default_factory=list)

    def __call__(self, err: InvalidObject, obj: Mapping[str, Any]) -> None:
        self.seen.append((err, obj))


# --- (2) good objects are programmed ------------------------------------------------------------


def missing_services(rendered: Mapping[str, str], good: Iterable[GoodService]) -> list[str]:
    """Every port of every good Service, per IP family, that some mode did not program."""
    missing: list[str] = []
    ipt, nft = rendered["iptables"], rendered["nftables"]
    ks = json.loads(rendered["kernelspace"])
    ks_vips = {
        (lb.get("service"), vip)
        for fam in ks["families"]
        for lb in fam["loadBalancers"]
        for vip in lb["HostComputeLoadBalancer"].get("FrontendVIPs", [])
    }
    for g in good:
        for spn in g.port_names():
            chains = (ipt_names.service_chain(spn), ipt_names.local_service_chain(spn))
            if not any(f":{c} " in ipt for c in chains):
                missing.append(f"iptables {spn}")
            chains = (nft_names.service_chain(spn), nft_names.local_chain(spn))
            if not any(f" {c}\n" in nft or f" {c} " in nft for c in chains):
                missing.append(f"nftables {spn}")
            for ip in g.cluster_ips:
                if (str(spn), ip) not in ks_vips:
                    missing.append(f"kernelspace {spn} {ip}")
    return missing


def programmed_anyway(rendered: Mapping[str, str], keys: Iterable[str]) -> list[str]:
    """Services (``ns/name``) that no mode may program but some mode did mention."""
    return [
        f"{mode} {key}"
        for key in keys
        for mode, text in rendered.items()
        if re.search(re.escape(key) + r"[/: \"]", text)
    ]


# --- (3) nothing from the input reaches a rule unescaped ---------------------------------------

_QUOTED = re.compile(r'"([^"]*)"')
#: What a quoted comment or name may hold: validated names, addresses, fixed words.
_SAFE_QUOTED = re.compile(r"[A-Za-z0-9 ./:_>;,()@\[\]-]*\Z")
_IPT_LINE = re.compile(
    r"(# .*|\*(filter|nat|mangle|raw)|:[A-Z0-9-]+ - \[0:0\]|-[AXFIN] .*|COMMIT|)\Z"
)
_NFT_LINE = re.compile(r"(# .*|(add|delete|flush|insert|replace|destroy|create) .*|)\Z")


def unsafe_lines(rendered: Mapping[str, str]) -> list[str]:
    """Lines that hold the hostile marker, a control character, a stray quote, or a quoted
    text that is not made of validated values."""
    bad: list[str] = []
    for mode, text in rendered.items():
        if MARKER in text:
            bad.append(f"{mode}: the hostile marker {MARKER!r} was rendered")
        if mode == "kernelspace":
            bad += [f"kernelspace: {s!r}" for s in _json_strings(json.loads(text)) if _odd(s)]
            continue
        shape = _IPT_LINE if mode == "iptables" else _NFT_LINE
        for line in text.split("\n"):
            if (
                _odd(line)
                or not shape.match(line)
                or line.count('"') % 2
                or not all(_SAFE_QUOTED.match(q) for q in _QUOTED.findall(line))
            ):
                bad.append(f"{mode}: {line!r}")
    return bad


def _odd(text: str) -> bool:
    """A control character (a tab aside), a backslash or anything outside printable ASCII."""
    return any((ord(c) < 32 and c != "\t") or ord(c) > 126 or c == "\\" for c in text)


def _json_strings(doc: Any) -> Iterable[str]:
    if isinstance(doc, str):
        yield doc
    elif isinstance(doc, dict):
        for k, v in doc.items():
            yield k
            yield from _json_strings(v)
    elif isinstance(doc, list):
        for v in doc:
            yield from _json_strings(v)


# --- (4) every rejection names the object and the field -----------------------------------------

_TOP_FIELDS = ("metadata", "spec", "status", "addressType", "endpoints", "ports")


def unnamed_rejections(
    seen: Iterable[tuple[InvalidObject, Mapping[str, Any]]],
    broken: Iterable[Broken] = (),
    origin: str = "",
) -> list[str]:
    """Rejections that do not name their object (kind and, for a string name, the name; the
    file when there is one) or whose fields are not paths into the object; and broken objects
    rejected without an error at (or inside, or above) the field that was broken."""
    problems: list[str] = []
    for err, obj in seen:
        kind = str(obj.get("kind"))
        meta = obj.get("metadata")
        name = meta.get("name") if isinstance(meta, Mapping) else None
        text, where = str(err), err.where
        if origin:  # "<file>: Service ns/name"
            if not where.startswith(origin):
                problems.append(f"origin {origin!r} not named: {text}")
            where = where.split(": ", 1)[-1]
        if not where.startswith(f"{kind} "):
            problems.append(f"object not named: {text}")
        printable = isinstance(name, str) and name.isascii() and name.isprintable()
        # An error shows a name escaped (a backslash doubled), never raw.
        shown = name.encode("unicode_escape").decode() if isinstance(name, str) else ""
        if printable and shown and shown[:60] not in where:
            problems.append(f"name {name!r} not in: {err.where}")
        if not err.errors:
            problems.append(f"no field named: {text}")
        for fe in err.errors:
            if not fe.path.startswith(_TOP_FIELDS):
                problems.append(f"not a field of the object: {fe.path!r} in {text}")
        if "\n" in text or "\r" in text or "\x00" in text:
            problems.append(f"raw control character in the error: {text!r}")
    by_obj = {id(obj): err for err, obj in seen}
    for b in broken:
        err = by_obj.get(id(b.obj))
        if err is not None and not any(_related(fe, b.path) for fe in err.errors):
            problems.append(f"broke {b.path!r}, but the error names other fields: {err}")
    return problems


def _related(reported: FieldError, broken: str) -> bool:
    """One path is the other or inside it (``spec.ports`` and ``spec.ports[0].port``), or the
    error says what the broken field did to it ("nodePort: may not be set when type is ...")."""
    short, long = sorted((reported.path, broken), key=len)
    if long == short or long.startswith((short + ".", short + "[")):
        return True
    leaf = re.split(r"[.\[]", broken)[-1]
    return bool(leaf) and leaf in reported.message
