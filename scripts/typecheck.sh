#!/usr/bin/env bash
# mypy --strict over kubeplex.core, kubeplex.backends and kubeplex.testing. The folders are
# mapped to those names by the packaging, which mypy cannot follow, so check them through a
# throw-away tree of symlinks named like the packages.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
tree="$(mktemp -d)"
trap 'rm -rf "$tree"' EXIT
mkdir -p "$tree/kubeplex"
for part in core backends testing; do ln -s "$root/$part" "$tree/kubeplex/$part"; done
cd "$tree"
MYPY_CACHE_DIR="$root/.mypy_cache" "$root/.venv/bin/mypy" --config-file "$root/pyproject.toml" \
  -p kubeplex.core -p kubeplex.backends -p kubeplex.testing
