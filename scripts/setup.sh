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

# The image build's tools (scripts/build-image.sh), when asked for: a machine without them
# still runs everything else, and the image's smoke test skips saying why.
if [ "${KUBEPLEX_IMAGE_TOOLS:-0}" = 1 ]; then
  image_tools=(mmdebstrap umoci)
  if ! command -v mmdebstrap >/dev/null || ! command -v umoci >/dev/null; then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    { $SUDO apt-get update -qq \
      && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
        "${image_tools[@]}" >/dev/null; } \
      || echo "setup: could not install ${image_tools[*]}: the image is not built here" >&2
  fi
fi

# The IPVS test VM's tools (kubeplex.testing.vm), when asked for: without them the guest
# suite (tests/vm, run by tests/kernel/test_vm_suite.py) skips saying why. The guest kernel is
# fetched by the VM runner itself (apt-get download, into its cache), so apt's lists must know it.
if [ "${KUBEPLEX_VM_TOOLS:-0}" = 1 ]; then
  # ipvsadm: what operators (and the IPVS benchmark's floor) read the guest's IPVS with.
  vm_tools=(qemu-system-x86 busybox-static kmod ipvsadm)
  vm_missing=()
  for p in "${vm_tools[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || vm_missing+=("$p")
  done
  kernel_known="$(apt-cache show --no-all-versions linux-image-amd64 linux-image-generic \
    2>/dev/null | sed -n '/^Depends:/p')"
  if [ ${#vm_missing[@]} -gt 0 ] || [ -z "$kernel_known" ]; then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    { $SUDO apt-get update -qq \
      && { [ ${#vm_missing[@]} -eq 0 ] \
        || DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
          "${vm_missing[@]}" >/dev/null; }; } \
      || echo "setup: could not install ${vm_missing[*]:-the package lists}: the IPVS VM tests skip" >&2
  fi
fi

# The ebpf mode's tools, when asked for: clang and libbpf's headers compile its programs
# (scripts/build-bpf.sh, into the package), bpftool is what operators and its tests read the
# attached programs with. Without them the mode's programs are missing and its tests skip.
if [ "${KUBEPLEX_BPF_TOOLS:-0}" = 1 ]; then
  bpf_tools=(clang libbpf-dev bpftool)
  bpf_missing=()
  for p in "${bpf_tools[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || bpf_missing+=("$p")
  done
  if [ ${#bpf_missing[@]} -gt 0 ]; then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    { $SUDO apt-get update -qq \
      && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
        "${bpf_missing[@]}" >/dev/null; } \
      || echo "setup: could not install ${bpf_missing[*]}: the ebpf programs are not built" >&2
  fi
  if command -v clang >/dev/null && [ -f /usr/include/bpf/bpf_helpers.h ]; then
    bash scripts/build-bpf.sh
  fi
fi

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]'
.venv/bin/python -m pip install -q --disable-pip-version-check tests/plugins/kubeplex-example-backend
