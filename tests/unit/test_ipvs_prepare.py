"""The ipvs mode's start (``IpvsBackend.prepare``) on a kernel where ip_vs is loadable but not
loaded: upstream's probe virtual service loads it (and the scheduler's module) before the
net.ipv4.vs sysctls, which exist only once it is loaded, are written; a scheduler the kernel
cannot load stops the start with a message naming it, before anything is written."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from kubeplex.backends.ipvs import PROBE, IpvsBackend
from kubeplex.backends.ipvs.plan import Op, VirtualServer
from kubeplex.core.config.kubeproxy import with_overrides
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import BackendContext
from kubeplex.core.model.errors import BackendError
from kubeplex.core.model.types import IPFamily
from kubeplex.testing.dataplane import lab_config
from kubeplex.testing.fakes import FakeIpvs

V4 = IPFamily.IPv4
NODE = "kind-worker"
PROBE_LINES = ["ipvsadm -A -t 198.51.100.0:20000 -s rr", "ipvsadm -D -t 198.51.100.0:20000"]


class NotYetLoaded(FakeIpvs):
    """A kernel whose ip_vs is loadable but not loaded: /proc/sys/net/ipv4/vs appears once an
    IPVS request has made the kernel load it."""

    loaded = False

    def send(self, family: IPFamily, ops: Sequence[Op]) -> int:
        self.loaded = self.loaded or any(o.kind.endswith(("-service", "-real")) for o in ops)
        return super().send(family, ops)

    def sysctl(self, key: str, value: str) -> None:
        if key.startswith("net.ipv4.vs.") and not self.loaded:
            path = "/proc/sys/" + key.replace(".", "/")
            raise BackendError(f"sysctl {key}={value}: [Errno 2] No such file: {path!r}")
        super().sysctl(key, value)


def backend(kernel: FakeIpvs, scheduler: str = "") -> IpvsBackend:
    cfg = with_overrides(lab_config("ipvs"), mode="ipvs", known_modes=plugins.known_modes())
    cfg = dataclasses.replace(cfg, ipvs=dataclasses.replace(cfg.ipvs, scheduler=scheduler))
    return IpvsBackend(BackendContext(cfg, NODE, (V4,), kernel=kernel))


def test_the_probe_loads_ipvs_before_the_sysctls_are_written() -> None:
    kernel = NotYetLoaded()
    backend(kernel).prepare()
    assert kernel.sent == PROBE_LINES
    assert kernel.sysctls["net.ipv4.vs.conntrack"] == "1"
    assert kernel.sysctls["net.ipv4.vs.expire_nodest_conn"] == "1"
    assert kernel.dump(V4).virtual == {}  # the probe is gone


def test_a_scheduler_the_kernel_cannot_load_stops_the_start_naming_it() -> None:
    kernel = FakeIpvs(schedulers=frozenset({"rr"}))
    with pytest.raises(BackendError) as caught:
        backend(kernel, scheduler="nosuch").prepare()
    message = str(caught.value)
    assert message.startswith("ipvs mode cannot start: the probe virtual service with ")
    assert "scheduler 'nosuch' was refused" in message
    assert "kernel module 'ip_vs_nosuch' is not loaded, built in or loadable" in message
    assert kernel.sysctls == {}  # nothing written
    assert kernel.dump(V4).virtual == {}


def test_a_probe_left_behind_is_removed_and_the_start_goes_on() -> None:
    kernel = FakeIpvs()
    kernel.send(V4, [Op("add-service", V4, service=VirtualServer(PROBE))])
    backend(kernel).prepare()
    assert kernel.dump(V4).virtual == {}
    assert kernel.sysctls["net.ipv4.vs.conntrack"] == "1"
