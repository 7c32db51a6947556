"""Hypothesis strategies for cluster objects: valid, nearly valid (one field wrong) and hostile
(a metacharacter-laden string in one field), plus whole manifest files.

Every valid object is built from an index, and its addresses, NodePorts and namespace come from
that index, so valid objects never collide with each other or with the bases of broken ones:
whatever the mix, the valid ones must all be programmed.
"""

from __future__ import annotations

import copy
import ipaddress
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml
from hypothesis import strategies as st

from kubeplex.core.model.types import Protocol, ServicePortName

NODE = "fuzz-node"
NODE_IPS = ("192.168.0.2", "fd00:192::2")
ZONE = "zone-a"
#: In every hostile string; no validated value (name, IP, label) can hold an "@", so this must
#: never appear in anything rendered.
MARKER = "hx@"

Path = tuple[str | int, ...]
JSONObj = dict[str, Any]

_LABEL = st.from_regex(r"[a-z]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
_PORT_NAME = st.from_regex(r"[a-z]([a-z0-9-]{0,8}[a-z0-9])?", fullmatch=True)

# --- bad values ---------------------------------------------------------------------------------

#: Metacharacters of shells, iptables-restore and nft, and what ends a line or a string.
_META = ['"', "'", "\n", "\r", ";", "}", "{", "#", " -j ACCEPT", "\\", "\x00", "$(", "`", "\t"]
_PAYLOADS = [
    '" -j ACCEPT #',
    '"; flush ruleset; #',
    "} ; add rule ip filter input accept ; {",
    "\n-A INPUT -j ACCEPT\n",
    "\nCOMMIT\n*filter\n",
    "\\",
    "\x00",
    "a b",
    "x\u202ey",
    "\ud7ff\ufeff",
]


@st.composite
def hostile_strings(draw: st.DrawFn) -> str:
    """A string with the marker and at least one metacharacter, optionally around a plausible
    value (so it gets past a careless prefix check)."""
    lead = draw(st.sampled_from(["", "web", "10.0.0.1", "default/web", "tcp"]))
    meta = draw(st.lists(st.sampled_from(_META + _PAYLOADS), min_size=1, max_size=3))
    tail = draw(st.text(max_size=8))
    parts = [lead, *meta]
    parts.insert(draw(st.integers(0, len(parts))), MARKER)
    return "".join(parts) + tail


_BAD_IPS = [
    "999.1.1.1",
    "1.2.3",
    "01.2.3.4",
    "10.0.0.1/24",
    "fe80::1%eth0",
    "fe80::1%eth0 -j ACCEPT",
    "::g",
    "1.2.3.4.5",
    " ",
    "",
    "None",
    "localhost",
    "1.2.3.4\n-A X",
]

_WEIRD_NAMES = [
    "Web",
    "web server",
    'we"b',
    "web\n",
    "wéb",
    "\uff37\uff25\uff22",  # full-width WEB
    "-web",
    "web-",
    "a" * 64,
    "a." * 130,
    "web/x",
    "",
]


def bad_values() -> st.SearchStrategy[Any]:
    """Wrong types, out-of-range numbers, bad addresses and names, hostile strings."""
    return st.one_of(
        st.none(),
        st.booleans(),
        st.sampled_from([-1, 0, 65536, 2**31, 2**63, -(2**64), 10**30]),
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from(_BAD_IPS + _WEIRD_NAMES),
        hostile_strings(),
        # An address no good Service has: a ClusterIP is one Service's only.
        st.lists(st.sampled_from(["a", "192.0.2.1", 80]), max_size=2),
        st.dictionaries(st.sampled_from(["a", "ip", "name"]), st.integers(), max_size=2),
        st.text(max_size=20),
        st.just("x" * 5000),
    )


# --- valid objects ------------------------------------------------------------------------------


@dataclass
class GoodService:
    """A valid Service with its EndpointSlices: what it must program."""

    objects: list[JSONObj]
    namespace: str
    name: str
    cluster_ips: tuple[str, ...]
    ports: tuple[tuple[str, Protocol], ...]
    index: int = 0
    families: tuple[str, ...] = field(default=())

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def port_names(self) -> list[ServicePortName]:
        return [ServicePortName(self.namespace, self.name, n, p) for n, p in self.ports]


def _v4(net: str, index: int, host: int) -> str:
    return f"{net}.{index // 250}.{index % 250}.{host}"


def _v6(net: str, index: int, host: int) -> str:
    return str(ipaddress.IPv6Address(f"{net}:{index:x}::{host:x}"))  # as kubeplex writes it


@st.composite
def good_services(draw: st.DrawFn, index: int) -> GoodService:
    """A valid Service of any type, with one EndpointSlice per IP family it has; each slice has a
    ready endpoint on this node, so Local policies have endpoints too."""
    ns = f"n{index}-" + draw(_LABEL)[:40]
    name = draw(_LABEL)
    fam = draw(st.sampled_from([("IPv4",), ("IPv6",), ("IPv4", "IPv6"), ("IPv6", "IPv4")]))
    ips = tuple(_v4("10", index, 1) if f == "IPv4" else _v6("fd00:96", index, 1) for f in fam)
    svc_type = draw(st.sampled_from(["ClusterIP", "NodePort", "LoadBalancer"]))
    external = svc_type != "ClusterIP"
    n_ports = draw(st.integers(1, 3))
    port_names = draw(st.lists(_PORT_NAME, min_size=n_ports, max_size=n_ports, unique=True))
    if n_ports == 1 and draw(st.booleans()):
        port_names = [""]
    ports: list[JSONObj] = []
    for j, pname in enumerate(port_names):
        p: JSONObj = {
            "port": 1000 + j,
            "protocol": draw(st.sampled_from(["TCP", "UDP", "SCTP"])),
            "targetPort": 8000 + j,
        }
        if pname:
            p["name"] = pname
        if external:
            p["nodePort"] = 30000 + index * 4 + j
        ports.append(p)
    spec: JSONObj = {"type": svc_type, "ports": ports, "selector": {"app": name}}
    if draw(st.booleans()) or len(ips) > 1:
        spec["clusterIPs"] = list(ips)
    spec["clusterIP"] = ips[0]
    spec["ipFamilies"] = list(fam)
    if draw(st.booleans()):
        spec["externalIPs"] = [
            _v4("203", index, 7) if f == "IPv4" else _v6("2001:db8", index, 7) for f in fam
        ]
    if draw(st.booleans()):
        spec["sessionAffinity"] = "ClientIP"
        timeout = draw(st.integers(1, 86400))
        spec["sessionAffinityConfig"] = {"clientIP": {"timeoutSeconds": timeout}}
    spec["internalTrafficPolicy"] = draw(st.sampled_from(["Cluster", "Local"]))
    if external:
        spec["externalTrafficPolicy"] = draw(st.sampled_from(["Cluster", "Local"]))
        if spec["externalTrafficPolicy"] == "Local" and svc_type == "LoadBalancer":
            spec["healthCheckNodePort"] = 30000 + index * 4 + 3
    if draw(st.booleans()):
        spec["trafficDistribution"] = "PreferClose"
    obj: JSONObj = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
        "spec": spec,
    }
    if svc_type == "LoadBalancer":
        spec["loadBalancerSourceRanges"] = draw(
            st.lists(st.sampled_from(["192.168.0.0/16", " 203.0.113.0/25", "fd00::/8"]), max_size=2)
        )
        ingress = [
            {"ip": _v4("198", index, 9) if f == "IPv4" else _v6("2001:db9", index, 9)} for f in fam
        ]
        if draw(st.booleans()):
            ingress.append({"hostname": "lb.example.com"})
        if draw(st.booleans()):
            ingress[0]["ipMode"] = draw(st.sampled_from(["VIP", "Proxy"]))
        obj["status"] = {"loadBalancer": {"ingress": ingress}}
    slices = [
        draw(_slice_for(ns, name, ports, f, index, k)) for k, f in enumerate(sorted(set(fam)))
    ]
    return GoodService(
        objects=[obj, *slices],
        namespace=ns,
        name=name,
        cluster_ips=ips,
        ports=tuple((str(p.get("name", "")), Protocol(p["protocol"])) for p in ports),
        index=index,
        families=fam,
    )


@st.composite
def _slice_for(
    draw: st.DrawFn, ns: str, svc: str, ports: Sequence[JSONObj], family: str, index: int, k: int
) -> JSONObj:
    def ip(host: int) -> str:
        return _v4("11", index, host) if family == "IPv4" else _v6("fd00:244", index, host)

    endpoints: list[JSONObj] = [
        {
            "addresses": [ip(1)],
            "conditions": {"ready": True, "serving": True, "terminating": False},
            "nodeName": NODE,
            "zone": ZONE,
        }
    ]
    for host in range(2, 2 + draw(st.integers(0, 3))):
        ep: JSONObj = {"addresses": [ip(host)]}
        conditions = {
            c: v
            for c in ("ready", "serving", "terminating")
            if (v := draw(st.one_of(st.none(), st.booleans()))) is not None
        }
        if conditions:
            ep["conditions"] = conditions
        if draw(st.booleans()):
            ep["nodeName"] = draw(st.sampled_from([NODE, "other-node", "node-3.example"]))
        if draw(st.booleans()):
            ep["zone"] = draw(st.sampled_from([ZONE, "zone-b"]))
        if draw(st.booleans()):
            ep["hints"] = {
                "forZones": [{"name": draw(st.sampled_from([ZONE, "zone-b"]))}],
                "forNodes": [{"name": NODE}],
            }
        endpoints.append(ep)
    slice_ports = [
        {"name": p.get("name", ""), "port": p["targetPort"], "protocol": p["protocol"]}
        for p in ports
    ]
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{svc}-{family.lower()}{k}",
            "namespace": ns,
            "labels": {"kubernetes.io/service-name": svc},
            "annotations": {
                "endpoints.kubernetes.io/last-change-trigger-time": "2026-01-01T00:00:00Z"
            },
        },
        "addressType": family,
        "ports": slice_ports,
        "endpoints": endpoints,
    }


def node_object(name: str = NODE) -> JSONObj:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": ZONE}},
        "spec": {"podCIDR": "10.244.0.0/24", "podCIDRs": ["10.244.0.0/24", "fd00:244::/64"]},
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": NODE_IPS[0]},
                {"type": "InternalIP", "address": NODE_IPS[1]},
                {"type": "Hostname", "address": name},
            ]
        },
    }


# --- broken objects -----------------------------------------------------------------------------


def leaf_paths(obj: Any, prefix: Path = ()) -> list[Path]:
    """Every path into ``obj``: mappings by key, lists by index (interior nodes included)."""
    out: list[Path] = [prefix] if prefix else []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += leaf_paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += leaf_paths(v, (*prefix, i))
    return out


def string_paths(obj: Any) -> list[Path]:
    return [p for p in leaf_paths(obj) if isinstance(get_path(obj, p), str)]


def get_path(obj: Any, path: Path) -> Any:
    for part in path:
        obj = obj[part]
    return obj


def set_path(obj: Any, path: Path, value: Any) -> Any:
    """A deep copy of ``obj`` with ``path`` set to ``value``."""
    out = copy.deepcopy(obj)
    target = out
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return out


def field_path(path: Path) -> str:
    """A path as kubeplex names fields: ``spec.ports[0].port``, ``metadata.labels[k]``."""
    text = ""
    for i, part in enumerate(path):
        if isinstance(part, int) or (i and path[i - 1] in ("labels", "annotations")):
            text += f"[{part}]"
        else:
            text += ("." if text else "") + part
    return text


@dataclass
class Broken:
    """An object with one field changed: ``path`` is where (``field_path`` form)."""

    obj: JSONObj
    path: str
    value: Any
    hostile: bool


@st.composite
def nearly_valid(draw: st.DrawFn, base: JSONObj) -> Broken:
    """``base`` with one field (any depth, kind and apiVersion aside) set to a bad value."""
    paths = [p for p in leaf_paths(base) if p[0] not in ("kind", "apiVersion")]
    path = draw(st.sampled_from(paths))
    value = draw(bad_values())
    return Broken(set_path(base, path, value), field_path(path), value, False)


@st.composite
def hostile(draw: st.DrawFn, base: JSONObj) -> Broken:
    """``base`` with one string field, or a new label key, made hostile."""
    value = draw(hostile_strings())
    paths = [p for p in string_paths(base) if p[0] not in ("kind", "apiVersion")]
    if not paths or draw(st.integers(0, 3)) == 0:
        labels: Path = ("metadata", "labels")
        if not isinstance(base.get("metadata", {}).get("labels"), dict):
            base = set_path(base, labels, {})
        path = (*labels, value)
        return Broken(set_path(base, path, "v"), field_path(path), value, True)
    path = draw(st.sampled_from(paths))
    return Broken(set_path(base, path, value), field_path(path), value, True)


@dataclass
class Mix:
    """Valid Services (with slices), broken objects and the own Node, in one feeding order."""

    good: list[GoodService]
    broken: list[Broken]
    order: list[JSONObj]
    #: Valid Services no proxy programs (ExternalName, headless), as ``ns/name``.
    unprogrammed: list[str] = field(default_factory=list)


@st.composite
def mixes(draw: st.DrawFn, max_good: int = 4, max_broken: int = 6, first: int = 0) -> Mix:
    """Good Services from index ``first`` on; broken ones built from valid objects of other
    indexes (so even a broken one that is still valid collides with nothing good)."""
    n_good = draw(st.integers(1, max_good))
    good = [draw(good_services(first + i)) for i in range(n_good)]
    broken: list[Broken] = []
    for k in range(draw(st.integers(0, max_broken))):
        base_svc = draw(good_services(first + 100 + k))
        kind = draw(st.sampled_from(["Service", "EndpointSlice", "Node"]))
        base = node_object() if kind == "Node" else base_svc.objects[0 if kind == "Service" else 1]
        make: Callable[[JSONObj], st.SearchStrategy[Broken]] = draw(
            st.sampled_from([nearly_valid, hostile])
        )
        broken.append(draw(make(base)))
    quiet = [draw(unprogrammed_services(first + 200 + k)) for k in range(draw(st.integers(0, 2)))]
    objects = [o for g in good for o in g.objects] + [b.obj for b in broken]
    objects += [o for q in quiet for o in q.objects]
    order = draw(st.permutations(objects))
    # The own Node first or last or not at all: good Services must not depend on it.
    node_at = draw(st.sampled_from(["first", "last", "none"]))
    if node_at == "first":
        order = [node_object(), *order]
    elif node_at == "last":
        order = [*order, node_object()]
    return Mix(good, broken, list(order), [q.key for q in quiet])


@st.composite
def unprogrammed_services(draw: st.DrawFn, index: int) -> GoodService:
    """A valid ExternalName or headless Service (with a ready endpoint): nothing to program."""
    g = draw(good_services(index))
    svc = g.objects[0]
    spec = {k: v for k, v in svc["spec"].items() if k not in ("clusterIP", "clusterIPs")}
    spec["type"] = "ClusterIP"
    for p in spec["ports"]:
        p.pop("nodePort", None)
    spec.pop("healthCheckNodePort", None)
    if draw(st.booleans()):
        spec["type"], spec["externalName"] = "ExternalName", "db.example.com"
    else:
        spec["clusterIP"] = "None"
    svc = {**svc, "spec": spec}
    svc.pop("status", None)
    return GoodService([svc, *g.objects[1:]], g.namespace, g.name, (), g.ports, index)


# --- manifest files -----------------------------------------------------------------------------


@st.composite
def manifest_text(draw: st.DrawFn, docs: Sequence[Any]) -> tuple[str, str]:
    """(suffix, text) of one file holding ``docs``: multi-document YAML, a ``kind: List`` (YAML
    or JSON) or a single JSON object."""
    form = draw(st.sampled_from(["multi", "list", "json-list", "json"] if docs else ["multi"]))
    if form == "multi":
        return ".yaml", yaml.safe_dump_all(list(docs), allow_unicode=draw(st.booleans()))
    if form == "list":
        return ".yml", yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": list(docs)})
    if form == "json-list":
        return ".json", json.dumps({"apiVersion": "v1", "kind": "List", "items": list(docs)})
    if len(docs) == 1:
        return ".json", json.dumps(docs[0])
    return ".json", json.dumps({"kind": "List", "items": list(docs)})


#: Files no parser should choke on: broken syntax, wrong document shapes, unsafe tags, binary.
HOSTILE_FILES: list[tuple[str, bytes]] = [
    (".yaml", b"kind: Service\nmetadata: {name: [unclosed\n"),
    (".yaml", b"- just\n- a list\n"),
    (".yaml", b"42\n---\n'a string'\n---\n"),
    (".yaml", b"!!python/object/apply:os.system ['true']\n"),
    (".yaml", b"kind: Service\nmetadata:\n  name: web\n\tspec: {}\n"),
    (".yaml", b"\xff\xfe\x00garbage"),
    (".yaml", b""),
    (".json", b"{not json"),
    (".json", b"[1, 2, 3]"),
    (".json", b'"\\ud800"'),
    (".yaml", b"kind: List\nitems: [1, 'x', null, [2]]\n"),
    (".yaml", b"kind: List\nitems: 5\n"),
    (".json", b'{"kind": "List", "items": {"kind": "Service"}}'),
    (".yaml", b"kind: List\nitems:\n- kind: List\n  items:\n  - kind: Service\n    metadata: 7\n"),
    (
        ".yaml",
        b"kind: Service\nmetadata: {name: web, namespace: default}\nspec: " + b"[" * 60 + b"]" * 60,
    ),
    (".yaml", b"kind: Service\nmetadata: null\nspec: 5\n"),
    (".yaml", b"kind: EndpointSlice\nmetadata: {name: e, labels: 5}\nendpoints: {}\n"),
]


def hostile_files() -> st.SearchStrategy[tuple[str, bytes]]:
    return st.sampled_from(HOSTILE_FILES)
