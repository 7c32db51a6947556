"""What the ebpf mode's kernel tests share: a bpffs mount and a cgroup2 folder of the test's
own (never the host's root cgroup), and the loader on them, removed even if the test fails;
backends serving on a namespace's loopback, and a probe client run in a cgroup."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from kubeplex.backends.ebpf.loader import Loader
from kubeplex.core.dataplane import plugins
from kubeplex.testing.labkernel import scratch_bpffs, scratch_cgroup

# A bpffs mount and a cgroup2 folder of the test's own (a cgroup2 mounted where none is).
own_bpffs = scratch_bpffs
own_cgroup = scratch_cgroup


def missing() -> str | None:
    """Why the mode's programs cannot be loaded here, or None."""
    if shutil.which("bpftool") is None:
        return "bpftool is not installed (scripts/setup.sh with KUBEPLEX_BPF_TOOLS=1)"
    return Loader().missing()


def write_trust_list(path: Path, options: dict[str, str]) -> Path:
    """The packaged trust list at ``path``, with these ``[backends.ebpf.options]``."""
    packaged = Path(plugins.__file__).with_name("plugins.toml").read_text()
    lines = ["[backends.ebpf.options]", *(f'{k} = "{v}"' for k, v in options.items())]
    path.write_text(packaged + "\n" + "\n".join(lines) + "\n")
    return path


@contextmanager
def own_loader(bpffs: Path) -> Iterator[Loader]:
    """A loader on ``bpffs`` (the test skipped where the programs cannot load), cleaned up."""
    reason = missing()
    if reason:
        pytest.skip(reason)
    loader = Loader(bpffs)
    try:
        yield loader
    finally:
        loader.cleanup()


SERVER = textwrap.dedent(
    """
    import selectors, socket, sys
    sel = selectors.DefaultSelector()
    for addr in sys.argv[1:]:
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        tcp = socket.socket(family, socket.SOCK_STREAM)
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        tcp.bind((addr, 8080)); tcp.listen(16)
        sel.register(tcp, selectors.EVENT_READ, ("tcp", addr))
        udp = socket.socket(family, socket.SOCK_DGRAM)
        udp.bind((addr, 5353))
        sel.register(udp, selectors.EVENT_READ, ("udp", addr))
    print("ready", flush=True)
    while True:
        for key, _ in sel.select():
            proto, addr = key.data
            if proto == "tcp":
                conn, _ = key.fileobj.accept()
                conn.sendall(addr.encode()); conn.close()
            else:
                data, peer = key.fileobj.recvfrom(100)
                key.fileobj.sendto(addr.encode() + b" " + data, peer)
    """
)

CLIENT = textwrap.dedent(
    """
    import json, socket, sys
    host, port, proto = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    out = {}
    try:
        if proto == "tcp":
            s = socket.create_connection((host, port), timeout=3)
            out["data"] = s.recv(100).decode()
            out["peer"] = list(s.getpeername()[:2])
        else:
            s = socket.socket(family, socket.SOCK_DGRAM); s.settimeout(3)
            s.sendto(b"ping", (host, port))
            data, peer = s.recvfrom(100)
            out["data"], out["peer"] = data.decode(), list(peer[:2])
    except OSError as exc:
        out["errno"] = exc.errno
    print(json.dumps(out))
    """
)


@contextmanager
def serving(netns: str, addresses: list[str]) -> Iterator[None]:
    """``addresses`` on the namespace's loopback, each with a TCP server on 8080 and a UDP
    one on 5353 that answer with the address they were reached at."""
    for addr in addresses:
        v6 = ["-6"] if ":" in addr else []
        prefix, extra = ("128", ["nodad"]) if v6 else ("32", [])
        cmd = ["ip", "-n", netns, *v6, "addr", "add", f"{addr}/{prefix}", "dev", "lo", *extra]
        subprocess.run(cmd, check=True)
    server = subprocess.Popen(
        ["ip", "netns", "exec", netns, sys.executable, "-c", SERVER, *addresses],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        yield
    finally:
        server.kill()
        server.wait()


def client(netns: str, cgroup: Path | None, host: str, port: int, proto: str) -> dict[str, Any]:
    """Runs the probe client in the namespace, inside cgroup (or outside every test cgroup)."""
    join = f"echo $$ > {cgroup / 'cgroup.procs'} && " if cgroup else ""
    cmd = f'{join}exec ip netns exec {netns} "$0" -c "$1" "$2" "$3" "$4"'
    done = subprocess.run(
        ["sh", "-c", cmd, sys.executable, CLIENT, host, str(port), proto],
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result
