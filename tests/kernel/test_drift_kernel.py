"""Rules someone else puts into a Service's own chain are drift: ``kubeplex explain`` names
them, ``kubeplex migrate --check`` says the Service differs, and the daemon's next full sync
writes the chain again, says so in its log and counts it in
``kubeplex_drift_repaired_rules_total`` (both Linux netfilter modes, in a network namespace).
Also: what the modes render compares equal to what the tools print back (no false drift)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kits.cli_kit import LAB, in_netns, kubeplex, wait_until
from kits.render_kit import (
    NODE,
    RenderHarness,
    endpoint_slice,
    ep,
    node_obj,
    overall_objects,
    port,
    service,
)

from kubeplex.backends.iptables import IptablesBackend
from kubeplex.backends.nftables import NftablesBackend
from kubeplex.core.dataplane.backend import Backend, BackendContext
from kubeplex.core.model.types import IPFamily

pytestmark = pytest.mark.kernel

SVC_CHAIN = {
    "iptables": "KUBE-SVC-LOLE4ISW44XBNF3G",
    "nftables": "service-PFISGYVC-default/web/tcp/",
}
#: The issue's foreign rules, placed first in default/web's chain: a RETURN (drop) and a jump
#: to someone else's DNAT, as each mode's tool prints them back.
FOREIGN = {
    "iptables": [
        "-A KUBE-SVC-LOLE4ISW44XBNF3G -j FOREIGN-DNAT",
        "-A KUBE-SVC-LOLE4ISW44XBNF3G -j RETURN",
    ],
    "nftables": ["meta l4proto tcp dnat to 10.9.9.9:80", "drop"],
}
MODES = ("iptables", "nftables")
#: What shows that the foreign jump or DNAT is in the chain.
MARK = {"iptables": "FOREIGN-DNAT", "nftables": "10.9.9.9"}


def insert_foreign_rules(ns: str, mode: str) -> None:
    chain = SVC_CHAIN[mode]
    if mode == "iptables":
        in_netns(ns, "iptables", "-t", "nat", "-N", "FOREIGN-DNAT")
        in_netns(ns, "iptables", "-t", "nat", "-A", "FOREIGN-DNAT", "-p", "tcp", "-j", "DNAT",
                 "--to-destination", "10.9.9.9:80")  # fmt: skip
        in_netns(ns, "iptables", "-t", "nat", "-I", chain, "1", "-j", "FOREIGN-DNAT")
        in_netns(ns, "iptables", "-t", "nat", "-I", chain, "1", "-j", "RETURN")
    else:
        for rule in FOREIGN[mode]:
            in_netns(ns, "nft", f"insert rule ip kube-proxy {chain} {rule}")


def chain_rules(ns: str, mode: str) -> str:
    if mode == "iptables":
        return in_netns(ns, "iptables", "-t", "nat", "-S", SVC_CHAIN[mode])
    return in_netns(ns, "nft", "list", "chain", "ip", "kube-proxy", SVC_CHAIN[mode])


def lab_args(ns: str, mode: str, config: Path = LAB / "config.yaml") -> tuple[str, ...]:
    return ("--config", str(config), "--manifests", str(LAB / "manifests"), "--netns", ns,
            "--proxy-mode", mode)  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
def test_explain_and_migrate_check_see_foreign_rules_in_a_service_chain(
    netns: str, mode: str
) -> None:
    args = lab_args(netns, mode)
    assert kubeplex("run", *args, "--once").returncode == 0
    insert_foreign_rules(netns, mode)

    proc = kubeplex("explain", "default/web", *args, "-o", "json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (svc,) = json.loads(proc.stdout)["services"]
    extra = [(d["subject"], d["found"]) for d in svc["drift"] if d["kind"] == "extra-rule"]
    assert sorted(extra) == sorted((SVC_CHAIN[mode], rule) for rule in FOREIGN[mode])
    text = kubeplex("explain", "default/web", *args)
    assert text.returncode == 1
    assert "drift: none" not in text.stdout
    for rule in FOREIGN[mode]:
        assert (
            f"chain {SVC_CHAIN[mode]} holds a rule kubeplex would not write: {rule}" in text.stdout
        )
    # The other Service's chains are untouched: no drift there.
    assert kubeplex("explain", "default/web-nodeport", *args).returncode == 0

    other = "nftables" if mode == "iptables" else "iptables"
    check = kubeplex("migrate", "--to", other, "--check", *args, "-o", "json")
    assert check.returncode == 1, check.stdout + check.stderr
    doc = json.loads(check.stdout)
    web = next(s for s in doc["services"] if s["service"] == "default/web")
    assert web["same"] is False
    kernel = [d for d in doc["differences"] if d["kind"] == "kernel"]
    assert {d["what"] for d in kernel} == {"extra-rule"}
    assert all(d["affects"] == ["default/web (IPv4)"] for d in kernel)
    assert (
        "DIFFERS default/web (IPv4)" in kubeplex("migrate", "--to", other, "--check", *args).stdout
    )


def http_in(ns: str, port: int, path: str) -> str:
    """GET 127.0.0.1:port/path from inside the namespace (where the daemon listens)."""
    url = f"http://127.0.0.1:{port}{path}"
    code = (
        f"import urllib.request; print(urllib.request.urlopen({url!r}, timeout=3).read().decode())"
    )
    argv = ["ip", "netns", "exec", ns, sys.executable, "-c", code]
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=10).stdout


def metric(ns: str, port: int, name: str, labels: str) -> float | None:
    try:
        text = http_in(ns, port, "/metrics")
    except subprocess.CalledProcessError:
        return None  # not listening yet
    for line in text.splitlines():
        if line.startswith(f"{name}{{") and all(p in line for p in labels.split(",")):
            return float(line.split()[-1])
    return 0.0


@pytest.mark.parametrize("mode", MODES)
def test_a_full_sync_repairs_foreign_rules_logs_and_counts_them(
    tmp_path: Path, netns: str, mode: str
) -> None:
    port = 10249
    cfg = yaml.safe_load((LAB / "config.yaml").read_text())
    cfg["metricsBindAddress"] = f"127.0.0.1:{port}"
    cfg["healthzBindAddress"] = "127.0.0.1:10256"
    cfg[mode] = {"minSyncPeriod": "100ms", "syncPeriod": "1s"}
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    log = tmp_path / "daemon.log"
    argv = [sys.executable, "-m", "kubeplex.core.cli.main", "run", *lab_args(netns, mode, config)]
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        name = "kubeplex_drift_repaired_rules_total"
        labels = f'mode="{mode}"'
        wait_until(lambda: metric(netns, port, name, labels) is not None, "the first sync")
        assert metric(netns, port, name, labels) == 0
        insert_foreign_rules(netns, mode)
        assert MARK[mode] in chain_rules(netns, mode)

        wait_until(lambda: MARK[mode] not in chain_rules(netns, mode), "the repair", timeout=30)
        assert "RETURN" not in chain_rules(netns, mode) and "drop" not in chain_rules(netns, mode)
        extra = f'{labels},kind="extra"'
        wait_until(lambda: metric(netns, port, name, extra) == 2, "the drift counted")
        for kind in ("missing", "changed"):
            assert metric(netns, port, name, f'{labels},kind="{kind}"') == 0
        logged = [line for line in log.read_text().splitlines() if "last wrote" in line]
        assert len(logged) == 1, log.read_text()
        assert "WARNING" in logged[0] and f"{SVC_CHAIN[mode]}: 2 extra" in logged[0]
        assert "(2 rules;" in logged[0]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def backend_in(ns: str, mode: str) -> Callable[[BackendContext], Backend]:
    cls = IptablesBackend if mode == "iptables" else NftablesBackend
    return lambda ctx: cls(BackendContext(ctx.config, ctx.node_name, ctx.families, netns=ns))


def ipv6_objects() -> list[dict[str, Any]]:
    """IPv6 Services: a LoadBalancer with source ranges and affinity whose endpoint is local,
    and one without endpoints."""
    return [
        node_obj(("fd00::10",)),
        service("ns1", "lb6", "fd00:10:96::1", [port(node_port=3001)], type="LoadBalancer",
                ipFamilies=["IPv6"], loadBalancerSourceRanges=["2001:db8::/64"],
                sessionAffinity="ClientIP", ingress=["2001:db8:1::1"]),
        endpoint_slice("ns1", "lb6", [ep("fd00:10:244::5", NODE)], family="IPv6"),
        service("ns1", "empty6", "fd00:10:96::2", [port()], ipFamilies=["IPv6"]),
    ]  # fmt: skip


@pytest.mark.parametrize("family", (IPFamily.IPv4, IPFamily.IPv6))
@pytest.mark.parametrize("mode", MODES)
def test_what_the_modes_render_is_what_the_tools_print_back(
    netns: str, mode: str, family: IPFamily
) -> None:
    """Upstream's overall scenario (every Service type, a Local policy, source ranges, session
    affinity, a Service without endpoints; IPv6: ``ipv6_objects``) written to the kernel: a
    second full sync finds no drift, nor does inspect, in any of its chains."""
    if family is IPFamily.IPv4:
        objects: list[dict[str, Any]] = overall_objects(
            node_obj(), NODE, sessionAffinity="ClientIP",
            sessionAffinityConfig={"clientIP": {"timeoutSeconds": 10800}},
        )  # fmt: skip
        cfg = {"mode": mode}
    else:
        objects, cfg = ipv6_objects(), {"mode": mode, "clusterCIDR": "fd00:10:244::/64"}
    h: RenderHarness[Backend, Any] = RenderHarness(
        backend_in(netns, mode), objects, cfg, (family,), NODE
    )
    h.backend.prepare()  # as the daemon does: the iptables mode's nfacct counters
    h.backend.sync(h.cluster.checkout(full=True))
    state = h.cluster.checkout(full=True)
    assert h.backend.sync(state).repaired == ()
    ports = sorted(state.graphs[family].services)
    assert len(ports) == (6 if family is IPFamily.IPv4 else 2)
    for spn in ports:
        views = h.backend.inspect(spn)
        assert views, spn
        assert [v.rule_drift for v in views] == [()], spn
