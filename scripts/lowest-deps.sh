#!/usr/bin/env bash
# Tests kubeplex against the lowest release of every dependency pyproject.toml declares, so the
# declared ranges stay true: a virtual environment (.venv-lowest) with each `name>=X` pinned to
# X, kubeplex installed from this tree, and the tests that exercise the dependencies (the unit
# tests, the API client against the test server, and the kernel tests that drive pyroute2 and
# the daemon). Run by .ci/run after scripts/setup.sh; safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=.venv-lowest
# Every runtime dependency as name==lowest; a dependency declared without a lower bound fails
# here, as the range would say nothing a test could hold to.
.venv/bin/python - >"$venv.constraints" <<'EOF'
import re
import sys
import tomllib

with open("pyproject.toml", "rb") as f:
    deps = tomllib.load(f)["project"]["dependencies"]
for dep in deps:
    m = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9][A-Za-z0-9.]*)(,<.*)?", dep.replace(" ", ""))
    if m is None:
        sys.exit(f"lowest-deps: {dep!r} has no lower bound of the form name>=X")
    print(f"{m[1]}=={m[2]}")
EOF

if [ ! -x "$venv/bin/python" ]; then
  "${PYTHON:-python3}" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
"${pip[@]}" -c "$venv.constraints" -e '.[dev]'
"${pip[@]}" -c "$venv.constraints" tests/plugins/kubeplex-example-backend
# What was installed is what the constraints say, or pip would have refused: show it.
"$venv/bin/python" -m pip freeze --disable-pip-version-check \
  | grep -iE "^($(cut -d= -f1 "$venv.constraints" | paste -sd'|'))==" >&2

"$venv/bin/python" -m pytest -q -p no:cacheprovider tests/unit tests/api \
  tests/kernel/test_daemon_e2e.py tests/kernel/test_conntrack_kernel.py \
  tests/kernel/test_fakes_kernel.py tests/kernel/test_nftables_hooks_kernel.py
