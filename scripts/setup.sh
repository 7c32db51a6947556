#!/usr/bin/env bash
# Prepares a Debian/Ubuntu machine for kubeplex: the kernel tools it drives and a virtual
# environment in .venv with kubeplex and its development tools. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(iptables nftables ipset conntrack iproute2 nfacct procps python3-venv)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]'
.venv/bin/python -m pip install -q --disable-pip-version-check tests/plugins/kubeplex-example-backend
