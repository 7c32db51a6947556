"""``kubeplex lab`` as a user runs it, in the ebpf mode: the seed lab programmed on the lab's own
node cgroups and bpffs, both ClusterIPs reaching all three web pods from the client pod, and
``--down`` leaving nothing behind."""

from __future__ import annotations

import subprocess

import pytest
from kits.cli_kit import kubeplex
from kits.ebpf_kit import missing

from kubeplex.testing import labkernel
from kubeplex.testing.netlab import NODE1, WEB_A, WEB_B, WEB_C, list_namespaces, unique_prefix

pytestmark = pytest.mark.kernel


def sections(out: str) -> dict[str, str]:
    """The ``== title`` sections of the command's output, by title."""
    found: dict[str, str] = {}
    for part in out.split("\n== ")[1:]:
        title, _, body = part.partition("\n")
        found[title] = body.split("\n\n")[0].strip()
    return found


def titled(found: dict[str, str], start: str) -> str:
    [body] = [body for title, body in found.items() if title.startswith(start)]
    return body


def test_lab_in_ebpf_mode_programs_the_seed_lab_and_down_removes_it() -> None:
    reason = missing()
    if reason:
        pytest.skip(reason)
    prefix = unique_prefix()
    cgroup = labkernel.lab_cgroup(prefix)
    assert cgroup is not None
    try:
        done = kubeplex("lab", "--mode", "ebpf", "--requests", "30", "--prefix", prefix)
        assert done.returncode == 0, done.stdout + done.stderr
        found = sections(done.stdout)
        held = titled(found, f"what {NODE1} holds for default/web")
        assert "10.96.88.59" in held
        for ip in ("10.244.1.2:8080", "10.244.2.2:8080", "10.244.2.3:8080"):
            assert ip in held, held
        for cluster_ip in ("10.96.88.59", "10.96.223.155"):
            answers = titled(found, f"30 requests from the client pod to http://{cluster_ip}/")
            names = {line.split()[1] for line in answers.splitlines()}
            assert names == {WEB_A, WEB_B, WEB_C}, answers
        # The NodePort answers the external host (through the node's NAT, masqueraded).
        answer = titled(found, "curl http://172.18.0.5:30080/clientip from the external host")
        assert answer.startswith("10.244.1.1:") or answer.startswith("172.18.0.5:"), answer
        # Translated at the socket: no NAT entry in the node's conntrack.
        assert titled(found, "conntrack -L -d 10.96.88.59") == "(nothing)"
        # Attached to the lab's node cgroup, pinned in the lab's bpffs.
        attached = subprocess.run(
            ["bpftool", "cgroup", "show", str(cgroup / NODE1)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "connect4" in attached and "kpx_connect4" in attached, attached
        assert (labkernel.lab_bpffs(prefix) / NODE1 / "kubeplex").is_dir()
    finally:
        down = kubeplex("lab", "--down", "--prefix", prefix)
    assert down.returncode == 0, down.stderr
    assert list_namespaces(prefix) == []
    assert not cgroup.exists()
    assert prefix not in labkernel.prefixes()
