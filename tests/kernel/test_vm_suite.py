"""The guest suite (tests/vm): one VM boot runs all of it on a real kernel with IPVS.

The host's kernel has no IPVS, so tests/vm skips here; this test boots the test VM
(``kubeplex.testing.vm``) once, runs pytest on that folder inside, and reads the junit report
the guest wrote into the shared project folder. Every guest failure or error is named in the
assertion. Skips where the VM cannot start (no qemu, busybox-static, kmod or kernel package).
"""

from __future__ import annotations

import io
import os
import shutil
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kubeplex.testing.vm import run_in_vm, vm_unavailable

pytestmark = pytest.mark.kernel

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 20 * 60.0  # bounded: a wedged guest must not eat CI's budget
SMOKE = "test_guest_kernel.py"
# Variables the guest run keeps from the host (the suite's own knobs).
PASSED_ENV = ("HYPOTHESIS_PROFILE", "CI", "KUBEPLEX_IMAGE")


@dataclass(frozen=True)
class Outcome:
    name: str
    state: str  # passed, failed, error, skipped
    message: str = ""


def junit_outcomes(path: Path) -> list[Outcome]:
    """Each test case of a pytest junit report with its outcome."""
    outcomes = []
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        state, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                state = {"failure": "failed"}.get(child.tag, child.tag)
                message = (child.get("message") or child.text or "").strip()
                break
        outcomes.append(Outcome(name, state, message))
    return outcomes


@pytest.fixture
def report_dir() -> Iterator[Path]:
    """A folder in the project's (ignored) build/ (so the guest writes where the host reads),
    removed after."""
    (REPO / "build").mkdir(exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="vm-suite-", dir=REPO / "build"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_guest_suite_passes_in_one_boot(
    report_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reason = vm_unavailable()
    if reason:
        pytest.skip(f"no test VM here: {reason}")
    junit = report_dir / "guest.xml"
    output = io.BytesIO()
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/vm"]
    argv += [f"--junitxml={junit}", "-o", "junit_family=xunit1"]
    env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
    result = run_in_vm(argv, timeout=TIMEOUT, env=env, cwd=REPO, share=REPO, out=output)
    text = output.getvalue().decode(errors="replace")
    tail = text[-4000:]
    boot = f"{result.boot_seconds:.1f} s" if result.boot_seconds is not None else "-"
    ran = f"{result.command_seconds:.1f} s" if result.command_seconds is not None else "-"
    outcomes = junit_outcomes(junit) if junit.exists() else []
    tally = ", ".join(f"{n} {st}" for st, n in sorted(Counter(o.state for o in outcomes).items()))
    with capsys.disabled():
        print(f"\nvm suite: kernel {result.release}, boot {boot}, guest tests {ran} ({tally})")
    console = f"\n--- end of the guest console:\n{result.log_tail}"
    assert not result.timed_out, f"{result.message}\n{tail}{console}"
    assert result.message is None, f"{result.message}\n{tail}{console}"
    assert junit.exists(), f"no junit report (status {result.returncode}):\n{tail}"
    bad = [o for o in outcomes if o.state in ("failed", "error")]
    assert not bad, "guest tests failed:\n" + "\n".join(
        f"  {o.state}: {o.name}: {o.message[:500]}" for o in bad
    )
    assert result.returncode == 0, f"guest pytest exited {result.returncode}:\n{tail}"
    smoke = [o for o in outcomes if SMOKE.removesuffix(".py") in o.name]
    assert smoke and all(o.state == "passed" for o in smoke), (
        f"the guest smoke test did not run: {smoke}\n{tail}"
    )
