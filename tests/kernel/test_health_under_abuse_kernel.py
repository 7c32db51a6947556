"""The daemon's health port under a flood of slow connections: 3,000 connections to /healthz's
port that send nothing or a byte a second (reopened whenever the daemon closes one), while
kubelet-like probes (a new connection, GET /healthz, a 1 s timeout) must all be answered and
a Service added meanwhile must be programmed.

The daemon starts with the usual soft descriptor limit (1,024), where a server holding a
thread and a descriptor per connection ran out of descriptors at about 1,100 connections.
"""

from __future__ import annotations

import contextlib
import errno
import http.client
import os
import resource
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from apiserver import KUBE_PROXY_PERMISSIONS, FakeApiServer
from cli_kit import in_netns, wait_until

from kubeplex.core.dataplane.netns import run_in_netns

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "testing" / "lab"
SLOW_CONNECTIONS = 3000
PROBES = 15
#: What a node's process gets unless its unit raises it.
USUAL_SOFT_LIMIT = 1024
#: One request line, sent a byte a second by half of the connections.
TRICKLE = b"GET /healthz HTTP/1.1\r\nHost: node\r\nX-Slow: " + b"a" * 64

pytestmark = pytest.mark.kernel


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def many_descriptors() -> Iterator[None]:
    """This process's own soft descriptor limit raised for the flood (and restored)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = SLOW_CONNECTIONS + 1024
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {need}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, need), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


class SlowFlood:
    """``count`` connections to 127.0.0.1:port in ``netns``: even ones send nothing, odd ones
    a byte of ``TRICKLE`` a second; one the server closes is opened again at once."""

    def __init__(self, netns: str, port: int, count: int) -> None:
        self.netns, self.port, self.count = netns, port, count
        self.stop = threading.Event()
        self.started = threading.Event()
        self.reopened = 0
        self._socks: list[socket.socket | None] = [None] * count
        self._sent = [0] * count
        self._thread = threading.Thread(target=self._run, name="slow-flood", daemon=True)

    def __enter__(self) -> SlowFlood:
        self._thread.start()
        if not self.started.wait(60):
            raise AssertionError("the flood did not open its connections")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self._thread.join(timeout=30)

    def held(self) -> int:
        """Connections established now (the server accepted them or will)."""
        n = 0
        for sock in list(self._socks):
            if sock is None:
                continue
            try:
                sock.getpeername()
            except OSError:
                continue
            n += 1
        return n

    def _run(self) -> None:
        # Every socket made by a thread inside the namespace, as a pod's would be.
        run_in_netns(self.netns, self._flood)

    def _open(self, i: int, sel: selectors.BaseSelector) -> None:
        sock = socket.socket()
        sock.setblocking(False)
        err = sock.connect_ex(("127.0.0.1", self.port))
        if err not in (0, errno.EINPROGRESS):
            sock.close()
            self._socks[i] = None
            return
        self._socks[i] = sock
        self._sent[i] = 0
        sel.register(sock, selectors.EVENT_READ, i)

    def _drop(self, i: int, sel: selectors.BaseSelector) -> None:
        sock = self._socks[i]
        if sock is not None:
            sel.unregister(sock)
            sock.close()
        self._socks[i] = None
        self.reopened += 1

    def _flood(self) -> None:
        sel = selectors.DefaultSelector()
        try:
            for i in range(self.count):
                self._open(i, sel)
            self.started.set()
            next_byte = time.monotonic()
            while not self.stop.is_set():
                for key, _ in sel.select(0.1):
                    i = key.data
                    try:
                        data = key.fileobj.recv(4096)  # type: ignore[union-attr]
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = b""
                    if not data:  # the server closed it: open another
                        self._drop(i, sel)
                        self._open(i, sel)
                for i, sock in enumerate(self._socks):
                    if sock is None:
                        self._open(i, sel)
                if time.monotonic() < next_byte:
                    continue
                next_byte += 1.0
                for i in range(1, self.count, 2):
                    sock = self._socks[i]
                    if sock is None:
                        continue
                    pos = self._sent[i] % len(TRICKLE)
                    with contextlib.suppress(OSError):  # closed: reopened above next round
                        self._sent[i] += sock.send(TRICKLE[pos : pos + 1])
        finally:
            for sock in self._socks:
                if sock is not None:
                    sock.close()
            sel.close()


def probe(netns: str, port: int) -> int | str:
    """A kubelet's HTTP probe: a new connection, GET /healthz, 1 s for all of it; the status,
    or what went wrong."""

    def get() -> int | str:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1.0)
        try:
            conn.request("GET", "/healthz", headers={"Connection": "close"})
            return conn.getresponse().status
        except OSError as err:
            return repr(err)
        finally:
            conn.close()

    return run_in_netns(netns, get)


def open_descriptors(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def test_kubelet_probes_are_answered_while_3000_slow_connections_are_held(
    tmp_path: Path, netns: str, many_descriptors: None
) -> None:
    srv = FakeApiServer(authorizer=set(KUBE_PROXY_PERMISSIONS), bookmark_interval=0.5).start()
    proc: subprocess.Popen[str] | None = None
    try:
        for file in ("node.yaml", "web.yaml"):
            for doc in yaml.safe_load_all((LAB / "manifests" / file).read_text()):
                srv.create(doc["kind"], doc)
        healthz = free_port()
        cfg = yaml.safe_load((LAB / "config.yaml").read_text())
        cfg["clientConnection"] = {"kubeconfig": str(srv.write_kubeconfig(tmp_path / "kc"))}
        cfg["healthzBindAddress"] = f"127.0.0.1:{healthz}"
        cfg["metricsBindAddress"] = f"127.0.0.1:{free_port()}"
        cfg["iptables"] = {"minSyncPeriod": "100ms", "syncPeriod": "30s"}
        (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
        log_path = tmp_path / "daemon.log"
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        argv = ["prlimit", f"--nofile={USUAL_SOFT_LIMIT}:{hard}"]
        argv += [sys.executable, "-m", "kubeplex.core.cli.main", "run", "--config"]
        argv += [str(tmp_path / "config.yaml"), "--netns", netns, "-v", "1"]
        with log_path.open("w") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, text=True)
        wait_until(lambda: probe(netns, healthz) == 200, what="healthz 200")

        answers: list[int | str] = []
        held: list[int] = []
        descriptors: list[int] = []
        with SlowFlood(netns, healthz, SLOW_CONNECTIONS) as flood:
            # Checked below with the probes' answers (a daemon that dies never gets there).
            opened_by = time.monotonic() + 20
            while flood.held() < SLOW_CONNECTIONS and time.monotonic() < opened_by:
                time.sleep(0.1)
            for i in range(PROBES):
                if i == 5:
                    srv.create(
                        "Service",
                        {
                            "metadata": {"name": "late", "namespace": "default"},
                            "spec": {"clusterIP": "10.96.0.77", "ports": [{"port": 81}]},
                        },
                    )
                held.append(flood.held())
                descriptors.append(open_descriptors(proc.pid))
                answers.append(probe(netns, healthz))
                time.sleep(1.0)
            reopened = flood.reopened
            alive = proc.poll() is None
            print(
                f"\n{SLOW_CONNECTIONS} slow connections: held {min(held)}-{max(held)} at the "
                f"probes, the daemon's descriptors {min(descriptors)}-{max(descriptors)}, "
                f"{reopened} closed by the daemon and reopened; probes: {answers}"
            )
            assert alive, log_path.read_text()[-3000:]
            assert answers == [200] * PROBES, log_path.read_text()[-3000:]
            # Held throughout (those the daemon closes at their deadline are opened again).
            assert sorted(held)[PROBES // 2] >= 0.95 * SLOW_CONNECTIONS
            # The daemon kept syncing: the Service added under the flood is programmed.
            wait_until(
                lambda: "default/late has no endpoints" in in_netns(netns, "iptables-save"),
                what="the Service added during the flood",
            )
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        srv.stop()
