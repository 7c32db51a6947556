"""``kubeplex explain`` and ``kubeplex migrate --check`` in ebpf mode on the kernel: after a
``kubeplex run --once`` that attached to a cgroup of the test's own and pinned in a bpffs of its
own (the trust list's options), both read the Services back from the pinned maps; an entry
deleted by hand is drift, in both."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from ipaddress import IPv4Address
from pathlib import Path

import pytest
from kits.cli_kit import LAB, kubeplex
from kits.ebpf_kit import own_bpffs, own_cgroup, own_loader, write_trust_list

from kubeplex.backends.ebpf import layout
from kubeplex.backends.ebpf.loader import Loader
from kubeplex.backends.ebpf.maps import PinnedMaps

pytestmark = pytest.mark.kernel

SOURCES = ("--config", str(LAB / "config.yaml"), "--manifests", str(LAB / "manifests"))
Command = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def node(netns: str, tmp_path: Path) -> Iterator[tuple[Command, Loader]]:
    """A command of the ebpf mode on a node synced once (its entry-point tables in the scratch
    namespace), and the loader on its bpffs."""
    with own_bpffs() as bpffs, own_cgroup() as cgroup, own_loader(bpffs) as loader:
        options = {"bpffs": str(bpffs), "cgroup": str(cgroup)}
        trust = write_trust_list(tmp_path / "plugins.toml", options)

        def command(name: str, *args: str) -> subprocess.CompletedProcess[str]:
            mode = ["--mode=ebpf"] if name == "cleanup" else ["--proxy-mode=ebpf", *SOURCES]
            return kubeplex("--plugins", str(trust), name, *args, *mode, f"--netns={netns}")

        run = command("run", "--once")
        assert run.returncode == 0, run.stderr
        try:
            yield command, loader
        finally:
            command("cleanup")


def test_explain_and_migrate_check_read_the_pinned_maps(node: tuple[Command, Loader]) -> None:
    command, loader = node
    explained = command("explain", "default/web")
    assert explained.returncode == 0, explained.stdout + explained.stderr
    out = explained.stdout
    assert "default/web (TCP, IPv4), mode ebpf" in out
    assert "kpx_svc4 10.96.88.59:80/tcp -> svc 0x" in out and "count 3" in out
    assert "3. endpoint choice: 3 endpoints" in out and "10.244.2.3:8080" in out
    assert "5. masquerade: no in the kernel" in out and "drift: none" in out

    check = command("migrate", "--to=nftables", "--check", "-o", "json")
    assert check.returncode == 1, check.stderr  # differences to accept, none of the kernel
    report = json.loads(check.stdout)
    kinds = {(d["kind"], d["what"]) for d in report["differences"]}
    assert ("capability", "socket-load-balancing") in kinds
    assert not [k for k in kinds if k[0] == "kernel"], report["differences"]
    web = next(s for s in report["services"] if s["service"] == "default/web")
    assert web["masquerade"]["now"] is False
    assert web["endpoints"]["now"] == web["endpoints"]["after"]

    # web's ClusterIP entry deleted by hand: explain and the check both see it.
    maps = PinnedMaps(loader.open_maps())
    key = layout.svc_key(IPv4Address("10.96.88.59"), 80, layout.PROTO_TCP)
    maps.delete(layout.SVC4.name, key)
    maps.close()
    explained = command("explain", "default/web", "-o", "json")
    assert explained.returncode == 1, explained.stderr
    (web_v4,) = [s for s in json.loads(explained.stdout)["services"] if s["family"] == "IPv4"]
    assert [d["kind"] for d in web_v4["drift"]] == ["not-programmed"]
    check = command("migrate", "--to=nftables", "--check", "-o", "json")
    kinds = {(d["kind"], d["what"]) for d in json.loads(check.stdout)["differences"]}
    assert ("kernel", "not-programmed") in kinds
