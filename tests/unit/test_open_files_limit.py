"""At start the proxy raises its soft descriptor limit to the hard one, as Go programs do."""

from __future__ import annotations

import resource
import shutil
import subprocess
import sys

import pytest

SCRIPT = (
    "import resource\n"
    "from kubeplex.core.daemon.process import raise_open_files_limit\n"
    "print(*raise_open_files_limit(), *resource.getrlimit(resource.RLIMIT_NOFILE))\n"
)


@pytest.mark.skipif(not shutil.which("prlimit"), reason="needs util-linux's prlimit")
def test_the_soft_limit_is_raised_to_the_hard_one() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard <= 1024:
        pytest.skip(f"the hard limit is {hard}: nothing to raise")
    out = subprocess.run(
        ["prlimit", f"--nofile=1024:{hard}", sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert [int(n) for n in out] == [1024, hard, hard, hard]
