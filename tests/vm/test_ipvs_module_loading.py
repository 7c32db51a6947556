"""The ipvs mode on a node whose IPVS modules are loadable but not loaded, and on one where
they cannot be loaded (runs in the test VM only: it unloads ip_vs, blacklists it and hides
/lib/modules, which is no test's business on a real node).

Loadable: ``kubeplex run`` makes the kernel load ip_vs and the scheduler's module (upstream's
probe virtual service) before it writes the net.ipv4.vs sysctls, and programs the lab.
Not loadable: ``kubeplex backends`` names what stops it, the kernel indeed does not load it,
and the start fails with that one line, not a traceback.
"""

from __future__ import annotations

import gc
import json
import platform
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kits.cli_kit import LAB, in_netns, kubeplex

from kubeplex.backends.ipvs import IpvsBackend
from kubeplex.backends.ipvs.kernel import IpvsKernel
from kubeplex.core.config.kubeproxy import with_overrides
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import BackendContext
from kubeplex.core.model.errors import BackendError
from kubeplex.core.model.types import IPFamily
from kubeplex.testing.dataplane import lab_config
from kubeplex.testing.vm.guest import GUEST_MODULES
from kubeplex.testing.vm.initramfs import GUEST_CTL

V4 = IPFamily.IPv4
RUN = ("--config", str(LAB / "config.yaml"), "--proxy-mode", "ipvs")
SOURCES = ("--manifests", str(LAB / "manifests"))
WEB = "10.96.88.59:80"
WEB_PODS = ("10.244.1.2:8080", "10.244.2.2:8080", "10.244.2.3:8080")
#: The IPVS modules the guest loads at boot, those that use ip_vs first (the unload order).
IPVS_MODULES = (
    *(m for m in GUEST_MODULES if m.startswith("ip_vs_")),
    "xt_ipvs",
    "ip_vs",
)
BLACKLIST = Path("/etc/modprobe.d/kubeplex-test-no-ipvs.conf")
MODULES = Path("/lib/modules")
UNLOAD_TIMEOUT = 120.0

pytestmark = pytest.mark.skipif(
    not Path(GUEST_CTL).is_dir(), reason="unloads IPVS and edits modprobe.d: the test VM only"
)


def loaded(module: str) -> bool:
    return Path("/sys/module", module).exists()


def _modprobe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["modprobe", *args], capture_output=True, text=True, check=False)


@pytest.fixture
def unloaded() -> Iterator[None]:
    """ip_vs and every scheduler unloaded, as on a node that has not used IPVS since boot;
    loaded again afterwards for the tests that follow."""
    # A deleted namespace holds its virtual services' schedulers until the kernel has
    # cleaned it up: a little later, once no socket of an earlier test is left in it.
    gc.collect()
    deadline = time.monotonic() + UNLOAD_TIMEOUT
    while (gone := _modprobe("-r", "-a", *IPVS_MODULES)).returncode != 0:
        if time.monotonic() > deadline:
            pytest.fail(f"ip_vs stays loaded: {gone.stderr.strip()}")
        time.sleep(0.5)
    assert not loaded("ip_vs")
    try:
        yield
    finally:
        BLACKLIST.unlink(missing_ok=True)
        subprocess.run(["umount", str(MODULES)], capture_output=True, check=False)
        _modprobe("-a", *IPVS_MODULES)


def prepared(netns: str) -> IpvsBackend:
    """The ipvs mode's backend for namespace ``netns``, before its start."""
    cfg = with_overrides(lab_config("ipvs"), mode="ipvs", known_modes=plugins.known_modes())
    ctx = BackendContext(cfg, "kind-worker", (V4,), netns, kernel=IpvsKernel(netns))
    return IpvsBackend(ctx)


def ipvs_status() -> dict[str, str]:
    """``kubeplex backends --json``'s line for the ipvs mode."""
    listed = kubeplex("backends", "--json", timeout=600)
    assert listed.returncode == 0, listed.stderr
    (entry,) = [b for b in json.loads(listed.stdout)["backends"] if b["mode"] == "ipvs"]
    return {"status": entry["status"], "detail": entry["detail"]}


def test_run_loads_ip_vs_and_its_scheduler_and_programs_the_lab(unloaded: None, netns: str) -> None:
    assert ipvs_status() == {"status": "ok", "detail": ""}  # loadable is enough
    run = kubeplex("run", *RUN, "--netns", netns, *SOURCES, "--once", timeout=600)
    assert run.returncode == 0, run.stderr
    assert loaded("ip_vs") and loaded("ip_vs_rr")
    saved = in_netns(netns, "ipvsadm", "-S", "-n").splitlines()
    assert f"-A -t {WEB} -s rr" in saved
    assert sorted(line for line in saved if line.startswith(f"-a -t {WEB} ")) == [
        f"-a -t {WEB} -r {pod} -m -w 1" for pod in sorted(WEB_PODS)
    ]
    assert not any("198.51.100.0" in line for line in saved)  # the probe is gone
    # The sysctls that exist only once ip_vs is loaded were written.
    assert in_netns(netns, "sysctl", "-n", "net.ipv4.vs.conntrack").strip() == "1"
    assert in_netns(netns, "sysctl", "-n", "net.ipv4.vs.expire_nodest_conn").strip() == "1"
    # kube-ipvs0 without a transmit queue, as upstream makes it.
    txqlen = in_netns(netns, "cat", "/sys/class/net/kube-ipvs0/tx_queue_len")
    assert txqlen.strip() == "0"


def test_a_probe_left_behind_is_replaced_and_removed(netns: str) -> None:
    in_netns(netns, "ipvsadm", "-A", "-t", "198.51.100.0:20000", "-s", "wrr")
    prepared(netns).prepare()
    assert in_netns(netns, "ipvsadm", "-S", "-n").strip() == ""
    assert in_netns(netns, "sysctl", "-n", "net.ipv4.vs.conntrack").strip() == "1"


def test_a_blacklisted_ip_vs_is_named_by_backends_and_by_the_start(
    unloaded: None, netns: str
) -> None:
    BLACKLIST.write_text("blacklist ip_vs\n")
    status = ipvs_status()
    assert status["status"] == "requirements missing", status
    assert (
        f"kernel module 'ip_vs' is not loaded and is blacklisted in {BLACKLIST}"
        in (status["detail"])
    )
    # What it says is so: asked for the IPVS netlink family, the kernel does not load it.
    with pytest.raises(BackendError, match="no generic netlink family 'IPVS'") as caught:
        IpvsKernel(netns).dump(V4)
    assert f"blacklisted in {BLACKLIST}" in str(caught.value)
    assert not loaded("ip_vs")
    run = kubeplex("run", *RUN, "--netns", netns, *SOURCES, "--once", timeout=600)
    assert run.returncode != 0
    assert f"kernel module 'ip_vs' is not loaded and is blacklisted in {BLACKLIST}" in run.stderr
    assert "Traceback" not in run.stderr, run.stderr


def test_a_missing_modules_folder_is_named_by_backends_and_by_prepare(
    unloaded: None, netns: str
) -> None:
    subprocess.run(["mount", "-t", "tmpfs", "none", str(MODULES)], check=True)
    gone = f"{MODULES / platform.release()}, where it would be loaded from, does not exist"
    status = ipvs_status()
    assert status["status"] == "requirements missing", status
    assert f"kernel module 'ip_vs' is not loaded, and {gone}" in status["detail"]
    with pytest.raises(BackendError) as caught:
        prepared(netns).prepare()
    message = str(caught.value)
    assert message.startswith("ipvs mode cannot start: "), message
    assert f"kernel module 'ip_vs' is not loaded, and {gone}" in message
    assert not loaded("ip_vs")
