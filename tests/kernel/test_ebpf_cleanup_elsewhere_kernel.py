"""What the ebpf mode left is removed by another mode's pod: one that mounts the node's bpffs but
not its cgroup2, and runs without CAP_BPF or CAP_SYS_ADMIN (the chart's pods of the other
modes). Unpinning a link nobody else holds detaches its program, so the bpffs is enough."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from kits.ebpf_kit import client, own_bpffs, own_cgroup, own_loader, serving
from kits.render_kit import config, seed_lab_cluster

from kubeplex.backends.ebpf import EbpfBackend
from kubeplex.core.dataplane.backend import BackendContext

pytestmark = pytest.mark.kernel

NODE = "kind-worker"
WEB = "10.96.88.59"
PODS = ["10.244.1.2", "10.244.2.2", "10.244.2.3"]

#: The other mode's pod: the core's cleanup of every other mode, with the ebpf options naming
#: the bpffs only (its cgroup2 is not mounted there).
CLEANUP = textwrap.dedent(
    r"""
    import json, sys
    from kubeplex.backends.ebpf import EbpfBackend
    from kubeplex.core.config.kubeproxy import parse_config
    from kubeplex.core.daemon.modes import cleanup_modes
    from kubeplex.core.dataplane.backend import BackendContext

    bpffs, netns = sys.argv[1], sys.argv[2]
    doc = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
    cfg = parse_config(doc + "mode: nftables\n", "test config", ["nftables", "ebpf"])
    ctx = BackendContext(cfg, "kind-worker", netns=netns)
    options = {"bpffs": bpffs, "cgroup": "/nonexistent"}
    make = lambda mode, c: EbpfBackend(c, options=options)
    (done,) = cleanup_modes(ctx, ["ebpf"], make=make)
    print(json.dumps({"removed": list(done.removed), "skipped": done.skipped,
                      "error": done.error}))
    """
)


@pytest.fixture
def setup() -> Iterator[tuple[Path, Path]]:
    with own_bpffs() as bpffs, own_cgroup() as cgroup, own_loader(bpffs):
        yield bpffs, cgroup


def attached(cgroup: Path) -> str:
    return subprocess.run(
        ["bpftool", "cgroup", "show", str(cgroup)], capture_output=True, text=True, check=True
    ).stdout


def test_another_modes_pod_without_cgroup2_or_cap_bpf_removes_the_modes_programs(
    setup: tuple[Path, Path], netns: str
) -> None:
    bpffs, cgroup = setup
    options = {"bpffs": str(bpffs), "cgroup": str(cgroup)}
    ctx = BackendContext(config({"mode": "nftables"}), NODE, netns=netns)
    backend = EbpfBackend(ctx, options=options)
    backend.prepare()
    assert not backend.sync(seed_lab_cluster().checkout(full=True)).failed
    backend.kernel.close()  # (the old pod is gone: it holds no fd)
    backend.kernel.maps = {}
    assert "connect4" in attached(cgroup)
    with serving(netns, PODS):
        assert client(netns, cgroup, WEB, 80, "tcp")["peer"] == [WEB, 80]

    # setpriv (util-linux): root's capabilities after exec are its bounding set.
    dropped = ["setpriv", "--bounding-set=-bpf,-sys_admin,-perfmon", "--"]
    run = subprocess.run(
        [*dropped, sys.executable, "-c", CLEANUP, str(bpffs), netns],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    done = json.loads(run.stdout)
    assert not done["skipped"] and not done["error"], done
    assert any(p.endswith("links/connect4") for p in done["removed"]), done
    assert "connect4" not in attached(cgroup)
    assert not (bpffs / "kubeplex").exists()
