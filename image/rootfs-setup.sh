#!/bin/sh
# Run inside the image's root filesystem, as root, once the Debian packages are in (by
# scripts/build-image.sh in a chroot, or by the Containerfile's RUN): installs kubeplex and its
# dependencies from the wheels in /tmp/wheels with the pip wheel in /tmp/pip (pip runs from its
# wheel, so pip itself never enters the image), makes image/iptables-wrapper the iptables
# commands, and removes what only the build needed.
#
#   sh /tmp/image/rootfs-setup.sh PYTHON_VERSION   (the X.Y the wheels were downloaded for)
set -eu

want=$1
have=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$have" = "$want" ] || { echo "rootfs-setup: wheels are for Python $want, image has $have" >&2; exit 1; }

# Wheels only (no compiler here); the image's python3 is kubeplex's alone, hence the system
# site (/usr/local) despite Debian's externally-managed marker.
pip_wheel=$(echo /tmp/pip/pip-*.whl)
python3 "$pip_wheel/pip" install --isolated --quiet --no-index --find-links /tmp/wheels \
    --only-binary=:all: --no-cache-dir --break-system-packages --root-user-action=ignore \
    --disable-pip-version-check --no-warn-script-location /tmp/wheels/kubeplex-*.whl

# No test suites; no bytecode for kubernetes' asyncio client, which kubeplex never imports.
site=$(python3 -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
find "$site" -mindepth 2 -maxdepth 2 -type d -name tests -exec rm -rf {} +
find "$site/kubernetes/aio" -name __pycache__ -type d -exec rm -rf {} +

install -m 0755 /tmp/image/iptables-wrapper /usr/sbin/iptables-wrapper
/usr/sbin/iptables-wrapper install
kubeplex version >/dev/null
# The ebpf mode's compiled programs travel in the wheel (scripts/build-bpf.sh ran first).
python3 -c 'from kubeplex.backends.ebpf.loader import OBJECT_PATH as o; assert o.is_file(), o'
# The methods of kubeplex's dataclasses compiled once, here: a pod's first start compiles none.
python3 -m kubeplex.core.cli.warm_cache

rm -rf /tmp/wheels /tmp/pip /tmp/image /root/.cache \
    /var/lib/apt/lists/* /var/cache/apt/* /var/cache/debconf/*-old \
    /var/log/*.log /var/log/apt/*
