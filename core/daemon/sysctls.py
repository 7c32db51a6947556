"""The ``conntrack.*`` settings of a KubeProxyConfiguration, written to the kernel.

As upstream's pkg/proxy/conntrack/sysctls.go:

* ``nf_conntrack_max`` = max(maxPerCore x CPUs, min), only if maxPerCore > 0; then the
  conntrack hash table is grown to nf_conntrack_max / 4 buckets if it is smaller
  (``/sys/module/nf_conntrack/parameters/hashsize``, a host-wide module parameter);
* ``nf_conntrack_tcp_timeout_established`` ← tcpEstablishedTimeout,
  ``nf_conntrack_tcp_timeout_close_wait`` ← tcpCloseWaitTimeout,
  ``nf_conntrack_udp_timeout`` ← udpTimeout, ``nf_conntrack_udp_timeout_stream`` ←
  udpStreamTimeout (whole seconds), each only if > 0;
* ``nf_conntrack_tcp_be_liberal`` ← 1 only if tcpBeLiberal is true.

A key is written only if its current value differs. Every refusal is reported with the key,
the value, the field it came from and the errno. With ``netns`` the keys of that network
namespace are written (from a short-lived thread that joined the namespace); the kernel keeps
``nf_conntrack_max`` read-only outside the initial namespace, and the hash size is never
touched from a namespace, because it is shared by the whole host.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from pathlib import Path

from kubeplex.core.config.kubeproxy import KubeProxyConntrackConfiguration
from kubeplex.core.dataplane.netns import run_in_netns
from kubeplex.core.model.errors import KubeplexError

PROC_SYS = Path("/proc/sys")
HASHSIZE = Path("/sys/module/nf_conntrack/parameters/hashsize")

NF_CONNTRACK_MAX = "net/netfilter/nf_conntrack_max"
TCP_ESTABLISHED = "net/netfilter/nf_conntrack_tcp_timeout_established"
TCP_CLOSE_WAIT = "net/netfilter/nf_conntrack_tcp_timeout_close_wait"
TCP_BE_LIBERAL = "net/netfilter/nf_conntrack_tcp_be_liberal"
UDP_TIMEOUT = "net/netfilter/nf_conntrack_udp_timeout"
UDP_STREAM_TIMEOUT = "net/netfilter/nf_conntrack_udp_timeout_stream"


_HINTS = {
    errno.EACCES: "the key is read-only here",
    errno.EPERM: "not permitted (needs CAP_NET_ADMIN in the namespace's owner)",
    errno.EROFS: "/proc/sys (or /sys) is mounted read-only, as in an unprivileged container",
    errno.ENOENT: "no such key (is the nf_conntrack module loaded?)",
    errno.EINVAL: "the kernel rejected the value",
}


@dataclass(frozen=True)
class SysctlSetting:
    """One value to write: ``key`` is relative to /proc/sys, with slashes."""

    key: str
    value: int
    #: The configuration field(s) it comes from, for messages.
    source: str

    @property
    def name(self) -> str:
        """The dotted sysctl name (``net.netfilter.nf_conntrack_max``)."""
        return self.key.replace("/", ".")


class SysctlError(KubeplexError):
    """The kernel refused a write: which key, which value, why (errno)."""

    def __init__(
        self, name: str, value: int, source: str, err: OSError, netns: str | None = None
    ) -> None:
        self.name = name
        self.value = value
        self.source = source
        self.errno = err.errno or 0
        self.netns = netns
        code = errno.errorcode.get(self.errno, str(self.errno))
        where = f" in network namespace {netns}" if netns else ""
        hint = _HINTS.get(self.errno, "")
        if self.errno == errno.EACCES and netns and name == "net.netfilter.nf_conntrack_max":
            hint = "the kernel allows nf_conntrack_max to be set only in the initial namespace"
        super().__init__(
            f"cannot set {name}={value}{where} (from {source}): "
            f"{err.strerror or err} ({code}, errno {self.errno})" + (f"; {hint}" if hint else "")
        )


@dataclass
class SysctlReport:
    #: (name, value before, value written)
    changed: list[tuple[str, int | None, int]] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    #: (name or path, why it was not attempted)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    errors: list[SysctlError] = field(default_factory=list)

    def raise_for_errors(self) -> None:
        """Raise the first refusal (all of them in the message if there are several)."""
        if len(self.errors) == 1:
            raise self.errors[0]
        if self.errors:
            first = self.errors[0]
            others = "; ".join(str(e) for e in self.errors[1:])
            raise SysctlError(
                first.name, first.value, first.source, OSError(first.errno, f"{first}; {others}")
            )


def detect_cpus() -> int:
    """Logical CPUs of the machine (upstream reads the topology in /sys, not the affinity)."""
    return os.cpu_count() or len(os.sched_getaffinity(0)) or 1


def conntrack_max(ct: KubeProxyConntrackConfiguration, cpus: int) -> int:
    """max(maxPerCore x cpus, min); 0 (leave it alone) unless maxPerCore > 0."""
    if ct.max_per_core <= 0:
        return 0
    return max(ct.max_per_core * cpus, max(ct.min, 0))


def conntrack_settings(
    ct: KubeProxyConntrackConfiguration, cpus: int | None = None
) -> list[SysctlSetting]:
    """What upstream would write for this configuration, in its order (zero/unset skipped)."""
    cpus = cpus if cpus is not None else detect_cpus()
    out: list[SysctlSetting] = []
    limit = conntrack_max(ct, cpus)
    if limit > 0:
        source = f"conntrack.maxPerCore {ct.max_per_core} x {cpus} CPUs, conntrack.min {ct.min}"
        out.append(SysctlSetting(NF_CONNTRACK_MAX, limit, source))
    for key, seconds, name in (
        (TCP_ESTABLISHED, ct.tcp_established_timeout, "conntrack.tcpEstablishedTimeout"),
        (TCP_CLOSE_WAIT, ct.tcp_close_wait_timeout, "conntrack.tcpCloseWaitTimeout"),
    ):
        if seconds > 0:
            out.append(SysctlSetting(key, int(seconds), name))
    if ct.tcp_be_liberal:
        out.append(SysctlSetting(TCP_BE_LIBERAL, 1, "conntrack.tcpBeLiberal"))
    for key, seconds, name in (
        (UDP_TIMEOUT, ct.udp_timeout, "conntrack.udpTimeout"),
        (UDP_STREAM_TIMEOUT, ct.udp_stream_timeout, "conntrack.udpStreamTimeout"),
    ):
        if seconds > 0:
            out.append(SysctlSetting(key, int(seconds), name))
    return out


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _write_int(path: Path, value: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)  # as a shell redirection opens it
    try:
        os.write(fd, str(value).encode())
    finally:
        os.close(fd)


def write_sysctls(
    settings: list[SysctlSetting],
    *,
    netns: str | None = None,
    proc_sys: Path = PROC_SYS,
    hashsize: Path | None = HASHSIZE,
) -> SysctlReport:
    """Write ``settings`` (each only if it differs), then grow the hash size if needed."""
    report = SysctlReport()

    def grow_hashsize(s: SysctlSetting) -> None:
        if hashsize is None:
            return
        if netns is not None:
            report.skipped.append(
                (str(hashsize), "host-wide module parameter: not set for a netns")
            )
            return
        current = _read_int(hashsize)
        wanted = s.value // 4
        if current is not None and current >= wanted:
            report.unchanged.append(str(hashsize))
            return
        if not os.access(hashsize, os.W_OK):
            report.skipped.append((str(hashsize), "not writable here"))
            return
        try:
            _write_int(hashsize, wanted)
        except OSError as err:
            source = f"nf_conntrack_max {s.value} / 4"
            report.errors.append(SysctlError(str(hashsize), wanted, source, err, netns))
            return
        report.changed.append((str(hashsize), current, wanted))

    def work() -> None:
        for s in settings:
            path = proc_sys / s.key
            before = _read_int(path)
            if before == s.value:
                report.unchanged.append(s.name)
            else:
                try:
                    _write_int(path, s.value)
                except OSError as err:
                    report.errors.append(SysctlError(s.name, s.value, s.source, err, netns))
                    continue
                report.changed.append((s.name, before, s.value))
            if s.key == NF_CONNTRACK_MAX:
                grow_hashsize(s)  # upstream checks the table size whenever it sets the max

    if netns is None:
        work()
    else:
        run_in_netns(netns, work)
    return report


def apply_conntrack_sysctls(
    ct: KubeProxyConntrackConfiguration,
    *,
    netns: str | None = None,
    cpus: int | None = None,
    proc_sys: Path = PROC_SYS,
    hashsize: Path | None = HASHSIZE,
) -> SysctlReport:
    """Apply a configuration's ``conntrack`` section; refusals are in ``report.errors``.

    Upstream stops kube-proxy on the first refusal; call ``report.raise_for_errors()`` for
    that. Raises OSError only if ``netns`` cannot be entered (nothing is written then).
    """
    return write_sysctls(
        conntrack_settings(ct, cpus), netns=netns, proc_sys=proc_sys, hashsize=hashsize
    )
