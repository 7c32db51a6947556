#!/usr/bin/env bash
# Builds kubeplex's container image, with no container daemon and no registry but the package
# registries: a minimal Debian root filesystem (mmdebstrap, this machine's release and apt
# sources), the kernel tools every mode drives, Python and the kubeplex wheel with its
# dependencies (wheels only: no compiler enters the image), packed as an OCI image layout and an
# oci-archive tarball. Containerfile builds the same image with Docker or Podman.
#
# The packer is umoci: it writes an OCI image layout directly from a directory tree, needs no
# daemon or container storage (unlike buildah), and is the Open Container Initiative's own tool,
# packaged in Debian. skopeo then copies the result anywhere (see charts/kubeplex/README.md).
#
#   scripts/build-image.sh [--out DIR] [--name NAME] [--tag TAG] [--sources FILE]...
#
#   --out DIR       output directory (default build/image): DIR/oci (OCI layout, tag TAG) and
#                   DIR/kubeplex-TAG.oci.tar (the same as an oci-archive)
#   --name NAME     image name recorded for `ctr import` / `kind load` (default
#                   ghcr.io/kubeplex/kubeplex, the chart's image.repository)
#   --tag TAG       image tag (default: the version in pyproject.toml, the chart's appVersion)
#   --sources FILE  apt sources for the root filesystem, repeatable (default: this machine's
#                   /etc/apt/sources.list and sources.list.d/*.{list,sources}); this machine's
#                   /etc/apt/apt.conf.d settings apply too, so a proxy or mirror keeps working.
#
# Needs root (mmdebstrap's root mode and a chroot for pip), mmdebstrap, umoci and python3 with
# pip; scripts/setup.sh installs the tools when KUBEPLEX_IMAGE_TOOLS=1. The ebpf mode's programs
# are compiled into the wheel first (scripts/build-bpf.sh: clang and libbpf's headers, which
# KUBEPLEX_BPF_TOOLS=1 installs).
set -euo pipefail
cd "$(dirname "$0")/.."

out=build/image
name=ghcr.io/kubeplex/kubeplex
tag=""
sources=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --name) name=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    --sources) sources+=("$2"); shift 2 ;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-image: unknown option $1" >&2; exit 2 ;;
  esac
done

die() { echo "build-image: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "needs root (mmdebstrap root mode, chroot)"
for tool in mmdebstrap umoci; do
  command -v "$tool" >/dev/null || die "$tool is missing (KUBEPLEX_IMAGE_TOOLS=1 bash scripts/setup.sh)"
done
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
"$PYTHON" -m pip --version >/dev/null || die "$PYTHON has no pip"
command -v clang >/dev/null && [ -f /usr/include/bpf/bpf_helpers.h ] \
  || die "clang and libbpf's headers are missing (KUBEPLEX_BPF_TOOLS=1 bash scripts/setup.sh)"

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)
tag=${tag:-$version}
# The host's release and architecture: the wheels downloaded below must fit its Python.
suite=$(. /etc/os-release && echo "${VERSION_CODENAME:?no VERSION_CODENAME in /etc/os-release}")
arch=$(dpkg --print-architecture)
case "$arch" in
  amd64) wheel_arch=x86_64 ;;
  arm64) wheel_arch=aarch64 ;;
  *) die "no wheel platform known for $arch" ;;
esac

if [ ${#sources[@]} -eq 0 ]; then
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    # A file of comments only would add nothing; mmdebstrap pastes each file given.
    [ -f "$f" ] && grep -qv '^[[:space:]]*\(#\|$\)' "$f" && sources+=("$f")
  done
fi
[ ${#sources[@]} -gt 0 ] || die "no apt sources found; pass --sources FILE"
aptopts=()
for f in /etc/apt/apt.conf.d/*; do
  # Hooks run host programs that the new root filesystem lacks; the rest (proxies, mirrors,
  # index and validity settings) is what fetching needs.
  [ -f "$f" ] && ! grep -qE 'Invoke|Pre-Install-Pkgs' "$f" && aptopts+=("--aptopt=$f")
done

# What the modes run: iptables (both its legacy and nft variants), nft, conntrack, ip, sysctl
# (procps), nfacct, modprobe (kmod); ipset and ipvsadm for operators of the ipvs mode (which
# itself talks netlink and runs neither); libbpf1, which the ebpf mode loads its programs with;
# and Python for kubeplex itself.
packages=python3,iptables,nftables,ipset,ipvsadm,conntrack,iproute2,procps,nfacct,kmod,libbpf1

start=$(date +%s)
mkdir -p "$out"
out=$(cd "$out" && pwd)
stage="$out/stage"
rm -rf "$stage" "$out/oci" "$out"/kubeplex-*.oci.tar
trap 'rm -rf "$stage"' EXIT  # the staged wheels and root filesystem, even after a failure
mkdir -p "$stage/wheels" "$stage/pip"

echo "build-image: the ebpf programs, then wheels" >&2
bash scripts/build-bpf.sh  # into backends/ebpf/objects/, which the wheel carries
"$PYTHON" -m pip wheel -q --no-deps -w "$stage/wheels" .
# Binary wheels for the image's Python (the release's python3, same minor as checked below).
pyver=$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
wheel_opts=(--only-binary=:all: --implementation cp --python-version "$pyver"
  --platform "manylinux_2_28_$wheel_arch" --platform "manylinux_2_17_$wheel_arch"
  --platform "manylinux2014_$wheel_arch" --platform "manylinux1_$wheel_arch")
"$PYTHON" -m pip download -q "${wheel_opts[@]}" -d "$stage/wheels" "$stage"/wheels/kubeplex-*.whl
"$PYTHON" -m pip download -q --only-binary=:all: --no-deps -d "$stage/pip" pip

echo "build-image: root filesystem ($suite, $arch)" >&2
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}
rootfs="$stage/bundle/rootfs"
mkdir -p "$stage/bundle"
# The dpkg filters are debian:*-slim's: no docs (but copyrights), man pages or translations.
# /usr is merged the way debootstrap and the slim images do it (directory symlinks), not by the
# usrmerge package, which would bring Perl along.
mmdebstrap --quiet --mode=root --variant=minbase --arch="$arch" --include="$packages" \
  --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
  "${aptopts[@]}" \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/locale/locale.alias' \
  --dpkgopt='path-exclude=/usr/share/lintian/*' \
  --customize-hook="copy-in $stage/wheels $stage/pip $PWD/image /tmp" \
  --customize-hook="chroot \"\$1\" sh /tmp/image/rootfs-setup.sh $pyver" \
  --customize-hook='rm -f "$1"/etc/apt/apt.conf.d/99mmdebstrap "$1"/etc/apt/sources.list.d/* \
    "$1"/etc/machine-id "$1"/etc/hostname "$1"/etc/resolv.conf && : >"$1"/etc/apt/sources.list' \
  "$suite" "$rootfs" "${sources[@]}"

uncompressed=$(du -sb "$rootfs" | cut -f1)
# kube-proxy's own command line when the wheel declares it (kubeadm's DaemonSet calls it).
entry=/usr/local/bin/kube-proxy
[ -e "$rootfs$entry" ] || entry=/usr/local/bin/kubeplex

echo "build-image: OCI image $name:$tag" >&2
umoci init --layout "$out/oci"
umoci new --image "$out/oci:$tag"
# An empty bundle gives repack the base to diff against: the root filesystem becomes one layer.
umoci unpack --image "$out/oci:$tag" "$stage/empty"
mv "$stage/empty/umoci.json" "$stage/empty/sha256_"*.mtree "$stage/empty/config.json" "$stage/bundle/"
umoci repack --image "$out/oci:$tag" "$stage/bundle"
umoci config --image "$out/oci:$tag" --os linux --architecture "$arch" \
  --author "kubeplex" --no-history \
  --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --config.entrypoint "$entry" --config.workingdir / \
  --config.label "org.opencontainers.image.title=kubeplex" \
  --config.label "org.opencontainers.image.version=$version" \
  --config.label "org.opencontainers.image.licenses=Apache-2.0"
umoci gc --layout "$out/oci"
# containerd (ctr import, kind load image-archive) names the image after this annotation.
"$PYTHON" - "$out/oci/index.json" "$name:$tag" <<'EOF'
import json, sys
path, ref = sys.argv[1], sys.argv[2]
with open(path) as f:
    index = json.load(f)
for m in index["manifests"]:
    m.setdefault("annotations", {})["io.containerd.image.name"] = ref
with open(path, "w") as f:
    json.dump(index, f, separators=(",", ":"))
EOF
tar -C "$out/oci" --sort=name --numeric-owner --owner=0 --group=0 \
  --mtime="@$SOURCE_DATE_EPOCH" -cf "$out/kubeplex-$tag.oci.tar" .

compressed=$(find "$out/oci/blobs" -type f -printf '%s\n' | awk '{s += $1} END {print s}')
end=$(date +%s)
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
{
  echo "image:        $name:$tag ($out/oci, $out/kubeplex-$tag.oci.tar)"
  echo "uncompressed: $(mib "$uncompressed") (root filesystem)"
  echo "compressed:   $(mib "$compressed") (layer, config and manifest blobs)"
  echo "build time:   $((end - start)) s"
} | tee "$out/summary.txt"
