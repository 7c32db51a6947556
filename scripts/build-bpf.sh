#!/usr/bin/env bash
# Compiles the ebpf mode's programs (bpf/*.c) into backends/ebpf/objects/, which the package
# carries. Needs clang and libbpf's headers (scripts/setup.sh installs them with
# KUBEPLEX_BPF_TOOLS=1); asm/types.h is under the multiarch include folder.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$root/backends/ebpf/objects"
mkdir -p "$out"
multiarch="$(gcc -print-multiarch 2>/dev/null || echo "$(uname -m)-linux-gnu")"
clang -O2 -g -Wall -Werror -target bpf -I"/usr/include/$multiarch" -I"$root/bpf" \
  -c "$root/bpf/kubeplex_lb.c" -o "$out/kubeplex_lb.bpf.o"
