"""What runs inside the guest after ``switch_root``: the second stage and the command script.

Both are written into the run's control folder (shared with the guest at ``GUEST_CTL``), and
the guest reports back there too: ``started`` (its uptime when the command starts) and
``status`` (the command's exit status), after a ``sync`` so the share's written files are on
the host before the host reads them.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from kubeplex.testing.vm.initramfs import GUEST_CTL

# What IPVS tests need loaded up front; the rest (xt_*, nft_*) the kernel autoloads through
# the guest's modprobe. Names the kernel does not have are left out by the host.
GUEST_MODULES = (
    "ip_vs",
    "ip_vs_rr",
    "ip_vs_wrr",
    "ip_vs_lc",
    "ip_vs_wlc",
    "ip_vs_sh",
    "ip_vs_dh",
    "ip_vs_sed",
    "ip_vs_nq",
    "ip_vs_mh",
    "nf_conntrack",
    "nf_nat",
    "xt_ipvs",
    "dummy",
    "veth",
    "ip_set",
    "xt_set",
    "ip_set_hash_ip",
    "ip_set_hash_ipport",
    "ip_set_hash_ipportip",
    "ip_set_hash_ipportnet",
    "ip_set_bitmap_port",
    "nf_tables",
    "nft_compat",
    "iptable_nat",
    "iptable_filter",
    "xt_MASQUERADE",
    "xt_conntrack",
    "xt_mark",
    "xt_comment",
    "xt_addrtype",
)

#: The serial ports: the kernel's console (kept as the log) and the command's output.
CONSOLE_TTY = "/dev/ttyS0"
OUTPUT_TTY = "/dev/ttyS1"

STAGE2_SCRIPT = f"""#!/bin/sh
# Stage 2 (the host's own root, read-only under a tmpfs overlay): finish /dev, make the
# kernel's modules reachable, run the command, report its status, power off.
ctl={GUEST_CTL}
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
say() {{ echo "kubeplex-vm: $*" > {CONSOLE_TTY}; }}
# The power-off is asynchronous: wait for it (sleep fails once the disks are gone).
off() {{ sync; echo o > /proc/sysrq-trigger; while :; do sleep 1; done 2> /dev/null; }}
# devtmpfs has none of these: bash process substitution and multiprocessing need them.
ln -sf /proc/self/fd /dev/fd
ln -sf /proc/self/fd/0 /dev/stdin
ln -sf /proc/self/fd/1 /dev/stdout
ln -sf /proc/self/fd/2 /dev/stderr
mkdir -p /dev/shm /dev/pts
mount -t tmpfs -o mode=1777,nosuid,nodev shm /dev/shm
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /dev/pts
release="$(uname -r)"
mkdir -p "/lib/modules/$release" || {{ say "no /lib/modules/$release"; off; }}
mount --bind "$(cat $ctl/modules_dir)" "/lib/modules/$release" || {{ say "modules"; off; }}
hostname kubeplex-vm
ip link set lo up
modules="$(cat $ctl/modprobe)"
if ! modprobe -a $modules 2> {CONSOLE_TTY}; then
  for m in $modules; do modprobe "$m" 2> {CONSOLE_TTY} || say "modprobe $m failed"; done
fi
stty -F {OUTPUT_TTY} raw -echo 2> {CONSOLE_TTY}
cut -d' ' -f1 /proc/uptime > $ctl/started
say "the command starts at $(cat $ctl/started) s of uptime"
/bin/sh $ctl/command.sh < /dev/null > {OUTPUT_TTY} 2>&1
rc=$?
sync
echo "$rc" > $ctl/status.part && mv $ctl/status.part $ctl/status
off
"""


def command_script(argv: Sequence[str], env: Mapping[str, str], cwd: str) -> str:
    """The command, run in ``cwd`` with exactly ``env`` (a shell script, quoted safely)."""
    if not argv:
        raise ValueError("no command given")
    assigns = " ".join(shlex.quote(f"{k}={v}") for k, v in sorted(env.items()))
    return (
        f"#!/bin/sh\ncd {shlex.quote(cwd)} || exit 126\nexec env -i {assigns} {shlex.join(argv)}\n"
    )
