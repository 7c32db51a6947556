"""Cold start and memory: ``kubeplex run`` against an API server holding N Services x 10 endpoints.

For each size and mode (root; each run in a throw-away network namespace): the in-tree list/watch
API server (tests/apiserver, JSON, lists streamed and paginated as the real server answers them) is
loaded with N Services, their EndpointSlices (10 endpoints each, ``--endpoints``), the Node and
the ServiceCIDR; then the installed CLI starts ``kubeplex run`` against it and the benchmark
polls the kernel until the last Service's chain is live (referenced from the dispatch rules,
which every mode writes last). Then,
while the proxy runs, it changes EndpointSlices at a steady rate through the server's write path
(each change gives one endpoint a new address) and waits for the last change to be live.

It prints, per size and mode (medians of ``--repeat`` runs):
  start->kernel   process start to every rule in the kernel
  breakdown       from the server's request log and the daemon's JSON log: start -> first API
                  request (interpreter, imports, configuration, client), -> initial lists complete
                  (transfer and decoding, the daemon's "initial list complete" lines), -> first
                  sync start (its "sync starting (full)" line; from a daemon that does not log
                  it, its "synced ... in X ms" line less X), the first sync itself (its
                  checkout, then the backend's X ms), and sync end -> seen in the kernel (before
                  the first sync: to its start, and to the end of its checkout); and
                  what imports cost, from one more cold start under ``python -X importtime``
                  (not counted in the figures)
  rss             VmHWM (peak RSS) after the first sync and at the end, before stopping
  burst           last change -> live in the kernel, the proxy's CPU share during the burst
                  (itself, and with the restore tools it ran), the largest
                  kubeproxy_sync_proxy_rules_endpoint_changes_pending scraped, syncs it made

The API server runs in this process, on the same CPUs as the proxy (a real one runs on a
control-plane node; this one is Python): the first line of each size says how long it alone takes
to serve the lists kubeplex asks for (at resourceVersion 0: whole), and that plus a json.loads.
The objects are as a cluster holds them (managedFields, owner and pod references, conditions,
zones; ``--bare`` for the minimal ones).

The server speaks HTTPS and asks for a bearer token, as a real one does. The proxy reads a
kubeconfig (server, CA and token); ``--auth in-cluster`` starts it as in a pod instead (the Helm
chart's way): no kubeconfig, the service account's token and CA where a pod has them (in a mount
namespace of its own, made before its start is counted, as a container runtime makes it), the
server at ``KUBERNETES_SERVICE_HOST``.

Each start finds the dataclass methods the image's build step compiled
(``kubeplex.core.startup.codecache``, beside the bytecode; the step is run when the package is
laid out); ``--cold-cache`` removes them before each start, as for a pod's first start from an
image that does not ship them.

kubeplex runs as pip installs it (as in the image): this checkout's package is copied, compiled
and run by a venv whose site-packages names it and the dependencies, so the checkout's editable
install and its import hooks play no part (``--editable`` runs through them instead: 20-40 ms
more before the first sync). ``--baseline DIR`` also runs the kubeplex package under DIR
(``DIR/kubeplex/core``, ...) laid out the same way, run by run interleaved with the other's, and
reports it after; ``--kubeplex DIR`` runs the one under DIR instead of this checkout's (two
snapshots compared in the same time window).

Usage: python bench/cold_start.py [--modes iptables,nftables] [--sizes 1000,10000] [--repeat 3]
           [--endpoints 10] [--rate 100] [--seconds 10] [--bare] [--auth in-cluster]
           [--json FILE] [--baseline DIR] [--kubeplex DIR] [--editable] [--cold-cache]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import ssl
import statistics
import struct
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import KUBEPLEX_CMD, NODE, Netns, cluster, config, installed_env

from kubeplex.backends.iptables import names as ipt_names
from kubeplex.backends.nftables import names as nft_names
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.netns import run_in_netns
from kubeplex.core.model.types import Endpoint, ServicePortName

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from apiserver import TLS_CERT, FakeApiServer

NAMESPACE = "bench"
TARGET_PORT = 8080
METRICS_PORT = 10249
POLL = 0.01
#: Where the burst's new endpoint addresses come from (inside clusterCIDR, apart from the
#: addresses common.cluster gives: those end below 10.130.0.0 at 10,000 Services).
BURST_BASE = (10 << 24) | (160 << 16)
CLK_TCK = os.sysconf("SC_CLK_TCK")

# ------------------------------------------------------------------------------ the netns


def netns_socket(ns: str, family: int, kind: int, proto: int = 0) -> socket.socket:
    """A socket of network namespace ``ns`` (it stays in the namespace it was made in)."""
    return run_in_netns(ns, lambda: socket.socket(family, kind, proto))


NETLINK_NETFILTER = 12
NFNL_SUBSYS_NFTABLES = 10
NFT_MSG_NEWCHAIN = 3
NFT_MSG_GETCHAIN = 4
NLMSG_ERROR = 2
NLM_F_REQUEST = 1
NLM_F_ACK = 4
NFTA_CHAIN_TABLE = 1
NFTA_CHAIN_NAME = 3
NFTA_CHAIN_USE = 6


def _attr(kind: int, data: bytes) -> bytes:
    head = struct.pack("=HH", 4 + len(data), kind)
    return head + data + b"\0" * (-len(data) % 4)


class ChainProbe:
    """Asks nf_tables for one chain by name: one netlink round trip, no process to start,
    cheap enough to ask every 10 ms while the proxy works. iptables-nft chains are nf_tables
    chains too (table ``ip nat``)."""

    def __init__(self, ns: str) -> None:
        self.sock = netns_socket(ns, socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self.sock.bind((0, 0))
        self.seq = 0

    def close(self) -> None:
        self.sock.close()

    def uses(self, table: str, chain: str) -> int | None:
        """How many rules or map elements jump to ``chain`` (None: no such chain yet)."""
        self.seq += 1
        body = struct.pack("=BBH", socket.AF_INET, 0, 0)
        body += _attr(NFTA_CHAIN_TABLE, table.encode() + b"\0")
        body += _attr(NFTA_CHAIN_NAME, chain.encode() + b"\0")
        kind = (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETCHAIN
        head = struct.pack("=IHHII", 16 + len(body), kind, NLM_F_REQUEST | NLM_F_ACK, self.seq, 0)
        self.sock.send(head + body)
        use: int | None = None
        while True:
            data = self.sock.recv(1 << 16)
            off = 0
            while off + 16 <= len(data):
                length, kind, _flags, seq, _pid = struct.unpack_from("=IHHII", data, off)
                payload = data[off + 16 : off + length]
                off += (length + 3) & ~3
                if seq != self.seq:
                    continue
                if kind == NLMSG_ERROR:
                    (err,) = struct.unpack_from("=i", payload)
                    if err == 0:
                        return use
                    if -err == 2:  # ENOENT: no such table or chain
                        return None
                    raise OSError(-err, f"nf_tables getchain {table} {chain}")
                if kind == (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWCHAIN:
                    use = _chain_use(payload[4:])


def _chain_use(attrs: bytes) -> int:
    off = 0
    while off + 4 <= len(attrs):
        length, kind = struct.unpack_from("=HH", attrs, off)
        if kind & 0x3FFF == NFTA_CHAIN_USE:
            return int(struct.unpack_from(">I", attrs, off + 4)[0])
        off += (length + 3) & ~3
    return 0


def scrape_metric(ns: str, name: str) -> float | None:
    """One unlabelled sample of ``name`` from the daemon's /metrics (inside ``ns``)."""
    try:
        s = netns_socket(ns, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return None
    try:
        s.settimeout(2)
        s.connect(("127.0.0.1", METRICS_PORT))
        s.sendall(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        chunks = []
        while chunk := s.recv(1 << 16):
            chunks.append(chunk)
    except OSError:
        return None
    finally:
        s.close()
    m = re.search(rf"^{re.escape(name)}(?:{{}})? (\S+)$", b"".join(chunks).decode(), re.M)
    return float(m.group(1)) if m else None


# ------------------------------------------------------------------------------ the cluster


def spn(i: int) -> ServicePortName:
    return ServicePortName(NAMESPACE, f"svc-{i}")


def live_chain(mode: str, i: int, ip: str | None = None) -> tuple[str, str]:
    """(table, chain) that is referenced once Service ``i`` is programmed (with ``ip``: once
    its endpoint with that address is)."""
    if mode == "iptables":
        if ip is None:
            return "nat", ipt_names.service_chain(spn(i))
        return "nat", ipt_names.endpoint_chain(spn(i), Endpoint(ip, TARGET_PORT))
    if ip is None:
        return nft_names.TABLE, nft_names.service_chain(spn(i))
    return nft_names.TABLE, nft_names.endpoint_chain(spn(i), Endpoint(ip, TARGET_PORT))


def address(v: int) -> str:
    return ".".join(str((v >> s) & 255) for s in (24, 16, 8, 0))


CREATED = "2025-06-01T12:00:00Z"


def _uid(text: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, text))


def as_served(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with what a real cluster's copy holds besides: the fields kubectl and the
    controllers write (labels, selector, owner, pod references, conditions, zone) and their
    managedFields, which lists carry (``kubectl get`` hides them). The server adds uid,
    resourceVersion, creationTimestamp and the Service defaults."""
    meta = obj["metadata"]
    name = meta["name"]
    if obj["kind"] == "Service":
        meta["labels"] = {"app": name}
        obj["spec"]["selector"] = {"app": name}
        obj["spec"]["ports"][0]["targetPort"] = TARGET_PORT
        obj["spec"]["ports"][0]["protocol"] = "TCP"
        fields = {
            "f:metadata": {"f:labels": {".": {}, "f:app": {}}},
            "f:spec": {
                "f:internalTrafficPolicy": {},
                "f:ports": {
                    ".": {},
                    'k:{"port":80,"protocol":"TCP"}': {
                        ".": {},
                        "f:port": {},
                        "f:protocol": {},
                        "f:targetPort": {},
                    },
                },
                "f:selector": {},
                "f:sessionAffinity": {},
                "f:type": {},
            },
        }
        meta["managedFields"] = [_managed("kubectl-client-side-apply", "v1", fields)]
    elif obj["kind"] == "EndpointSlice":
        service = meta["labels"]["kubernetes.io/service-name"]
        owner = _uid(f"service/{service}")
        meta["generateName"] = f"{service}-"
        meta["labels"]["endpointslice.kubernetes.io/managed-by"] = "endpointslice-controller.k8s.io"
        meta["annotations"] = {"endpoints.kubernetes.io/last-change-trigger-time": CREATED}
        meta["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": "Service",
                "name": service,
                "uid": owner,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        for j, ep in enumerate(obj["endpoints"]):
            pod = f"{service}-5d8f7c9b6-{j:05d}"
            ep["conditions"] = {"ready": True, "serving": True, "terminating": False}
            ep["targetRef"] = {
                "kind": "Pod",
                "name": pod,
                "namespace": NAMESPACE,
                "uid": _uid(f"pod/{pod}"),
            }
            ep["zone"] = "zone-a"
        fields = {
            "f:addressType": {},
            "f:endpoints": {},
            "f:metadata": {
                "f:annotations": {
                    ".": {},
                    "f:endpoints.kubernetes.io/last-change-trigger-time": {},
                },
                "f:generateName": {},
                "f:labels": {
                    ".": {},
                    "f:endpointslice.kubernetes.io/managed-by": {},
                    "f:kubernetes.io/service-name": {},
                },
                "f:ownerReferences": {".": {}, f'k:{{"uid":"{owner}"}}': {}},
            },
            "f:ports": {},
        }
        meta["managedFields"] = [_managed("kube-controller-manager", "discovery.k8s.io/v1", fields)]
    return obj


def _managed(manager: str, api_version: str, fields: dict[str, Any]) -> dict[str, Any]:
    return {
        "manager": manager,
        "operation": "Update",
        "apiVersion": api_version,
        "time": CREATED,
        "fieldsType": "FieldsV1",
        "fieldsV1": fields,
    }


def with_defaults(obj: dict[str, Any]) -> dict[str, Any]:
    """What the API server defaults in a ClusterIP Service (written here: the test server's
    defaulting scans every Service at each create, too slow to load 10,000)."""
    if obj["kind"] == "Service":
        spec = obj["spec"]
        spec.update(
            {
                "clusterIPs": [spec["clusterIP"]],
                "ipFamilies": ["IPv4"],
                "ipFamilyPolicy": "SingleStack",
                "internalTrafficPolicy": "Cluster",
                "sessionAffinity": "None",
                "type": "ClusterIP",
            }
        )
        for port in spec["ports"]:
            port.setdefault("targetPort", port["port"])
        obj["status"] = {"loadBalancer": {}}
    return obj


def list_floor(srv: FakeApiServer, page: int = 500) -> tuple[float, float]:
    """Seconds the server takes to serve the Services and EndpointSlices as kubeplex asks for
    them (at resourceVersion 0, which the watch cache answers whole), and that plus a
    json.loads of each response (a decoding floor)."""
    served = decoded = 0.0
    headers = {"Authorization": f"Bearer {srv.token}"} if srv.token else {}
    tls = ssl.create_default_context(cafile=TLS_CERT) if srv.tls else None
    for path in ("/api/v1/services", "/apis/discovery.k8s.io/v1/endpointslices"):
        token = ""
        while True:
            query = urllib.parse.urlencode(
                {"limit": page, **({"continue": token} if token else {"resourceVersion": 0})}
            )
            start = time.perf_counter()
            request = urllib.request.Request(f"{srv.url}{path}?{query}", headers=headers)
            with urllib.request.urlopen(request, context=tls) as resp:
                body = resp.read()
            served += time.perf_counter() - start
            meta = json.loads(body)["metadata"]
            decoded += time.perf_counter() - start
            token = meta.get("continue") or ""
            if not token:
                break
    return served, decoded


def load_server(
    n: int, bare: bool, endpoints: int = 10
) -> tuple[FakeApiServer, dict[int, dict[str, Any]], int]:
    """A started server holding the cluster, over HTTPS and asking for a bearer token as a
    real one; the EndpointSlices by Service index; and the size of the Services and
    EndpointSlices as JSON."""
    srv = FakeApiServer(defaulting=False, tls=True, token=TOKEN).start()
    srv.create(
        "Node",
        {
            "metadata": {"name": NODE, "labels": {"topology.kubernetes.io/zone": "zone-a"}},
            "spec": {"podCIDR": "10.128.0.0/24", "podCIDRs": ["10.128.0.0/24"]},
            "status": {"addresses": [{"type": "InternalIP", "address": "172.18.0.5"}]},
        },
    )
    slices: dict[int, dict[str, Any]] = {}
    size = 0
    for obj in cluster(n, endpoints):
        obj = with_defaults(obj if bare else as_served(obj))
        stored = srv.create(obj["kind"], obj)
        if obj["kind"] == "EndpointSlice":
            slices[int(obj["metadata"]["name"].split("-")[1])] = obj
        if obj["kind"] in ("Service", "EndpointSlice"):
            size += len(json.dumps(stored, separators=(",", ":")))
    return srv, slices, size


# ------------------------------------------------------------------------------ one run

#: The bearer token the proxy presents (from the kubeconfig, or as a pod's service account),
#: and where a pod has it (with the API server's CA).
TOKEN = "bench-token"
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def in_a_pod(work: Path) -> list[str]:
    """The command prefix that runs a program as in a pod: in a mount namespace of its own,
    where a tmpfs over ``/var/run/secrets`` holds the service account's token and the API
    server's CA (the host's directory is made if missing, and left empty). A container
    runtime makes that before the proxy starts: the time at the program's exec is written to
    :func:`exec_time_file`, and counts as its start."""
    token = work / "token"
    token.write_text(TOKEN)
    SA_DIR.parents[1].mkdir(parents=True, exist_ok=True)
    script = (
        f"mount -t tmpfs kubeplex-bench {SA_DIR.parents[1]} && mkdir -p {SA_DIR}"
        f" && cp {token} {SA_DIR}/token && cp {TLS_CERT} {SA_DIR}/ca.crt"
        f' && echo "$EPOCHREALTIME" > {exec_time_file(work)} && exec "$@"'
    )
    return ["unshare", "--mount", "--propagation", "private", "--", "bash", "-c", script, "bash"]


def exec_time_file(work: Path) -> Path:
    """Where :func:`in_a_pod` writes the time (seconds since the epoch) of its exec."""
    return work / "exec-at"


@dataclass
class Run:
    mode: str
    n: int
    endpoints: int = 10
    kernel_s: float = 0.0
    breakdown: dict[str, float] = field(default_factory=dict)
    rss_start_mb: float = 0.0
    rss_peak_mb: float = 0.0
    burst: dict[str, float] = field(default_factory=dict)
    imports: dict[str, float] = field(default_factory=dict)
    variant: str = ""
    #: A bare interpreter's start just before this run: how busy the machine was.
    interpreter: float = 0.0


def proc_status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(the process's own CPU, with its waited-for children's), in seconds."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    own = int(fields[11]) + int(fields[12])
    return own / CLK_TCK, (own + int(fields[13]) + int(fields[14])) / CLK_TCK


def wait_for(
    cond: Callable[[], bool], proc: subprocess.Popen[bytes], what: str, timeout: float
) -> float:
    """Poll ``cond`` every POLL seconds; the monotonic time it first held."""
    deadline = time.monotonic() + timeout
    while True:
        if cond():
            return time.monotonic()
        if proc.poll() is not None:
            raise RuntimeError(f"the daemon exited ({proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} within {timeout:.0f}s")
        time.sleep(POLL)


@contextmanager
def daemon(argv: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The daemon, stopped (its process group: the restore tools it may be running too) on
    the way out, whatever happened."""
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=out, env=env, start_new_session=True)
        try:
            yield proc
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


def read_log(path: Path, to_mono: float) -> list[tuple[float, str]]:
    """(monotonic time, message) of the daemon's JSON log lines."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            out.append((entry["ts"] / 1000.0 - to_mono, str(entry.get("msg", ""))))
    return out


SYNCED = re.compile(r"synced \S+ rules \((full|partial)\) in ([\d.]+) ms")
STARTING = "sync starting (full)"


def syncs(entries: list[tuple[float, str]]) -> list[tuple[float, str, float]]:
    """(end time, full/partial, seconds) of each sync the log reports."""
    return [
        (t, m.group(1), float(m.group(2)) / 1000) for t, msg in entries if (m := SYNCED.search(msg))
    ]


def measure(
    srv: FakeApiServer,
    slices: dict[int, dict[str, Any]],
    mode: str,
    env: dict[str, str],
    work: Path,
    rate: float,
    seconds: float,
    counter: list[int],
    importtime: bool = False,
    in_cluster: bool = False,
) -> Run:
    """One cold start and burst; with ``importtime`` a cold start under ``-X importtime``
    instead (slower: its times are not the figures), for what its imports cost; with
    ``in_cluster`` started as in a pod instead of from a kubeconfig."""
    n = len(slices)
    run = Run(mode, n, len(next(iter(slices.values()))["endpoints"]))
    run.interpreter = interpreter_time(env, 3)
    cfg = work / "config.yaml"
    connection = ""
    if not in_cluster:
        connection = (
            f"clientConnection:\n  kubeconfig: {srv.write_kubeconfig(work / 'kubeconfig')}\n"
        )
    cfg.write_text(
        config(mode)
        + connection
        + f"metricsBindAddress: 127.0.0.1:{METRICS_PORT}\n"
        + "logging:\n  format: json\n"
    )
    log = work / f"{mode}-{n}.log"
    to_mono = time.time() - time.monotonic()
    with Netns() as ns:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        probe = ChainProbe(ns)
        try:
            srv.clear_requests()
            python = [python_of(env), *(["-X", "importtime"] if importtime else [])]
            if in_cluster:  # as in a pod: its service account, and the server's address
                python = [*in_a_pod(work), *python]
                env = dict(
                    env, KUBERNETES_SERVICE_HOST=srv.host, KUBERNETES_SERVICE_PORT=str(srv.port)
                )
            argv = [
                *python,
                *KUBEPLEX_CMD[1:],
                "run",
                "--config",
                str(cfg),
                "--netns",
                ns,
                "--v",
                "2",
            ]
            exec_time_file(work).unlink(missing_ok=True)
            t0 = time.monotonic()
            with daemon(argv, env, log) as proc:
                table, chain = live_chain(mode, n - 1)
                t_kernel = wait_for(lambda: bool(probe.uses(table, chain)), proc, "the rules", 600)
                if in_cluster:  # from the exec, as a container runtime starts it
                    t0 = float(exec_time_file(work).read_text()) - to_mono
                run.kernel_s = t_kernel - t0
                run.rss_start_mb = proc_status_kib(proc.pid, "VmHWM") / 1024
                time.sleep(2)  # whatever the first sync set off settles (and is logged)
                run.breakdown = breakdown(srv, read_log(log, to_mono), t0, t_kernel)
                if importtime:
                    run.imports = import_split(log)
                    return run
                if rate > 0 and seconds > 0:
                    run.burst = burst(srv, slices, mode, ns, probe, proc, rate, seconds, counter)
                    run.burst.update(burst_log(read_log(log, to_mono), run.burst))
                run.rss_peak_mb = proc_status_kib(proc.pid, "VmHWM") / 1024
        except Exception:
            sys.stderr.write(f"--- daemon log ({mode}, {n}) ---\n")
            sys.stderr.write("".join(log.read_text(errors="replace").splitlines(True)[-30:]))
            raise
        finally:
            probe.close()
    return run


def breakdown(
    srv: FakeApiServer, entries: list[tuple[float, str]], t0: float, t_kernel: float
) -> dict[str, float]:
    out: dict[str, float] = {}
    requests = [r for r in srv.requests if r.time >= t0]
    if requests:
        out["first_request"] = min(r.time for r in requests) - t0
        lists = [r.time for r in requests if r.verb == "list"]
        if lists:
            out["last_list_request"] = max(lists) - t0
    listed = [t for t, msg in entries if "initial list complete" in msg and t <= t_kernel]
    if listed:
        out["listed"] = max(listed) - t0
    full = [s for s in syncs(entries) if s[1] == "full"]
    if full:
        end, _kind, took = full[0]
        started = [t for t, msg in entries if msg == STARTING and t <= end]
        # The backend's part alone, where the daemon does not say when the checkout began.
        out["sync_start"] = (started[-1] if started else end - took) - t0
        out["sync"] = end - t0 - out["sync_start"]
        out["checkout"] = out["sync"] - took
        out["checked_out"] = out["sync_start"] + out["checkout"]
        out["sync_end"] = end - t0
    return out


def burst(
    srv: FakeApiServer,
    slices: dict[int, dict[str, Any]],
    mode: str,
    ns: str,
    probe: ChainProbe,
    proc: subprocess.Popen[bytes],
    rate: float,
    seconds: float,
    counter: list[int],
) -> dict[str, float]:
    """``rate`` EndpointSlice changes a second for ``seconds``: each moves endpoint 1 of the
    next slice to a new address."""
    n = len(slices)
    total = int(rate * seconds)
    last: list[tuple[int, str]] = []
    sent: list[float] = []

    def writer() -> None:
        start = time.monotonic()
        for k in range(total):
            delay = start + k / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            i = (counter[0] + k) % n
            ip = address(BURST_BASE + counter[0] + k)
            obj = slices[i]
            obj["endpoints"][1]["addresses"] = [ip]
            srv.update("EndpointSlice", obj)
            last[:] = [(i, ip)]
        sent.append(time.monotonic() - start)

    pending: list[float] = []
    cpu0 = cpu_seconds(proc.pid)
    t_start = time.monotonic()
    thread = threading.Thread(target=writer, name="burst")
    thread.start()
    while thread.is_alive():
        v = scrape_metric(ns, "kubeproxy_sync_proxy_rules_endpoint_changes_pending")
        if v is not None:
            pending.append(v)
        thread.join(0.1)
    t_sent = time.monotonic()
    counter[0] += total
    i, ip = last[0]
    table, chain = live_chain(mode, i, ip)
    t_live = wait_for(lambda: bool(probe.uses(table, chain)), proc, "the last change", 120)
    cpu1 = cpu_seconds(proc.pid)
    wall = t_live - t_start
    time.sleep(2)
    v = scrape_metric(ns, "kubeproxy_sync_proxy_rules_endpoint_changes_pending")
    return {
        "changes": total,
        "rate": total / sent[0] if sent and sent[0] > 0 else 0.0,
        "catch_up_ms": (t_live - t_sent) * 1000,
        "cpu_share": (cpu1[0] - cpu0[0]) / wall,
        "cpu_share_children": (cpu1[1] - cpu0[1]) / wall,
        "pending_max": max(pending) if pending else float("nan"),
        "pending_end": v if v is not None else float("nan"),
        "t_start": t_start,
        "t_live": t_live,
    }


def burst_log(entries: list[tuple[float, str]], b: dict[str, float]) -> dict[str, float]:
    during = [s for s in syncs(entries) if b["t_start"] <= s[0] <= b["t_live"] + 0.05]
    relists = [
        msg for t, msg in entries if b["t_start"] <= t and ("relist" in msg or "broke" in msg)
    ]
    took = [s[2] for s in during]
    return {
        "syncs": len(during),
        "sync_median_ms": statistics.median(took) * 1000 if took else float("nan"),
        "sync_max_ms": max(took) * 1000 if took else float("nan"),
        "relists": len(relists),
    }


#: The environment's key for the interpreter a variant runs (this one's by default).
PYTHON = "KUBEPLEX_BENCH_PYTHON"


def python_of(env: dict[str, str]) -> str:
    return env.get(PYTHON, sys.executable)


def checkout_copy(work: Path) -> Path:
    """This checkout's package as it is now (``DIR/kubeplex/core``, ...), copied under ``work``."""
    root = Path(__file__).resolve().parent.parent
    out = work / "checkout"
    for part in ("core", "backends", "testing"):
        shutil.copytree(
            root / part, out / "kubeplex" / part, ignore=shutil.ignore_patterns("__pycache__")
        )
    return out


def installed_layout(env: dict[str, str], root: Path, work: Path) -> dict[str, str]:
    """The environment that runs the kubeplex package under ``root`` as pip installs it: its
    bytecode compiled, and an interpreter of its own (a venv) whose site-packages holds only a
    .pth naming that package and the dependencies' folder. A checkout's editable install runs
    its own import hooks at each start (setuptools' finder: 20-40 ms more before the first
    sync), which an installed kubeplex, as in the image, does not have."""
    package = root / "kubeplex"
    if not (package / "core").is_dir():
        sys.exit(f"{root}: no kubeplex/core there")
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(package)], check=True)
    venv = work / f"venv-{len(list(work.glob('venv-*')))}"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(
        subprocess.run(
            [
                str(venv / "bin" / "python"),
                "-c",
                "import sysconfig; print(sysconfig.get_path('purelib'))",
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    deps = sysconfig.get_path("purelib")  # with kubeplex's own metadata: its entry points
    (site / "kubeplex.pth").write_text(f"{root}\n{deps}\n")
    out = dict(env)
    out.pop("PYTHONPATH", None)
    out[PYTHON] = str(venv / "bin" / "python")
    build_step(out)
    return out


#: The image's build step that keeps the dataclass methods, as each kubeplex spells it (before
#: it moved, a running daemon kept them itself, and this wrote them all the same).
BUILD_STEPS = (
    ["-m", "kubeplex.core.cli.warm_cache"],
    ["-c", "from kubeplex.core.cli import codecache; codecache.warm()"],
)
#: Where each kubeplex keeps its dataclass methods, in the same order.
CACHE_MODULES = ("kubeplex.core.startup.codecache", "kubeplex.core.cli.codecache")


def build_step(env: dict[str, str]) -> None:
    """Runs what the image's build runs for the kubeplex of ``env``, if it has it."""
    for argv in BUILD_STEPS:
        if subprocess.run([python_of(env), *argv], env=env, capture_output=True).returncode == 0:
            return


# ------------------------------------------------------------------------------ imports


def kept_methods(env: dict[str, str]) -> Path | None:
    """The file where the kubeplex of ``env`` keeps its compiled dataclass methods (None for
    one that keeps none)."""
    for module in CACHE_MODULES:
        out = subprocess.run(
            [python_of(env), "-c", f"import {module} as c; print(c.default_path())"],
            env=env,
            capture_output=True,
            text=True,
        )
        path = out.stdout.strip()
        if out.returncode == 0:
            return Path(path) if path != "None" else None
    return None


def interpreter_time(env: dict[str, str], repeat: int = 5) -> float:
    """A bare interpreter's start and exit (the floor under every figure)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run([python_of(env), "-c", "pass"], check=True, env=env)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


IMPORT_LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \| ( *)(\S+)")


def import_split(log: Path) -> dict[str, float]:
    """From a ``-X importtime`` run's stderr: the seconds spent importing before the first sync
    started (what delays it: the lists are fetched meanwhile), in all and by top-level package
    (each module's own time; the largest packages)."""
    by_package: dict[str, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{") and (STARTING in line or "synced " in line):
            break
        if m := IMPORT_LINE.match(line):
            package = m.group(4).split(".")[0]
            by_package[package] = by_package.get(package, 0.0) + int(m.group(1)) / 1e6
    top = sorted(by_package.items(), key=lambda kv: -kv[1])[:6]
    return {"total": sum(by_package.values()), **dict(top)}


# ------------------------------------------------------------------------------ report


def med(values: list[float]) -> float:
    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


def seg(b: dict[str, float], start: str | None, end: str) -> str:
    t0 = 0.0 if start is None else b.get(start, float("nan"))
    return f"{b.get(end, float('nan')) - t0:.2f}s"


def report(runs: list[Run], imports: dict[str, float], interpreter: float) -> str:
    r0 = runs[0]
    b = {k: med([r.breakdown.get(k, float("nan")) for r in runs]) for k in r0.breakdown}
    u = {k: med([r.burst.get(k, float("nan")) for r in runs]) for k in r0.burst}
    burst = (
        f"  burst: {u['changes']:.0f} changes at {u['rate']:.0f}/s; last one live"
        f" {u['catch_up_ms']:.0f} ms after it was written; proxy CPU {u['cpu_share']:.0%}"
        f" ({u['cpu_share_children']:.0%} with its children); pending max"
        f" {u['pending_max']:.0f}, 2 s after {u['pending_end']:.0f}; {u['syncs']:.0f} syncs"
        f" (median {u['sync_median_ms']:.0f} ms, max {u['sync_max_ms']:.0f} ms);"
        f" relists {u['relists']:.0f}"
        if u
        else "  burst: none (--rate 0)"
    )
    kernel = med([r.kernel_s for r in runs])
    lines = [
        f"{r0.mode:9s} {r0.n:>6} services x {r0.endpoints}: start->kernel {kernel:.2f}s"
        f" (runs {', '.join(f'{r.kernel_s:.2f}' for r in runs)})",
        f"  breakdown: start -> first API request {seg(b, None, 'first_request')}"
        f" (a bare interpreter {interpreter:.3f}s) -> lists complete"
        f" {seg(b, 'first_request', 'listed')} (last list request at"
        f" {b.get('last_list_request', float('nan')):.2f}s) -> first sync starts"
        f" {seg(b, 'listed', 'sync_start')} -> first sync {b.get('sync', float('nan')):.2f}s"
        f" (checkout {b.get('checkout', float('nan')):.2f}s)"
        f" -> in the kernel {kernel - b.get('sync_end', float('nan')):+.3f}s after the sync's"
        f" end as logged; before the first sync {b.get('sync_start', float('nan')):.2f}s"
        f" ({b.get('checked_out', float('nan')):.2f}s with its checkout)",
        f"  rss: peak {med([r.rss_peak_mb for r in runs]):.0f} MB"
        f" (after the first sync {med([r.rss_start_mb for r in runs]):.0f} MB)",
        burst,
    ]
    lines.append(quiet_split(runs))
    if imports:
        split = ", ".join(f"{k} {v:.2f}s" for k, v in imports.items() if k != "total")
        lines.append(
            f"  imports before the first sync (one run under -X importtime):"
            f" {imports['total']:.2f}s ({split})"
        )
    return "\n".join(lines)


def quiet_split(runs: list[Run]) -> str:
    """Before the first sync (with its checkout), in the runs where the machine was at its
    quieter half (a bare interpreter started at most as slowly as in the median run) and in
    the others: what of a figure's spread is the machine's."""
    if len(runs) < 2:
        return "  machine: one run, no split"
    cut = med([r.interpreter for r in runs])
    halves = (
        [r for r in runs if r.interpreter <= cut],
        [r for r in runs if r.interpreter > cut],
    )
    parts = []
    for name, part in zip(("quieter", "busier"), halves, strict=True):
        if part:
            took = [r.breakdown.get("checked_out", float("nan")) for r in part]
            parts.append(
                f"{name} half ({len(part)} runs, a bare interpreter"
                f" {min(r.interpreter for r in part):.3f}-{max(r.interpreter for r in part):.3f}s)"
                f" {med(took):.2f}s"
            )
    under = sum(r.breakdown.get("checked_out", float("inf")) <= 0.4 for r in runs)
    return (
        f"  before the first sync with its checkout: {'; '.join(parts)};"
        f" {under} of {len(runs)} runs at most 0.4 s"
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--modes", default="iptables,nftables")
    p.add_argument("--sizes", default="1000,10000")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument(
        "--endpoints",
        type=int,
        default=10,
        help="endpoints per Service (2: the shape of upstream's published 10k memory figure)",
    )
    p.add_argument("--rate", type=float, default=100.0, help="EndpointSlice changes a second")
    p.add_argument("--seconds", type=float, default=10.0, help="how long the burst lasts")
    p.add_argument(
        "--bare", action="store_true", help="the minimal objects, without what a cluster adds"
    )
    p.add_argument(
        "--auth",
        choices=("kubeconfig", "in-cluster"),
        default="kubeconfig",
        help="how the proxy finds the server: from a kubeconfig file, or as in a pod, from its"
        " service account",
    )
    p.add_argument("--json", type=Path, help="also write every run's figures here")
    p.add_argument(
        "--baseline",
        type=Path,
        help="a directory holding another kubeplex package (kubeplex/core, ...): its runs are"
        " interleaved with this checkout's, run by run, and reported after them",
    )
    p.add_argument(
        "--cold-cache",
        action="store_true",
        help="remove the dataclass methods the build step kept, before each start",
    )
    p.add_argument(
        "--kubeplex",
        type=Path,
        help="a directory holding the kubeplex package to run instead of this checkout's",
    )
    p.add_argument(
        "--editable",
        action="store_true",
        help="run this checkout through its editable install (setuptools' import hooks), not"
        " laid out as pip installs it",
    )
    args = p.parse_args()
    in_cluster = args.auth == "in-cluster"
    if os.geteuid() != 0:
        sys.exit("needs root (network namespaces)")
    # A SIGTERM unwinds like ^C: the daemon is stopped and the namespace deleted.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    modes = [m for m in args.modes.split(",") if m in plugins.available()]
    env = installed_env()
    layouts = Path(tempfile.mkdtemp(prefix="kubeplex-layouts-"))
    try:
        run_all(args, modes, env, layouts, in_cluster)
    finally:
        shutil.rmtree(layouts, ignore_errors=True)


def run_all(
    args: argparse.Namespace, modes: list[str], env: dict[str, str], layouts: Path, in_cluster: bool
) -> None:
    if args.kubeplex is not None:
        this = installed_layout(env, args.kubeplex.resolve(), layouts)
    elif args.editable:
        this = env
    else:
        this = installed_layout(env, checkout_copy(layouts), layouts)
    variants = {"": this}
    if args.baseline is not None:
        variants["baseline"] = installed_layout(env, args.baseline.resolve(), layouts)
    interpreter = interpreter_time(this)
    print(
        "# kubeplex: "
        + ("this checkout's editable install" if this is env else "laid out as pip installs it"),
        flush=True,
    )
    kept = {name: kept_methods(venv) for name, venv in variants.items()}
    print(
        "# dataclass methods: "
        + (
            "compiled at each start (--cold-cache)"
            if args.cold_cache
            else "kept by the image's build step"
        ),
        flush=True,
    )
    imports: dict[tuple[str, str], dict[str, float]] = {}
    everything: list[dict[str, Any]] = []
    counter = [0]
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(s) for s in args.sizes.split(",")):
            start = time.monotonic()
            srv, slices, size = load_server(n, args.bare, args.endpoints)
            served, decoded = list_floor(srv)
            print(
                f"# {n} services x {args.endpoints} endpoints loaded in"
                f" {time.monotonic() - start:.1f}s"
                f" ({size / 1e6:.1f} MB of JSON); the server alone serves their lists in"
                f" {served:.2f}s ({decoded:.2f}s with a json.loads of each page)",
                flush=True,
            )
            try:
                for mode in modes:
                    runs: dict[str, list[Run]] = {name: [] for name in variants}
                    for name, venv in variants.items():
                        imports[mode, name] = measure(
                            srv,
                            slices,
                            mode,
                            venv,
                            Path(tmp),
                            0,
                            0,
                            counter,
                            importtime=True,
                            in_cluster=in_cluster,
                        ).imports
                    for _ in range(args.repeat):
                        for name, venv in variants.items():  # interleaved: the same load
                            path = kept[name]
                            if args.cold_cache and path is not None:
                                path.unlink(missing_ok=True)
                            run = measure(
                                srv,
                                slices,
                                mode,
                                venv,
                                Path(tmp),
                                args.rate,
                                args.seconds,
                                counter,
                                in_cluster=in_cluster,
                            )
                            run.variant = name
                            runs[name].append(run)
                            everything.append(vars(run))
                    for name, done in runs.items():
                        if name:
                            print(f"  -- {name} (interleaved with the runs above) --")
                        print(report(done, imports[mode, name], interpreter), flush=True)
            finally:
                srv.stop()
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "interpreter": interpreter,
                    "imports": {"/".join(filter(None, k)): v for k, v in imports.items()},
                    "runs": everything,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
