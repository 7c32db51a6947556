"""The namespace lab itself, without any proxy rules: plain routing, servers, teardown."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from kits.netlab_kit import CLIENT_IP6, EXTERNAL_IP6, small_spec

from kubeplex.testing import labkernel
from kubeplex.testing.netlab import (
    CLIENT_POD,
    DUAL_STACK_SPEC,
    EXTERNAL,
    LAN,
    NODE1,
    NODE2,
    UDP_PORT,
    WEB_A,
    WEB_B,
    WEB_C,
    Lab,
    LabError,
    down_all,
    reap_stale,
    tally,
    unique_prefix,
)

kernel = pytest.mark.kernel

CLIENT_IP = "10.244.1.3"


def netns_list() -> str:
    return subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True, check=True
    ).stdout


def pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@kernel
def test_bring_up_is_fast(netlab: Lab) -> None:
    assert netlab.is_up()
    assert netlab.timings["up"] < 10.0, netlab.timings


@kernel
@pytest.mark.parametrize("pod", [WEB_A, WEB_B, WEB_C])
def test_client_pod_reaches_pods_directly_without_nat(netlab: Lab, pod: str) -> None:
    ip = netlab.spec.pod(pod).ip
    [hostname] = netlab.http(CLIENT_POD, ip, 8080, "/hostname")
    assert (hostname.outcome, hostname.body) == ("ok", pod)
    [clientip] = netlab.http(CLIENT_POD, ip, 8080, "/clientip")
    assert clientip.ok and clientip.body is not None
    assert clientip.body.rsplit(":", 1)[0] == CLIENT_IP  # the pod saw the real client IP


@kernel
def test_every_request_is_a_new_connection(netlab: Lab) -> None:
    results = netlab.http(CLIENT_POD, netlab.spec.pod(WEB_B).ip, 8080, "/clientip", count=5)
    assert all(r.ok for r in results), results
    assert len({r.body for r in results}) == 5  # five distinct source ports


@kernel
def test_nodes_reach_each_others_pods(netlab: Lab) -> None:
    results = netlab.http(NODE1, netlab.spec.pod(WEB_C).ip, 8080, count=3)
    assert tally(results) == {WEB_C: 3}


@kernel
def test_external_client_reaches_node_ips_but_not_pods(netlab: Lab) -> None:
    # A hostNetwork-style server in the node namespace: the external host reaches it.
    netlab.start_server(NODE2, "node2-host", http_ports=(10080,))
    try:
        [r] = netlab.http(EXTERNAL, netlab.spec.node(NODE2).host_ip, 10080, "/clientip")
        assert r.ok and r.body is not None
        assert r.body.startswith(netlab.spec.host(EXTERNAL).ip + ":")
    finally:
        netlab.stop_server("node2-host")
    # It has no route to the pod network, like a machine outside the cluster.
    [r] = netlab.http(EXTERNAL, netlab.spec.pod(WEB_A).ip, 8080, timeout=1)
    assert r.outcome == "unreachable", r


@kernel
def test_closed_port_is_refused(netlab: Lab) -> None:
    node1_ip = netlab.spec.node(NODE1).host_ip
    assert [r.outcome for r in netlab.http(EXTERNAL, node1_ip, 9, timeout=1)] == ["refused"]
    web_b = netlab.spec.pod(WEB_B).ip
    assert [r.outcome for r in netlab.http(CLIENT_POD, web_b, 9, timeout=1)] == ["refused"]
    assert [r.outcome for r in netlab.udp(CLIENT_POD, web_b, 9, timeout=1)] == ["refused"]


@kernel
def test_udp_echo(netlab: Lab) -> None:
    web_c = netlab.spec.pod(WEB_C).ip
    assert tally(netlab.udp(CLIENT_POD, web_c, UDP_PORT, count=3)) == {WEB_C: 3}
    # A pinned source port keeps one 5-tuple (one conntrack flow) across datagrams.
    results = netlab.udp(
        CLIENT_POD, web_c, UDP_PORT, payload="clientip", count=2, source_port=40000
    )
    assert [r.body for r in results] == [f"{CLIENT_IP}:40000"] * 2


@kernel
def test_node_namespaces_take_iptables_nft_and_conntrack(netlab: Lab) -> None:
    rules = (
        "*filter\n:KPX-NETLAB - [0:0]\n-A FORWARD -m conntrack --ctstate NEW -j ACCEPT\nCOMMIT\n"
    )
    netlab.exec(NODE2, ["iptables-restore", "--noflush"], input=rules)
    try:
        assert "KPX-NETLAB" in netlab.exec(NODE2, ["iptables-save"]).stdout
        assert "KPX-NETLAB" in netlab.exec(NODE2, ["nft", "list", "ruleset"]).stdout
        assert "KPX-NETLAB" not in netlab.exec(NODE1, ["iptables-save"]).stdout
        # A ct match enables conntrack in this namespace, so forwarded flows now show up.
        web_b = netlab.spec.pod(WEB_B).ip
        netlab.udp(CLIENT_POD, web_b, UDP_PORT, source_port=40001)
        ct = netlab.exec(NODE2, ["conntrack", "-L", "-p", "udp", "--orig-port-src", "40001"])
        assert f"src={CLIENT_IP} dst={web_b} sport=40001 dport={UDP_PORT}" in ct.stdout
    finally:
        flush = "*filter\n:FORWARD ACCEPT [0:0]\n-F FORWARD\n-X KPX-NETLAB\nCOMMIT\n"
        netlab.exec(NODE2, ["iptables-restore", "--noflush"], input=flush)


@kernel
def test_no_link_reaches_the_root_namespace(netlab: Lab) -> None:
    own = set(netlab.namespaces)
    for ns in netlab.namespaces:
        links = json.loads(netlab.exec(ns, ["ip", "-j", "link", "show"]).stdout)
        ids = json.loads(netlab.exec(ns, ["ip", "-j", "netns", "list-id"]).stdout or "[]")
        names = {entry["nsid"]: entry.get("name") for entry in ids}
        for link in links:
            if "link_netnsid" in link:  # a veth whose peer is in another namespace
                assert names.get(link["link_netnsid"]) in own, (ns, link["ifname"], names)
            else:
                assert link["ifname"] in ("lo", "br0"), (ns, link["ifname"])


@kernel
def test_exec_error_names_namespace_and_stderr(netlab: Lab) -> None:
    with pytest.raises(
        LabError, match=r"kind-worker\] ip link show nosuchdev exited 1: .*does not exist"
    ):
        netlab.exec(NODE1, ["ip", "link", "show", "nosuchdev"])
    assert netlab.exec(NODE1, ["false"], check=False).returncode == 1
    assert netlab.namespace_of(LAN) == f"{netlab.prefix}-lan"
    with pytest.raises(LabError):
        netlab.namespace_of("nosuchpod")


@kernel
def test_lab_is_removed_even_if_the_body_raises() -> None:
    lab = Lab(small_spec(), unique_prefix())
    with pytest.raises(RuntimeError, match="boom"), lab:
        assert lab.http("h1", "172.18.0.5", 9, timeout=1)[0].outcome == "refused"
        pids = list(lab.server_pids().values())
        assert len(pids) == 1
        raise RuntimeError("boom")
    assert lab.prefix not in netns_list()
    assert all(pid_gone(pid) for pid in pids)
    lab.down()  # idempotent
    assert lab.prefix not in netns_list()


@kernel
def test_down_all_cleans_partial_state() -> None:
    prefix = unique_prefix()
    subprocess.run(["ip", "netns", "add", f"{prefix}-half"], check=True)
    sleeper = subprocess.Popen(
        ["ip", "netns", "exec", f"{prefix}-half", "sh", "-c", "echo in; exec sleep 600"],
        stdout=subprocess.PIPE,
    )
    try:
        assert sleeper.stdout is not None
        assert sleeper.stdout.readline() == b"in\n"  # it is inside the namespace now
        assert down_all(prefix) == [f"{prefix}-half"]
        assert sleeper.wait(timeout=5) != 0  # killed, not finished
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()
        if sleeper.stdout is not None:
            sleeper.stdout.close()
        down_all(prefix)
    assert prefix not in netns_list()
    assert down_all(prefix) == []


@kernel
def test_up_refuses_an_existing_prefix() -> None:
    lab = Lab(small_spec(), unique_prefix())
    with lab:
        with pytest.raises(LabError, match="already exists"):
            Lab(small_spec(), lab.prefix).up()
        assert lab.is_up()  # the refused second lab did not tear down the first
    assert lab.prefix not in netns_list()


# ------------------------------------------------------------------------------- dual-stack lab


@pytest.fixture(scope="module")
def netlab6() -> Iterator[Lab]:
    """The dual-stack lab (``DUAL_STACK_SPEC``), private to this module."""
    reap_stale()
    with Lab(DUAL_STACK_SPEC, unique_prefix()) as lab:
        yield lab


def host_of(body: str | None) -> str:
    """The address of a ``/clientip`` answer: ``ip:port`` or ``[ip]:port``."""
    host = (body or "").rsplit(":", 1)[0]
    return host[1:-1] if host.startswith("[") else host


@kernel
def test_ipv4_only_lab_has_no_global_ipv6(netlab: Lab) -> None:
    for name in (NODE1, CLIENT_POD, EXTERNAL):
        assert netlab.exec(name, ["ip", "-6", "addr", "show", "scope", "global"]).stdout == ""


@kernel
def test_dual_stack_bring_up_is_fast_and_settled(netlab6: Lab) -> None:
    assert netlab6.is_up()
    assert netlab6.timings["up"] < 10.0, netlab6.timings
    for ns in netlab6.namespaces:
        out = netlab6.exec(ns, ["ip", "-6", "addr", "show", "tentative"]).stdout
        assert out == "", (ns, out)
    for node in (NODE1, NODE2):
        fwd = netlab6.exec(node, ["sysctl", "-n", "net.ipv6.conf.all.forwarding"]).stdout
        assert fwd.strip() == "1", node
    lan_fwd = netlab6.exec(LAN, ["sysctl", "-n", "net.ipv6.conf.all.forwarding"]).stdout
    assert lan_fwd.strip() == "0"


@kernel
@pytest.mark.parametrize("pod", [WEB_A, WEB_B, WEB_C])
def test_client_pod_reaches_pods_over_ipv6_without_nat(netlab6: Lab, pod: str) -> None:
    ip6 = netlab6.spec.ip_of(pod, ipv6=True)
    [hostname] = netlab6.http(CLIENT_POD, ip6, 8080, "/hostname")
    assert (hostname.outcome, hostname.body) == ("ok", pod)
    [clientip] = netlab6.http(CLIENT_POD, f"[{ip6}]", 8080, "/clientip")
    assert clientip.ok and clientip.body is not None
    assert clientip.body.startswith(f"[{CLIENT_IP6}]:"), clientip  # bracketed, not NATed


@kernel
def test_dual_stack_lab_keeps_ipv4_answers_unchanged(netlab6: Lab) -> None:
    [r] = netlab6.http(CLIENT_POD, netlab6.spec.pod(WEB_B).ip, 8080, "/clientip")
    assert r.ok and r.body is not None and r.body.startswith(f"{CLIENT_IP}:"), r
    results = netlab6.udp(CLIENT_POD, netlab6.spec.pod(WEB_C).ip, UDP_PORT, payload="clientip")
    assert [host_of(x.body) for x in results] == [CLIENT_IP]


@kernel
def test_nodes_reach_each_others_pods_over_ipv6(netlab6: Lab) -> None:
    results = netlab6.http(NODE1, netlab6.spec.ip_of(WEB_C, ipv6=True), 8080, count=3)
    assert tally(results) == {WEB_C: 3}
    results = netlab6.http(NODE2, netlab6.spec.ip_of(WEB_A, ipv6=True), 8080, count=3)
    assert tally(results) == {WEB_A: 3}


@kernel
def test_external_reaches_node_over_ipv6_but_not_pods(netlab6: Lab) -> None:
    netlab6.start_server(NODE2, "node2-host6", http_ports=(10080,))
    try:
        node2_ip6 = netlab6.spec.ip_of(NODE2, ipv6=True)
        [r] = netlab6.http(EXTERNAL, node2_ip6, 10080, "/clientip")
        assert r.ok and host_of(r.body) == EXTERNAL_IP6, r
    finally:
        netlab6.stop_server("node2-host6")
    [r] = netlab6.http(EXTERNAL, netlab6.spec.ip_of(WEB_A, ipv6=True), 8080, timeout=1)
    assert r.outcome == "unreachable", r


@kernel
def test_closed_port_is_refused_over_ipv6(netlab6: Lab) -> None:
    node1_ip6 = netlab6.spec.ip_of(NODE1, ipv6=True)
    assert [r.outcome for r in netlab6.http(EXTERNAL, node1_ip6, 9, timeout=1)] == ["refused"]
    web_b6 = netlab6.spec.ip_of(WEB_B, ipv6=True)
    assert [r.outcome for r in netlab6.http(CLIENT_POD, web_b6, 9, timeout=1)] == ["refused"]
    assert [r.outcome for r in netlab6.udp(CLIENT_POD, web_b6, 9, timeout=1)] == ["refused"]


@kernel
def test_udp_echo_over_ipv6(netlab6: Lab) -> None:
    web_c6 = netlab6.spec.ip_of(WEB_C, ipv6=True)
    assert tally(netlab6.udp(CLIENT_POD, web_c6, UDP_PORT, count=3)) == {WEB_C: 3}
    results = netlab6.udp(
        CLIENT_POD, web_c6, UDP_PORT, payload="clientip", count=2, source_port=40000
    )
    assert [r.body for r in results] == [f"[{CLIENT_IP6}]:40000"] * 2


@kernel
def test_lan_gateway_is_a_dead_end_for_ipv6(netlab6: Lab) -> None:
    # Node1 routes an unknown IPv6 destination to the lan gateway, which forwards nothing.
    [r] = netlab6.http(NODE1, "fd00:96::1", 80, timeout=0.5)
    assert not r.ok, r


# ---------------------------------------------------------------------- node cgroups and bpffs


def cgroup_v2_of(lab: Lab, ns: str) -> str:
    """The cgroup2 path (from its mount) a process started by ``lab.exec`` in ``ns`` is in."""
    lines = lab.exec(ns, ["cat", "/proc/self/cgroup"]).stdout.splitlines()
    return next(line.removeprefix("0::") for line in lines if line.startswith("0::"))


def pid_cgroup_v2(pid: int) -> str:
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    return next(line.removeprefix("0::") for line in lines if line.startswith("0::"))


def cgroup_mount() -> Path:
    mount = labkernel.cgroup2_mount()
    if mount is None:
        pytest.skip("no cgroup2 mounted")
    return mount


@kernel
def test_processes_of_a_node_and_its_pods_run_in_the_node_cgroup(netlab: Lab) -> None:
    root = cgroup_mount()
    assert netlab.no_cgroups is None
    node1, node2 = netlab.cgroup_of(NODE1), netlab.cgroup_of(NODE2)
    assert node1 is not None and node2 is not None and node1 != node2
    assert netlab.cgroup_of(CLIENT_POD) == node1 and netlab.cgroup_of(WEB_B) == node2
    assert netlab.cgroup_of(EXTERNAL) is None and netlab.cgroup_of(LAN) is None
    rel = {name: "/" + str(path.relative_to(root)) for name, path in (("1", node1), ("2", node2))}
    assert cgroup_v2_of(netlab, CLIENT_POD) == rel["1"]
    assert cgroup_v2_of(netlab, NODE2) == rel["2"]
    assert cgroup_v2_of(netlab, EXTERNAL) not in rel.values()
    assert cgroup_v2_of(netlab, LAN) not in rel.values()
    # The pod servers started by up() and by start_server.
    pids = netlab.server_pids()
    assert pid_cgroup_v2(pids[WEB_A]) == rel["1"]
    assert pid_cgroup_v2(pids[WEB_C]) == rel["2"]
    netlab.start_server(NODE2, "node2-cg", http_ports=(10081,))
    try:
        assert pid_cgroup_v2(netlab.server_pids()["node2-cg"]) == rel["2"]
        assert str(netlab.server_pids()["node2-cg"]) in (node2 / "cgroup.procs").read_text()
    finally:
        netlab.stop_server("node2-cg")


@kernel
def test_every_node_has_a_folder_in_the_labs_own_bpffs(netlab: Lab) -> None:
    assert netlab.no_bpffs is None
    folders = [netlab.bpffs_of(NODE1), netlab.bpffs_of(NODE2)]
    assert None not in folders and folders[0] != folders[1]
    assert netlab.bpffs_of(WEB_A) == folders[0]
    assert netlab.bpffs_of(EXTERNAL) is None
    for folder in folders:
        assert folder is not None
        fstype = subprocess.run(
            ["stat", "-f", "-c", "%T", str(folder)], capture_output=True, text=True, check=True
        ).stdout.strip()
        assert fstype == "bpf_fs", (folder, fstype)
        assert not str(folder).startswith("/sys/fs/bpf")  # never the machine's bpffs


@kernel
def test_down_removes_cgroups_and_bpffs_even_with_processes_left_in_them() -> None:
    cgroup_mount()
    lab = Lab(small_spec(), unique_prefix())
    with lab:
        node = lab.spec.nodes[0].name
        cgroup, bpffs = lab.cgroup_of(node), lab.bpffs_of(node)
        assert cgroup is not None and bpffs is not None
        (bpffs / "pinned").mkdir()  # something pinned in it
        # A process that left the namespace machinery behind: only its cgroup still holds it.
        stray = subprocess.Popen(
            ["sh", "-c", f"echo $$ > {cgroup / 'cgroup.procs'}; echo in; exec sleep 600"],
            stdout=subprocess.PIPE,
        )
        assert stray.stdout is not None and stray.stdout.readline() == b"in\n"
    try:
        assert stray.wait(timeout=5) != 0  # killed by down(), not finished
    finally:
        if stray.poll() is None:
            stray.kill()
            stray.wait()
        assert stray.stdout is not None
        stray.stdout.close()
    assert not cgroup.parent.exists()
    assert not bpffs.parent.exists()
    assert not labkernel.is_bpffs_mount(bpffs.parent)
    assert lab.cgroup_of(node) is None and lab.bpffs_of(node) is None


@kernel
def test_down_all_and_reap_stale_remove_kernel_folders_without_namespaces() -> None:
    cgroup_mount()
    prefix = unique_prefix()
    labkernel.make_cgroups(prefix, ["n1"])
    labkernel.mount_bpffs(prefix, ["n1"])
    assert down_all(prefix) == []
    assert prefix not in labkernel.prefixes()
    # A lab of a dead process: only its cgroup folder and bpffs are left.
    child = subprocess.Popen(["true"])
    child.wait()
    stale = f"kpxt{child.pid}x0000"
    labkernel.make_cgroups(stale, ["n1"])
    labkernel.mount_bpffs(stale, ["n1"])
    reap_stale()
    assert stale not in labkernel.prefixes()


@kernel
def test_without_cgroup2_the_lab_works_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(labkernel, "cgroup2_mount", lambda mounts=None: None)  # none mounted
    with Lab(small_spec(), unique_prefix()) as lab:
        assert lab.no_cgroups is not None and "cgroup2" in lab.no_cgroups
        assert lab.cgroup_of("n1") is None and lab.bpffs_of("n1") is not None
        [r] = lab.http("h1", "172.18.0.5", 9, timeout=1)
        assert r.outcome == "refused"
        assert tally(lab.udp("n1", lab.spec.pod("p1").ip, 9000)) == {"p1": 1}
    assert lab.prefix not in netns_list()
