"""``kubeplex render --proxy-mode ebpf`` against maps pinned in a bpffs of the test's own: as
root it reads them (a stray entry is in the plan, to delete); as a user without privilege it
says it cannot, and prints the plan from nothing."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from ipaddress import IPv4Address
from pathlib import Path

import pytest
from kits.cli_kit import RENDER_LAB
from kits.ebpf_kit import own_bpffs, own_cgroup, own_loader, write_trust_list

from kubeplex.backends.ebpf import layout
from kubeplex.backends.ebpf.maps import PinnedMaps

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)"),
]

AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
STRAY = "delete kpx_svc4 10.96.0.99:80/tcp"


@pytest.fixture
def trust_list() -> Iterator[tuple[Path, Path]]:
    """A trust list (in a folder every user may read) whose ebpf options are a bpffs and a
    cgroup of the test's own, with the maps pinned there and one stray entry in them."""
    folder = Path(tempfile.mkdtemp(prefix="kpx-ebpf-cli-"))
    folder.chmod(0o755)
    try:
        with own_bpffs() as bpffs, own_cgroup() as cgroup, own_loader(bpffs) as loader:
            maps = PinnedMaps(loader.start(cgroup).maps)
            key = layout.svc_key(IPv4Address("10.96.0.99"), 80, layout.PROTO_TCP)
            maps.update(layout.SVC4.name, key, layout.svc_value(7, 0))
            maps.close()
            path = write_trust_list(
                folder / "plugins.toml", {"bpffs": str(bpffs), "cgroup": str(cgroup)}
            )
            yield path, bpffs
    finally:
        shutil.rmtree(folder)


def render(trust: Path, *prefix: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "kubeplex.core.cli.main", "--plugins", str(trust)]
    return subprocess.run(
        [*prefix, *command, *RENDER_LAB, "--proxy-mode", "ebpf"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd="/",
    )


def test_render_reads_the_pinned_maps_where_it_may(trust_list: tuple[Path, Path]) -> None:
    trust, bpffs = trust_list
    as_root = render(trust)
    assert as_root.returncode == 0, as_root.stderr
    assert STRAY in as_root.stdout.splitlines() and as_root.stderr == ""

    bpffs.chmod(0o700)  # as a bpffs mount is on a node: root's alone
    alone = render(trust, *AS_NOBODY)
    assert alone.returncode == 0, alone.stderr
    assert "kubeplex: cannot read the kernel (" in alone.stderr
    assert "printing the rules alone" in alone.stderr and "Traceback" not in alone.stderr
    assert STRAY not in alone.stdout
    assert "update kpx_svc4 10.96.88.59:80/tcp" in alone.stdout
