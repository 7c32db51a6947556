"""The seed lab in ipvs mode as a user runs it (runs in the test VM; skipped without IPVS):
``kubeplex run --once`` programs both ClusterIPs with three masquerading real servers each,
the NodePort on the node's address and every Service IP on kube-ipvs0, read back with the
kernel's own tools; ``kubeplex explain`` shows the virtual service and flags a real server
deleted by hand. One namespace node (no pods: nothing here sends traffic)."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator

import pytest
from kits.cli_kit import LAB, in_netns, kubeplex

NODE_IP = "172.18.0.5"  # the lab Node's InternalIP
CLUSTER_IPS = ("10.96.88.59", "10.96.223.155")
WEB_PODS = ("10.244.1.2:8080", "10.244.2.2:8080", "10.244.2.3:8080")
ARGS = ("--config", str(LAB / "config.yaml"), "--proxy-mode", "ipvs")
SOURCES = ("--manifests", str(LAB / "manifests"))


pytestmark = pytest.mark.skipif(
    shutil.which("ipvsadm") is None, reason="reads the kernel back with ipvsadm (not installed)"
)


@pytest.fixture
def node(netns: str) -> Iterator[str]:
    """A scratch namespace with the lab Node's address on its interface."""
    in_netns(netns, "ip", "link", "add", "eth0", "type", "dummy")
    in_netns(netns, "ip", "addr", "add", f"{NODE_IP}/24", "dev", "eth0")
    in_netns(netns, "ip", "link", "set", "eth0", "up")
    yield netns
    kubeplex("cleanup", *ARGS, "--netns", netns, "--mode", "ipvs")


def virtual_services(netns: str) -> dict[str, list[tuple[str, str, int]]]:
    """``ipvsadm -Ln`` as {"TCP ip:port sched": [(real server, forwarding, weight)]}."""
    out: dict[str, list[tuple[str, str, int]]] = {}
    current = ""
    for line in in_netns(netns, "ipvsadm", "-Ln").splitlines():
        m = re.match(r"^(TCP|UDP|SCTP)\s+(\S+)\s+(\S+)", line)
        if m:
            current = " ".join(m.groups())
            out[current] = []
            continue
        m = re.match(r"^\s+->\s+(\d\S+)\s+(\S+)\s+(\d+)", line)
        if m and current:
            out[current].append((m.group(1), m.group(2), int(m.group(3))))
    return out


def addresses_on_kube_ipvs0(netns: str) -> set[str]:
    text = in_netns(netns, "ip", "-o", "addr", "show", "dev", "kube-ipvs0")
    return set(re.findall(r"inet6? (\S+)", text))


def test_run_once_programs_the_seed_lab_and_explain_reads_it(node: str) -> None:
    run = kubeplex("run", *ARGS, "--netns", node, *SOURCES, "--once", timeout=600)
    assert run.returncode == 0, run.stderr
    held = virtual_services(node)
    masq = sorted((pod, "Masq", 1) for pod in WEB_PODS)
    expected = {f"TCP {ip}:80 rr" for ip in CLUSTER_IPS} | {f"TCP {NODE_IP}:30080 rr"}
    assert set(held) == expected, held
    for key in expected:
        assert sorted(held[key]) == masq, (key, held[key])
    assert addresses_on_kube_ipvs0(node) == {f"{ip}/32" for ip in CLUSTER_IPS}
    link = in_netns(node, "ip", "-o", "link", "show", "dev", "kube-ipvs0")
    assert "state DOWN" in link and "dummy" in in_netns(
        node, "ip", "-d", "-o", "link", "show", "dev", "kube-ipvs0"
    )

    explain = kubeplex("explain", "default/web", *ARGS, "--netns", node, *SOURCES, timeout=600)
    assert explain.returncode == 0, explain.stdout + explain.stderr
    out = explain.stdout
    print(out)
    assert "default/web (TCP, IPv4), mode ipvs" in out
    assert "ClusterIP 10.96.88.59:80/TCP: forwarded to an endpoint" in out
    assert "-A -t 10.96.88.59:80 -s rr" in out
    assert "3. endpoint choice: 3 endpoints by weight (of 3 in all)" in out
    for pod in WEB_PODS:
        assert re.search(rf"{re.escape(pod)}\s+share 33\.3%  weight 1", out), pod
    assert "address 10.96.88.59 on kube-ipvs0" in out
    assert "drift: none" in out

    # A real server deleted by hand: drift, exit 1.
    in_netns(node, "ipvsadm", "-d", "-t", "10.96.88.59:80", "-r", WEB_PODS[2])
    drifted = kubeplex("explain", "default/web", *ARGS, "--netns", node, *SOURCES, timeout=600)
    assert drifted.returncode == 1, drifted.stdout + drifted.stderr
    assert f"endpoint {WEB_PODS[2]} is not programmed" in drifted.stdout
    assert "NOT PROGRAMMED" in drifted.stdout
    # The other Service, untouched, has none.
    other = kubeplex(
        "explain", "default/web-nodeport", *ARGS, "--netns", node, *SOURCES, timeout=600
    )
    assert other.returncode == 0, other.stdout + other.stderr
    assert "NodePort node port 30080/TCP: forwarded" in other.stdout
    assert f"-A -t {NODE_IP}:30080 -s rr" in other.stdout
