"""A kind-like cluster made of network namespaces, for kernel tests and ``kubeplex lab``.

Topology (default spec, mirroring a two-worker kind cluster)::

    <prefix>-lan            bridge br0 (172.18.0.1 = gateway, forwards nothing further)
      |-- <prefix>-kind-worker    eth0 172.18.0.5   pods 10.244.1.0/24
      |     |-- <prefix>-web-a    eth0 10.244.1.2   podserver :8080/tcp :8081/udp
      |     `-- <prefix>-client   eth0 10.244.1.3   no server (in-cluster client)
      |-- <prefix>-kind-worker2   eth0 172.18.0.4   pods 10.244.2.0/24
      |     |-- <prefix>-web-b    eth0 10.244.2.2
      |     `-- <prefix>-web-c    eth0 10.244.2.3
      `-- <prefix>-external       eth0 172.18.0.10  routes only the lan /24

Pods are wired like the ptp CNI plugin (which kindnet uses): the pod has ``ip/32`` and a
default route via the node-side gateway ``10.244.i.1``; the node puts that gateway address on
every pod veth and routes each pod ``/32`` to its veth. Nodes route each other's pod CIDR via
the other node's host IP and have a default route to the lan gateway, so node-originated
traffic to a ClusterIP finds a route before the nat OUTPUT chain rewrites it (as on a real
node). The lan namespace keeps ``ip_forward=0``, so anything routed to the gateway dies there.

Dual-stack (``default_spec(ipv6=True)`` / ``DUAL_STACK_SPEC``, opt-in): the same machines also
get unique local IPv6 addresses, wired the same way::

    lan fd00:18::/64 (gateway fd00:18::1)   kind-worker fd00:18::5    kind-worker2 fd00:18::4
    external fd00:18::10                     pods fd00:10:244:1::/64   pods fd00:10:244:2::/64
    web-a fd00:10:244:1::2   client fd00:10:244:1::3   web-b fd00:10:244:2::2   web-c ...::3

Pods have ``ip6/128`` and a default route via the node's ``fd00:10:244:i::1`` (on every pod
veth); nodes forward IPv6 and route each other's pod /64, the lan namespace forwards nothing.
DAD is off in every namespace and addresses are added ``nodad``, so everything is usable as
soon as it exists; the build still polls (with a deadline) that no address is tentative.

Safety: no namespace has a link to the root namespace; every link is a veth between two lab
namespaces, so no packet can leave the lab. Every namespace is named ``<prefix>-<name>``
with a prefix of ``[a-z0-9]`` only, so ``down_all(prefix)`` finds exactly one lab's leftovers.
Each node also has a cgroup2 folder its processes and its pods' run in, and a folder in the
lab's own bpffs (``labkernel``); ``down_all`` removes them too.

Everything is done with iproute2 ``ip -batch`` (one process per namespace) and runs in well
under a second; pod servers are started in parallel and awaited on their READY line.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import secrets
import selectors
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from kubeplex.testing import labkernel

LAB_PREFIX = "kpxlab"  # fixed prefix of ``kubeplex lab`` so ``--down`` finds it from any process
TEST_STEM = "kpxt"  # stem of per-test-session prefixes: ``kpxt<pid>x<hex>``
NETNS_DIR = Path("/run/netns")  # where iproute2 pins named namespaces
LOG_ROOT = Path(tempfile.gettempdir()) / "kubeplex-netlab"
LAN = "lan"  # reserved name of the switch namespace
BRIDGE = "br0"
POD_IFACE = "eth0"  # inside pods and hosts, as in a real cluster

NODE1 = "kind-worker"
NODE2 = "kind-worker2"
WEB_A = "web-a"
WEB_B = "web-b"
WEB_C = "web-c"
CLIENT_POD = "client"
EXTERNAL = "external"
HTTP_PORT = 8080
UDP_PORT = 8081

_PREFIX_RE = re.compile(r"[a-z][a-z0-9]{0,23}")
_NAME_RE = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,38}[a-z0-9])?")
_READY_TIMEOUT = 15.0
_KILL_GRACE = 2.0


class LabError(RuntimeError):
    """The lab could not be built, torn down, or a command inside it failed."""


# --------------------------------------------------------------------------------------- spec


@dataclass(frozen=True)
class NodeSpec:
    """A node: a namespace on the lan with ``host_ip``, routing ``pod_cidr`` to its pods.

    In a dual-stack lab the node also has ``host_ip6`` on the lan and routes ``pod_cidr6``.
    """

    name: str
    host_ip: str
    pod_cidr: str
    host_ip6: str | None = None
    pod_cidr6: str | None = None

    @property
    def gateway(self) -> str:
        """The node-side address of every pod veth (first host of the pod CIDR)."""
        return str(next(ipaddress.IPv4Network(self.pod_cidr).hosts()))

    @property
    def gateway6(self) -> str | None:
        """The IPv6 node-side address of every pod veth (``::1`` of ``pod_cidr6``)."""
        if self.pod_cidr6 is None:
            return None
        return str(next(ipaddress.IPv6Network(self.pod_cidr6).hosts()))


@dataclass(frozen=True)
class PodSpec:
    """A pod on ``node``. With no ports it runs no server (a client pod).

    ``ip6`` is its IPv6 address in a dual-stack lab.
    """

    name: str
    node: str
    ip: str
    http_ports: tuple[int, ...] = (HTTP_PORT,)
    udp_ports: tuple[int, ...] = ()
    ip6: str | None = None

    @property
    def serves(self) -> bool:
        return bool(self.http_ports or self.udp_ports)


@dataclass(frozen=True)
class HostSpec:
    """A machine on the lan outside the pod network (routes only the lan CIDR)."""

    name: str
    ip: str
    ip6: str | None = None


@dataclass(frozen=True)
class LabSpec:
    """The lab's machines and addresses; ``lan_cidr6`` set makes it dual-stack.

    A dual-stack lab needs an IPv6 address on every node (``host_ip6``, ``pod_cidr6``), pod
    (``ip6``) and host (``ip6``); an IPv4-only lab must have none.
    """

    nodes: tuple[NodeSpec, ...]
    pods: tuple[PodSpec, ...] = ()
    hosts: tuple[HostSpec, ...] = ()
    lan_cidr: str = "172.18.0.0/24"
    lan_gateway: str | None = "172.18.0.1"
    lan_cidr6: str | None = None
    lan_gateway6: str | None = None

    def __post_init__(self) -> None:
        errors = list(_validate(self))
        if errors:
            raise LabError("invalid lab spec: " + "; ".join(errors))

    @property
    def lan_prefixlen(self) -> int:
        return ipaddress.IPv4Network(self.lan_cidr).prefixlen

    @property
    def dual_stack(self) -> bool:
        return self.lan_cidr6 is not None

    @property
    def lan_prefixlen6(self) -> int:
        if self.lan_cidr6 is None:
            raise LabError("the lab is IPv4-only (no lan_cidr6)")
        return ipaddress.IPv6Network(self.lan_cidr6).prefixlen

    def names(self) -> list[str]:
        return (
            [n.name for n in self.nodes]
            + [p.name for p in self.pods]
            + [h.name for h in self.hosts]
        )

    def node(self, name: str) -> NodeSpec:
        for n in self.nodes:
            if n.name == name:
                return n
        raise LabError(f"no node {name!r} in lab spec")

    def pod(self, name: str) -> PodSpec:
        for p in self.pods:
            if p.name == name:
                return p
        raise LabError(f"no pod {name!r} in lab spec")

    def host(self, name: str) -> HostSpec:
        for h in self.hosts:
            if h.name == name:
                return h
        raise LabError(f"no host {name!r} in lab spec")

    def pods_on(self, node: str) -> list[PodSpec]:
        return [p for p in self.pods if p.node == node]

    def ip_of(self, name: str, *, ipv6: bool = False) -> str:
        """The address of a node (its lan address), pod or host, in one family."""
        ip: str | None
        if name in (n.name for n in self.nodes):
            n = self.node(name)
            ip = n.host_ip6 if ipv6 else n.host_ip
        elif name in (p.name for p in self.pods):
            p = self.pod(name)
            ip = p.ip6 if ipv6 else p.ip
        else:
            h = self.host(name)
            ip = h.ip6 if ipv6 else h.ip
        if ip is None:
            raise LabError(f"{name} has no IPv6 address (the lab is IPv4-only)")
        return ip


@dataclass(frozen=True)
class _FamilyView:
    """One family's addresses of a spec, so both families are validated by the same code."""

    label: str
    version: int
    lan_cidr: str
    lan_ips: list[tuple[str, str | None]]  # (owner, address)
    pod_cidrs: list[tuple[str, str | None]]  # (node, cidr)
    pod_ips: list[tuple[PodSpec, str | None]]


def _views(spec: LabSpec) -> Iterator[_FamilyView]:
    lan4: list[tuple[str, str | None]] = [(n.name, n.host_ip) for n in spec.nodes]
    lan4 += [(h.name, h.ip) for h in spec.hosts]
    if spec.lan_gateway is not None:
        lan4.append(("lan_gateway", spec.lan_gateway))
    yield _FamilyView(
        "",
        4,
        spec.lan_cidr,
        lan4,
        [(n.name, n.pod_cidr) for n in spec.nodes],
        [(p, p.ip) for p in spec.pods],
    )
    if spec.lan_cidr6 is None:
        return
    lan6: list[tuple[str, str | None]] = [(n.name, n.host_ip6) for n in spec.nodes]
    lan6 += [(h.name, h.ip6) for h in spec.hosts]
    if spec.lan_gateway6 is not None:
        lan6.append(("lan_gateway6", spec.lan_gateway6))
    yield _FamilyView(
        "IPv6 ",
        6,
        spec.lan_cidr6,
        lan6,
        [(n.name, n.pod_cidr6) for n in spec.nodes],
        [(p, p.ip6) for p in spec.pods],
    )


def _validate(spec: LabSpec) -> Iterator[str]:
    names = spec.names()
    for name in names:
        if not _NAME_RE.fullmatch(name):
            yield f"name {name!r} must be lowercase [a-z0-9-], at most 40 characters"
        if name == LAN:
            yield f"name {LAN!r} is reserved for the switch namespace"
    dupes = sorted(n for n, c in Counter(names).items() if c > 1)
    if dupes:
        yield f"duplicate names {dupes}"
    if spec.lan_cidr6 is None:
        v6 = [n.name for n in spec.nodes if n.host_ip6 or n.pod_cidr6]
        v6 += [p.name for p in spec.pods if p.ip6] + [h.name for h in spec.hosts if h.ip6]
        if spec.lan_gateway6 is not None:
            v6.append("lan_gateway6")
        if v6:
            yield f"IPv6 addresses of {v6} need lan_cidr6 (a dual-stack lab)"
    for view in _views(spec):
        yield from _validate_family(spec, view)
    for p in spec.pods:
        for port in (*p.http_ports, *p.udp_ports):
            if not 1 <= port <= 65535:
                yield f"pod {p.name}: port {port} out of range"


def _validate_family(spec: LabSpec, view: _FamilyView) -> Iterator[str]:
    fam = view.label
    try:
        lan = ipaddress.ip_network(view.lan_cidr)
        if lan.version != view.version:
            raise ValueError(f"{view.lan_cidr} is not an IPv{view.version} network")
    except ValueError as exc:
        yield f"{'lan_cidr6' if view.version == 6 else 'lan_cidr'}: {exc}"
        return
    lan_ips: list[str] = []
    for owner, ip in view.lan_ips:
        if ip is None:
            yield f"{owner}: needs an {fam}address in a dual-stack lab"
            continue
        lan_ips.append(ip)
        if not _host_in(ip, lan):
            yield f"address {ip!r} is not a host address of lan {view.lan_cidr}"
    dupes = sorted(i for i, c in Counter(lan_ips).items() if c > 1)
    if dupes:
        yield f"duplicate {fam}lan addresses {dupes}"
    cidrs: dict[str, ipaddress.IPv4Network | ipaddress.IPv6Network] = {}
    for node, cidr in view.pod_cidrs:
        if cidr is None:
            yield f"node {node}: needs an {fam}pod_cidr6 in a dual-stack lab"
            continue
        try:
            net = ipaddress.ip_network(cidr)
            if net.version != view.version:
                raise ValueError(f"{cidr} is not an IPv{view.version} network")
        except ValueError as exc:
            yield f"node {node}: {fam}pod_cidr: {exc}"
            continue
        if net.num_addresses < 4:
            yield f"node {node}: {fam}pod_cidr {cidr} is too small"
            continue
        for other, onet in cidrs.items():
            if net.overlaps(onet):
                yield f"node {node}: {fam}pod_cidr {cidr} overlaps node {other}"
        if net.overlaps(lan):
            yield f"node {node}: {fam}pod_cidr {cidr} overlaps the lan"
        cidrs[node] = net
    pod_ips = [ip for _, ip in view.pod_ips if ip is not None]
    dupes = sorted(i for i, c in Counter(pod_ips).items() if c > 1)
    if dupes:
        yield f"duplicate {fam}pod addresses {dupes}"
    for p, ip in view.pod_ips:
        if ip is None:
            yield f"pod {p.name}: needs an {fam}address (ip6) in a dual-stack lab"
            continue
        pod_net = cidrs.get(p.node)
        if pod_net is None:
            if p.node not in {n.name for n in spec.nodes}:
                yield f"pod {p.name}: unknown node {p.node!r}"
            continue
        if not _host_in(ip, pod_net) or ip == str(next(pod_net.hosts())):
            gw = ".1" if view.version == 4 else "::1"
            yield f"pod {p.name}: {ip!r} is not a free host address of {pod_net} ({gw}: gateway)"


def _host_in(ip: str, net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> bool:
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return False
    if addr.version != net.version or addr not in net or addr == net.network_address:
        return False
    return not (net.version == 4 and addr == net.broadcast_address)


#: The dual-stack lab's IPv6 plan (unique local addresses): lan, node and host addresses.
LAN_CIDR6 = "fd00:18::/64"
LAN_GATEWAY6 = "fd00:18::1"
NODE1_IP6 = "fd00:18::5"
NODE2_IP6 = "fd00:18::4"
EXTERNAL_IP6 = "fd00:18::10"


def default_spec(
    node1_ip: str = "172.18.0.5",
    node2_ip: str = "172.18.0.4",
    external_ip: str = "172.18.0.10",
    *,
    udp_port: int | None = UDP_PORT,
    ipv6: bool = False,
) -> LabSpec:
    """The seed article's cluster: two kind workers, three web pods, a client pod, a host.

    ``ipv6=True`` makes it dual-stack: lan ``fd00:18::/64`` (kind-worker ``::5``,
    kind-worker2 ``::4``, external ``::10``, gateway ``::1``), pod CIDRs
    ``fd00:10:244:{1,2}::/64`` with the same host numbers as the IPv4 pods.
    """
    udp = (udp_port,) if udp_port else ()

    def v6(ip: str) -> str | None:
        return ip if ipv6 else None

    return LabSpec(
        nodes=(
            NodeSpec(NODE1, node1_ip, "10.244.1.0/24", v6(NODE1_IP6), v6("fd00:10:244:1::/64")),
            NodeSpec(NODE2, node2_ip, "10.244.2.0/24", v6(NODE2_IP6), v6("fd00:10:244:2::/64")),
        ),
        pods=(
            PodSpec(WEB_A, NODE1, "10.244.1.2", udp_ports=udp, ip6=v6("fd00:10:244:1::2")),
            PodSpec(CLIENT_POD, NODE1, "10.244.1.3", http_ports=(), ip6=v6("fd00:10:244:1::3")),
            PodSpec(WEB_B, NODE2, "10.244.2.2", udp_ports=udp, ip6=v6("fd00:10:244:2::2")),
            PodSpec(WEB_C, NODE2, "10.244.2.3", udp_ports=udp, ip6=v6("fd00:10:244:2::3")),
        ),
        hosts=(HostSpec(EXTERNAL, external_ip, v6(EXTERNAL_IP6)),),
        lan_cidr6=v6(LAN_CIDR6),
        lan_gateway6=v6(LAN_GATEWAY6),
    )


DEFAULT_SPEC = default_spec()
DUAL_STACK_SPEC = default_spec(ipv6=True)


# ------------------------------------------------------------------------------------ results


@dataclass(frozen=True)
class ProbeResult:
    """One request of ``netclient``: outcome ok/refused/timeout/unreachable/reset/error."""

    outcome: str
    ms: float
    body: str | None = None
    status: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ProbeResult:
        return cls(
            outcome=str(doc["outcome"]),
            ms=float(doc.get("ms", 0.0)),
            body=doc.get("body"),
            status=doc.get("status"),
            error=doc.get("error"),
        )


def tally(results: Iterable[ProbeResult]) -> Counter[str]:
    """Count answers: the body for ``ok`` results (a pod name), the outcome otherwise."""
    return Counter((r.body or "") if r.ok else r.outcome for r in results)


# ------------------------------------------------------------------------- namespace plumbing


def _check_prefix(prefix: str) -> None:
    # No '-' in a prefix: "<prefix>-" then can never be the start of another lab's namespace.
    if not _PREFIX_RE.fullmatch(prefix):
        raise LabError(f"lab prefix {prefix!r} must match [a-z][a-z0-9]{{0,23}}")


def _ip(args: Sequence[str], *, stdin: str | None = None, check: bool = True) -> str:
    cmd = ["ip", *args]
    try:
        cp = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LabError(f"{shlex.join(cmd)}: {exc}") from exc
    if check and cp.returncode != 0:
        detail = cp.stderr.strip() or cp.stdout.strip()
        raise LabError(f"{shlex.join(cmd)} exited {cp.returncode}: {detail}")
    return cp.stdout


def _batch(ns: str | None, lines: Sequence[str]) -> None:
    """Run ``ip`` commands in one process (inside ``ns``): a spawn per namespace, not per link."""
    args = ["-n", ns] if ns else []
    _ip([*args, "-batch", "-"], stdin="".join(f"{line}\n" for line in lines))


def list_namespaces(prefix: str | None = None) -> list[str]:
    """Named network namespaces, optionally only those of one lab prefix."""
    try:
        names = sorted(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return []
    if prefix is None:
        return names
    return [n for n in names if n.startswith(f"{prefix}-")]


def _ns_key(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _pids_in(namespaces: Iterable[str]) -> set[int]:
    """Pids whose network namespace is one of ``namespaces`` (what ``ip netns pids`` does)."""
    keys = {k for ns in namespaces if (k := _ns_key(str(NETNS_DIR / ns))) is not None}
    if not keys:
        return set()
    pids: set[int] = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _ns_key(f"/proc/{entry}/ns/net") in keys:
            pids.add(int(entry))
    return pids


def _signal_in(pid: int, keys: set[tuple[int, int]], sig: int) -> None:
    """Signal ``pid`` only if it still lives in one of our namespaces.

    The pidfd pins the process, and the namespace check after opening it makes sure a pid
    that was recycled since the /proc scan is never signalled.
    """
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        if _ns_key(f"/proc/{pid}/ns/net") in keys:
            signal.pidfd_send_signal(fd, sig)
    except OSError:
        pass
    finally:
        os.close(fd)


def _kill_in(namespaces: Sequence[str], grace: float) -> None:
    keys = {k for ns in namespaces if (k := _ns_key(str(NETNS_DIR / ns))) is not None}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = _pids_in(namespaces)
        if not pids:
            return
        for pid in pids:
            _signal_in(pid, keys, sig)
        deadline = time.monotonic() + grace
        while _pids_in(namespaces) and time.monotonic() < deadline:
            time.sleep(0.02)  # polling process exit, bounded by the deadline


def down_all(prefix: str, *, grace: float = _KILL_GRACE) -> list[str]:
    """Remove every namespace of ``prefix`` and kill the processes inside them.

    Tolerates any partial state (half-built lab, servers already dead, nothing at all).
    Returns the namespaces that were removed.
    """
    _check_prefix(prefix)
    names = list_namespaces(prefix)
    if names:
        _kill_in(names, grace)
    # The node cgroups (and what runs in them) and the bpffs mount, even without namespaces.
    kernel_left = labkernel.remove(prefix, grace)
    if names:
        # -force: keep deleting after an error, one missing namespace must not strand others.
        _ip(
            ["-force", "-batch", "-"], stdin="".join(f"netns del {n}\n" for n in names), check=False
        )
    left = list_namespaces(prefix)
    shutil.rmtree(LOG_ROOT / prefix, ignore_errors=True)
    if left or kernel_left:
        raise LabError(f"could not remove {'; '.join([*map(str, left), *kernel_left])}")
    return names


def unique_prefix(stem: str = TEST_STEM) -> str:
    """A prefix no parallel run uses: ``<stem><pid>x<hex>`` (the pid lets ``reap_stale`` work)."""
    prefix = f"{stem}{os.getpid()}x{secrets.token_hex(2)}"
    _check_prefix(prefix)
    return prefix


def reap_stale(stem: str = TEST_STEM) -> list[str]:
    """Remove labs of ``unique_prefix(stem)`` whose creating process is dead (a killed run).

    Labs of live processes are left alone, so parallel sessions never tear each other down.
    """
    pattern = re.compile(rf"{re.escape(stem)}(\d+)x[0-9a-f]+")
    removed: list[str] = []
    for prefix in sorted({ns.split("-", 1)[0] for ns in list_namespaces()} | labkernel.prefixes()):
        m = pattern.fullmatch(prefix)
        if m and not _pid_alive(int(m.group(1))):
            removed += down_all(prefix)
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---------------------------------------------------------------------------------------- lab


@dataclass
class _Server:
    name: str
    proc: subprocess.Popen[bytes]

    @property
    def fd(self) -> int:
        assert self.proc.stdout is not None
        return self.proc.stdout.fileno()


@dataclass
class Lab:
    """A namespace cluster built from ``spec``; every namespace is ``<prefix>-<name>``.

    ``Lab(spec, prefix)`` without ``up()`` attaches to a lab that is already up (e.g. one
    started by ``kubeplex lab`` in another process): ``exec``/``http``/``udp`` only need names.

    Every process started in a node or in a pod of it runs in the node's cgroup2 folder
    (``cgroup_of``), and each node has a folder in the lab's own bpffs (``bpffs_of``); see
    ``labkernel``. The lan and the hosts outside the cluster are in no node cgroup.
    """

    spec: LabSpec = DEFAULT_SPEC
    prefix: str = LAB_PREFIX
    python: str = sys.executable
    log_dir: Path | None = None
    timings: dict[str, float] = field(default_factory=dict, init=False)
    #: Why ``up()`` built the lab without node cgroups / without a bpffs (None: with them).
    no_cgroups: str | None = field(default=None, init=False)
    no_bpffs: str | None = field(default=None, init=False)
    _servers: list[_Server] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        _check_prefix(self.prefix)
        if self.log_dir is None:
            self.log_dir = LOG_ROOT / self.prefix

    # -------------------------------------------------------------------------- naming

    def namespace_of(self, name: str) -> str:
        """The namespace of a node, pod or host name (or ``"lan"``, the switch)."""
        if name == LAN or name in self.spec.names():
            return f"{self.prefix}-{name}"
        raise LabError(f"no node, pod or host {name!r} in lab {self.prefix}")

    @property
    def namespaces(self) -> list[str]:
        return [self.namespace_of(n) for n in (LAN, *self.spec.names())]

    def _resolve(self, ns: str) -> str:
        if ns in self.namespaces:
            return ns
        return self.namespace_of(ns)

    def is_up(self) -> bool:
        return set(self.namespaces) <= set(list_namespaces(self.prefix))

    def node_of(self, ns: str) -> str | None:
        """The node a node or pod namespace belongs to (None: the lan or a host)."""
        name = self._resolve(ns).removeprefix(f"{self.prefix}-")
        if name in (n.name for n in self.spec.nodes):
            return name
        if name in (p.name for p in self.spec.pods):
            return self.spec.pod(name).node
        return None

    def cgroup_of(self, ns: str) -> Path | None:
        """The cgroup2 folder the processes of a node (or of a pod on it) run in; None for
        the lan and the hosts, and where the lab has no cgroups."""
        node = self.node_of(ns)
        folder = labkernel.lab_cgroup(self.prefix)
        if node is None or folder is None or not (folder / node).is_dir():
            return None
        return folder / node

    def bpffs_of(self, ns: str) -> Path | None:
        """The node's own folder in the lab's bpffs (None: as for ``cgroup_of``)."""
        node = self.node_of(ns)
        mount = labkernel.lab_bpffs(self.prefix)
        if node is None or not (mount / node).is_dir() or not labkernel.is_bpffs_mount(mount):
            return None
        return mount / node

    # ------------------------------------------------------------------------ lifecycle

    def __enter__(self) -> Lab:
        return self.up()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.down()

    def up(self, *, replace: bool = False) -> Lab:
        """Build every namespace and start the pod servers; on any failure, tear down.

        With ``replace`` an existing lab of the same prefix is removed first; otherwise its
        presence is an error (two runs must not share a prefix).
        """
        existing = list_namespaces(self.prefix)
        if existing:
            if not replace:
                raise LabError(f"lab {self.prefix} already exists: {existing}")
            down_all(self.prefix)
        start = time.monotonic()
        try:
            self._build()
            self._make_kernel_folders()
            self._start_servers()
        except BaseException:
            self.down()
            raise
        self.timings["up"] = time.monotonic() - start
        return self

    def down(self) -> None:
        """Kill the servers and remove every namespace of the prefix. Idempotent."""
        start = time.monotonic()
        try:
            for srv in self._servers:  # signal all first: they exit in parallel
                if srv.proc.poll() is None:
                    srv.proc.terminate()
            for srv in self._servers:
                _stop(srv.proc)
        finally:
            self._servers.clear()
            down_all(self.prefix)  # also kills anything else left inside the namespaces
        self.timings["down"] = time.monotonic() - start

    def _build(self) -> None:
        spec = self.spec
        ns = self.namespace_of
        plen = spec.lan_prefixlen
        dual = spec.dual_stack
        _batch(None, [f"netns add {n}" for n in self.namespaces])
        if dual:
            self._ipv6_sysctls()

        # The switch: one veth per lan member, the far end created directly in the member.
        # Dual-stack: no multicast snooping, so neighbour solicitations are plainly flooded.
        snooping = " mcast_snooping 0" if dual else ""
        lan = [
            f"link add {BRIDGE} type bridge forward_delay 0 stp_state 0{snooping}",
            f"link set {BRIDGE} up",
        ]
        if spec.lan_gateway:
            lan.append(f"addr add {spec.lan_gateway}/{plen} dev {BRIDGE}")
        if dual and spec.lan_gateway6:
            lan.append(f"addr add {spec.lan_gateway6}/{spec.lan_prefixlen6} dev {BRIDGE} nodad")
        members = [(n.name, n.host_ip) for n in spec.nodes] + [(h.name, h.ip) for h in spec.hosts]
        for i, (name, _) in enumerate(members):
            lan += [
                f"link add lan{i} type veth peer name {POD_IFACE} netns {ns(name)}",
                f"link set lan{i} master {BRIDGE}",
                f"link set lan{i} up",
            ]
        lan.append("link set lo up")
        _batch(ns(LAN), lan)

        for node in spec.nodes:
            cmds = [
                "link set lo up",
                f"addr add {node.host_ip}/{plen} dev {POD_IFACE}",
            ]
            if dual:
                cmds.append(f"addr add {node.host_ip6}/{spec.lan_prefixlen6} dev {POD_IFACE} nodad")
            cmds.append(f"link set {POD_IFACE} up")
            for j, pod in enumerate(spec.pods_on(node.name)):
                veth = f"veth{j}"
                cmds += [
                    f"link add {veth} type veth peer name {POD_IFACE} netns {ns(pod.name)}",
                    f"addr add {node.gateway}/32 dev {veth}",
                ]
                if dual:
                    cmds.append(f"addr add {node.gateway6}/128 dev {veth} nodad")
                cmds += [
                    f"link set {veth} up",
                    f"route add {pod.ip}/32 dev {veth} scope link src {node.gateway}",
                ]
                if dual:
                    cmds.append(f"route add {pod.ip6}/128 dev {veth} src {node.gateway6}")
            for other in spec.nodes:
                if other is not node:
                    cmds.append(f"route add {other.pod_cidr} via {other.host_ip} dev {POD_IFACE}")
                    if dual:
                        cmds.append(
                            f"route add {other.pod_cidr6} via {other.host_ip6} dev {POD_IFACE}"
                        )
            if spec.lan_gateway:
                cmds.append(f"route add default via {spec.lan_gateway} dev {POD_IFACE}")
            if dual and spec.lan_gateway6:
                cmds.append(f"route add ::/0 via {spec.lan_gateway6} dev {POD_IFACE}")
            _batch(ns(node.name), cmds)

        for host in spec.hosts:
            # Only the connected lan route: an outside machine knows nothing of the pod network.
            cmds = ["link set lo up", f"addr add {host.ip}/{plen} dev {POD_IFACE}"]
            if dual:
                cmds.append(f"addr add {host.ip6}/{spec.lan_prefixlen6} dev {POD_IFACE} nodad")
            cmds.append(f"link set {POD_IFACE} up")
            _batch(ns(host.name), cmds)

        for pod in spec.pods:
            node = spec.node(pod.node)
            gw = node.gateway
            cmds = ["link set lo up", f"addr add {pod.ip}/32 dev {POD_IFACE}"]
            if dual:
                cmds.append(f"addr add {pod.ip6}/128 dev {POD_IFACE} nodad")
            cmds += [
                f"link set {POD_IFACE} up",
                f"route add {gw}/32 dev {POD_IFACE} scope link",
                f"route add default via {gw} dev {POD_IFACE} src {pod.ip}",
            ]
            if dual:
                cmds += [
                    f"route add {node.gateway6}/128 dev {POD_IFACE}",
                    f"route add ::/0 via {node.gateway6} dev {POD_IFACE} src {pod.ip6}",
                ]
            _batch(ns(pod.name), cmds)

        for node in spec.nodes:
            self.exec(node.name, ["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])
        # br_netfilter may be loaded on the host: keep the switch a plain switch, so bridged
        # frames never meet netfilter/conntrack in the lan namespace. -e: fine if not loaded.
        # ip_forward=0 explicitly: the gateway must be a dead end, whatever a kernel defaults to.
        self.exec(
            LAN,
            [
                "sysctl",
                "-q",
                "-e",
                "-w",
                "net.ipv4.ip_forward=0",
                "net.bridge.bridge-nf-call-iptables=0",
                "net.bridge.bridge-nf-call-ip6tables=0",
            ],
        )
        if dual:
            self._await_ipv6_ready()

    def _make_kernel_folders(self) -> None:
        """A cgroup per node and the lab's bpffs; where the machine refuses, none (said why)."""
        nodes = [n.name for n in self.spec.nodes]
        try:
            labkernel.make_cgroups(self.prefix, nodes)
        except OSError as err:
            self.no_cgroups = f"no node cgroups: {err}"
        try:
            labkernel.mount_bpffs(self.prefix, nodes)
        except OSError as err:
            self.no_bpffs = f"no bpffs: {err}"

    def _ipv6_sysctls(self) -> None:
        """Before any link exists: IPv6 on, no DAD, forwarding only on nodes.

        Links copy ``conf.default`` when they are created, so this must run first. Without DAD
        every address (link-local ones too, which neighbour solicitations come from) is usable
        at once. One ``ip -batch`` forks a ``sysctl`` into each namespace.
        """
        node_names = {n.name for n in self.spec.nodes}
        lines = []
        for name in (LAN, *self.spec.names()):
            keys = [
                f"net.ipv6.conf.{which}.{key}={value}"
                for which in ("all", "default")
                for key, value in (("disable_ipv6", 0), ("accept_dad", 0), ("accept_ra", 0))
            ]
            # The lan gateway must be a dead end for IPv6 too; nodes route their pods.
            keys.append(f"net.ipv6.conf.all.forwarding={1 if name in node_names else 0}")
            lines.append(f"netns exec {self.namespace_of(name)} sysctl -q -w {' '.join(keys)}")
        _batch(None, lines)

    def _await_ipv6_ready(self, timeout: float = 5.0) -> None:
        """Poll until no IPv6 address of the lab is tentative (nodad should make it instant)."""
        deadline = time.monotonic() + timeout
        pending = list(self.namespaces)
        while True:
            pending = [
                n for n in pending if _ip(["-n", n, "-6", "addr", "show", "tentative"]).strip()
            ]
            if not pending:
                return
            if time.monotonic() >= deadline:
                raise LabError(f"IPv6 addresses still tentative after {timeout}s in {pending}")
            time.sleep(0.02)  # polling address state, bounded by the deadline

    def _start_servers(self) -> None:
        pending: dict[int, _Server] = {}
        for pod in self.spec.pods:
            if pod.serves:
                srv = self._spawn(pod.name, pod.name, pod.http_ports, pod.udp_ports)
                pending[srv.fd] = srv
        self._await_ready(pending)

    def start_server(
        self,
        ns: str,
        name: str,
        *,
        http_ports: Sequence[int] = (HTTP_PORT,),
        udp_ports: Sequence[int] = (),
    ) -> int:
        """Start a podserver answering ``name`` in any lab namespace; returns its pid.

        For servers the spec does not describe, e.g. a hostNetwork "pod" in a node namespace.
        It is stopped by ``stop_server(name)`` or ``down()``.
        """
        if any(s.name == name for s in self._servers):
            raise LabError(f"a server named {name!r} is already running")
        srv = self._spawn(ns, name, http_ports, udp_ports)
        self._await_ready({srv.fd: srv})
        return srv.proc.pid

    def stop_server(self, name: str) -> None:
        """Stop one server (a pod "dying"); its namespace and addresses stay."""
        for srv in [s for s in self._servers if s.name == name]:
            _stop(srv.proc)
            self._servers.remove(srv)

    def _spawn(
        self, ns: str, name: str, http_ports: Sequence[int], udp_ports: Sequence[int]
    ) -> _Server:
        assert self.log_dir is not None
        if not http_ports and not udp_ports:
            raise LabError(f"server {name!r} needs at least one port")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        argv = [self.python, "-m", "kubeplex.testing.podserver", "--name", name]
        argv += [a for p in http_ports for a in ("--port", str(p))]
        argv += [a for p in udp_ports for a in ("--udp-port", str(p))]
        log = self.log_dir / f"{name}.log"
        with log.open("wb") as logf:
            proc = subprocess.Popen(
                labkernel.in_cgroup(
                    self.cgroup_of(ns), ["ip", "netns", "exec", self._resolve(ns), *argv]
                ),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=logf,
                cwd="/",
                # Own session: a Ctrl-C aimed at pytest or `kubeplex lab` must not kill
                # servers behind the teardown's back; teardown kills them explicitly.
                start_new_session=True,
            )
        srv = _Server(name, proc)
        self._servers.append(srv)
        return srv

    def _await_ready(self, pending: dict[int, _Server]) -> None:
        """Wait for every server's READY line (printed after its sockets listen)."""
        deadline = time.monotonic() + _READY_TIMEOUT
        sel = selectors.DefaultSelector()
        buffers: dict[int, bytes] = {}
        for fd in pending:
            sel.register(fd, selectors.EVENT_READ)
        try:
            while pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    names = sorted(s.name for s in pending.values())
                    raise LabError(f"pod servers not ready after {_READY_TIMEOUT}s: {names}")
                for key, _ in sel.select(timeout=left):
                    fd = int(key.fd)
                    srv = pending[fd]
                    chunk = os.read(fd, 4096)
                    buffers[fd] = buffers.get(fd, b"") + chunk
                    if buffers[fd].startswith(b"READY ") and b"\n" in buffers[fd]:
                        sel.unregister(fd)
                        del pending[fd]
                        _close(srv.proc.stdout)
                    elif not chunk:
                        raise LabError(
                            f"server {srv.name} exited before ready "
                            f"(rc={srv.proc.wait()}): {self.server_log(srv.name)[-2000:]}"
                        )
        finally:
            sel.close()

    # ---------------------------------------------------------------------------- using

    def server_log(self, name: str) -> str:
        """The stderr of a server (empty if it has none); the file goes with ``down()``."""
        assert self.log_dir is not None
        try:
            return (self.log_dir / f"{name}.log").read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def server_pids(self) -> dict[str, int]:
        return {s.name: s.proc.pid for s in self._servers if s.proc.poll() is None}

    def exec(
        self,
        ns: str,
        argv: Sequence[str],
        *,
        check: bool = True,
        timeout: float = 60.0,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside a lab namespace (a name like ``kind-worker`` or the full name)."""
        netns = self._resolve(ns)
        cmd = labkernel.in_cgroup(self.cgroup_of(netns), ["ip", "netns", "exec", netns, *argv])
        try:
            cp = subprocess.run(
                cmd, input=input, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise LabError(f"[{netns}] {shlex.join(argv)}: timed out after {timeout}s") from exc
        except OSError as exc:
            raise LabError(f"[{netns}] {shlex.join(argv)}: {exc}") from exc
        if check and cp.returncode != 0:
            detail = cp.stderr.strip() or cp.stdout.strip()
            raise LabError(f"[{netns}] {shlex.join(argv)} exited {cp.returncode}: {detail}")
        return cp

    def http(
        self,
        from_ns: str,
        ip: str,
        port: int,
        path: str = "/hostname",
        *,
        count: int = 1,
        timeout: float = 2.0,
        interval: float = 0.0,
        source_ip: str | None = None,
    ) -> list[ProbeResult]:
        """``count`` HTTP GETs from ``from_ns``, a new TCP connection each."""
        args = ["http", ip, str(port), path]
        if source_ip:
            args += ["--source-ip", source_ip]
        return self._probe(from_ns, args, count, timeout, interval)

    def udp(
        self,
        from_ns: str,
        ip: str,
        port: int,
        *,
        payload: str = "hostname",
        count: int = 1,
        timeout: float = 2.0,
        interval: float = 0.0,
        source_ip: str | None = None,
        source_port: int | None = None,
    ) -> list[ProbeResult]:
        """``count`` UDP exchanges; ``source_port`` pins the 5-tuple (one conntrack flow)."""
        args = ["udp", ip, str(port), "--payload", payload]
        if source_ip:
            args += ["--source-ip", source_ip]
        if source_port is not None:
            args += ["--source-port", str(source_port)]
        return self._probe(from_ns, args, count, timeout, interval)

    def _probe(
        self, from_ns: str, args: list[str], count: int, timeout: float, interval: float
    ) -> list[ProbeResult]:
        argv = [self.python, "-m", "kubeplex.testing.netclient", *args]
        argv += ["--count", str(count), "--timeout", str(timeout), "--interval", str(interval)]
        budget = count * (timeout + interval) + 15.0
        cp = self.exec(from_ns, argv, timeout=budget)
        try:
            doc = json.loads(cp.stdout)
            return [ProbeResult.from_json(r) for r in doc["results"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise LabError(f"netclient output unreadable: {cp.stdout[:500]!r}") from exc

    def add_route(self, ns: str, dest: str, via: str) -> None:
        """Add a route in a namespace, e.g. the external host's route to a service CIDR."""
        self.exec(ns, ["ip", "route", "add", dest, "via", via])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout=_KILL_GRACE)
    except subprocess.TimeoutExpired:
        proc.kill()
        # Unkillable for now (D state): down_all reports it if its namespace cannot go.
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=_KILL_GRACE)


def _close(f: IO[bytes] | None) -> None:
    if f is not None:
        f.close()
