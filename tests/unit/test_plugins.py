"""Backends as plugins: the trust list (plugins.toml), loading and refusing, ``kubeplex
backends``, the conformance kit, and the example out-of-tree backend through its real entry
point (scripts/setup.sh installs tests/plugins/kubeplex-example-backend)."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from kits.plugins_kit import RECORDING, kubeplex, own_trust_list, require_example, write_trust

from kubeplex.core.config.kubeproxy import default_config
from kubeplex.core.daemon.proxier import Proxier
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import BackendContext
from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.errors import InvalidObject
from kubeplex.core.model.graph import ProxyState
from kubeplex.core.model.types import IPFamily
from kubeplex.testing import conformance
from kubeplex.testing.conformance import (
    NEW_ENDPOINT,
    feed,
    kernel_tests,
    one_endpoint_more,
    render_contract_tests,
    seed_objects,
)

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "testing" / "lab"
EXAMPLE = ROOT / "tests" / "plugins" / "kubeplex-example-backend"


@pytest.fixture(autouse=True)
def _own_trust_list(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from own_trust_list(monkeypatch)


@pytest.fixture
def example() -> None:
    require_example()


def fake_plugin(root: Path, dist: str, mode: str, module: str, source: str) -> str:
    """A distribution on ``root`` (put it on PYTHONPATH) registering ``mode``."""
    root.mkdir(exist_ok=True)
    (root / f"{module}.py").write_text(source)
    info = root / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[kubeplex.backends]\n{mode} = {module}:Backend\n")
    return f"{module}:Backend"


MARKS_IMPORT = """\
import os, pathlib
pathlib.Path(os.environ["KUBEPLEX_TEST_MARKER"]).write_text("imported")
from kubeplex.core.dataplane.backend import Backend
"""


def render_args(mode: str) -> tuple[str, ...]:
    return ("render", "--proxy-mode", mode, "--manifests", str(LAB / "manifests"))


# ----------------------------------------------------------------------------- the trust list


def test_packaged_default_is_the_repository_file_and_matches_the_entry_points() -> None:
    top = ROOT / "plugins.toml"
    packaged = ROOT / "core" / "dataplane" / "plugins.toml"
    assert top.is_symlink() and top.resolve() == packaged.resolve()
    assert Path(plugins.packaged_trust_file()).resolve() == top.resolve()
    trust = plugins.load_trust_list()
    assert trust.origin == "packaged default"
    listed = {"ebpf", "iptables", "ipvs", "nftables", "kernelspace"}
    assert set(trust.backends) == listed  # not `recording`
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    registered = pyproject["project"]["entry-points"]["kubeplex.backends"]
    assert {m: e.entry_point for m, e in trust.backends.items()} == registered
    package_data = pyproject["tool"]["setuptools"]["package-data"]
    assert "plugins.toml" in package_data["kubeplex.core.dataplane"]


def test_which_trust_list_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    system = write_trust(tmp_path / "system.toml")
    env = write_trust(tmp_path / "env.toml")
    flag = write_trust(tmp_path / "flag.toml")
    assert plugins.trust_file()[1] == "packaged default"
    monkeypatch.setattr(plugins, "SYSTEM_TRUST_FILE", system)
    assert plugins.trust_file() == (str(system), "operator's file")
    monkeypatch.setenv(plugins.ENV_VAR, str(env))
    assert plugins.trust_file() == (str(env), f"${plugins.ENV_VAR}")
    with plugins.trusting(flag):
        assert plugins.trust_file() == (str(flag), "--plugins")
        assert plugins.load_trust_list().backends == {}  # a list replaces the default
    assert plugins.trust_file()[0] == str(env)


def test_a_bad_trust_list_names_every_bad_key(tmp_path: Path) -> None:
    bad = tmp_path / "plugins.toml"
    bad.write_text(
        "version = 1\nextra = 1\n"
        '[backends.one]\nentry-point = "not a target"\nplatform = "linux"\n'
        '[backends.two]\nentry-point = "a.b:C"\nplatform = "beos"\n'
        'capabilities = ["ok", "Not OK"]\nrequire = {}\n'
        '[backends.three]\nentry-point = "a:B"\n'
        '[backends.four]\nentry-point = "a:B"\nplatform = "linux"\n'
        'requires = { executables = "nft", min-kernel = "five", paths = ["proc/x"] }\n'
    )
    with pytest.raises(InvalidObject) as caught:
        plugins.load_trust_list(bad)
    paths = {e.path for e in caught.value.errors}
    assert paths == {
        "extra",
        "backends.one.entry-point",
        "backends.two.platform",
        "backends.two.capabilities",
        "backends.two.require",
        "backends.three.platform",
        "backends.four.requires.min-kernel",
        "backends.four.requires.paths",
    }, caught.value
    proc = kubeplex("backends", "--plugins", str(bad))
    assert proc.returncode == 3, proc.stderr
    assert "backends.two.platform: 'beos': not one of linux, windows" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_unreadable_or_world_writable_trust_list_is_refused(tmp_path: Path) -> None:
    proc = kubeplex(*render_args("iptables"), "--plugins", str(tmp_path / "missing.toml"))
    assert proc.returncode == 3
    assert "missing.toml (--plugins): cannot read: No such file or directory" in proc.stderr
    loose = write_trust(tmp_path / "loose.toml", with_default=True)
    loose.chmod(loose.stat().st_mode | stat.S_IWOTH)
    with pytest.raises(InvalidObject, match="writable by every user"):
        plugins.load_trust_list(loose)


def test_requirements_are_checked_against_this_node(tmp_path: Path) -> None:
    trust = plugins.parse_trust_list(
        'version = 1\n[backends.x]\nentry-point = "a:B"\nplatform = "linux"\n'
        "[backends.x.requires]\n"
        'executables = ["sh", "kubeplex-no-such-tool"]\n'
        'kernel-modules = ["kubeplex_no_such_module"]\n'
        'paths = ["/proc/self", "/proc/kubeplex-no-such-path"]\n'
        'min-kernel = "999.1"\n'
        '[backends.win]\nentry-point = "a:B"\nplatform = "windows"\n',
        "test",
    )
    x, win = trust.backends["x"], trust.backends["win"]
    missing = plugins.missing_on_node(x)
    assert missing[0] == "executable 'kubeplex-no-such-tool' not found in PATH"
    # What is missing depends on this node (its modules folder, or the module in it):
    # test_module_requirements has each case.
    assert missing[1].startswith("kernel module 'kubeplex_no_such_module' is not loaded, ")
    assert f"/lib/modules/{os.uname().release}" in missing[1]
    assert missing[2] == "/proc/kubeplex-no-such-path does not exist"
    assert missing[3].endswith("is older than the required 999.1"), missing
    assert plugins.missing_on_node(win) == ["platform windows required, this node runs linux"]
    assert plugins.missing_on_node(plugins.load_trust_list().backends["iptables"]) == []


# ------------------------------------------------------------------------ loading and refusing


def test_listed_plugin_loads_through_its_real_entry_point(tmp_path: Path, example: None) -> None:
    trust = plugins.load_trust_list(write_trust(tmp_path / "p.toml", RECORDING))
    backend = plugins.load_backend(
        "recording", BackendContext(default_config(), "node-a", (IPFamily.IPv4,)), trust
    )
    assert type(backend).__module__ == "kubeplex_example_backend"
    assert type(backend).__name__ == "RecordingBackend"
    [ep] = plugins.installed("recording")
    assert plugins.origin_of(ep) == "kubeplex-example-backend 0.1.0"


def test_listed_plugin_passes_the_render_contract(tmp_path: Path, example: None) -> None:
    trust = write_trust(tmp_path / "p.toml", RECORDING)
    results = conformance.run("recording", plugins_file=trust)
    # It has no kernel seam to watch apply through; everything else passes.
    assert [(r.name, r.outcome) for r in results if r.outcome != "pass"] == [
        ("apply-sends-inputs", "skip")
    ]
    assert len(results) == len(conformance.RENDER_CASES)
    [skipped] = [r for r in results if r.outcome == "skip"]
    assert skipped.detail == "the backend has no kernel seam (Backend.kernel is None)"


def test_conformance_command(tmp_path: Path, example: None) -> None:
    trust = write_trust(tmp_path / "p.toml", RECORDING)
    cmd = [sys.executable, "-m", "kubeplex.testing.conformance", "recording"]
    ok = subprocess.run([*cmd, "--plugins", str(trust)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "render  partial-smaller        PASS" in ok.stdout
    assert "render  cleanup-report         PASS" in ok.stdout
    assert ok.stdout.rstrip().endswith("11 passed, 0 failed, 1 skipped")
    refused = subprocess.run(cmd, capture_output=True, text=True)
    assert refused.returncode == 1
    assert "render/loads: fail: BackendRefused: backend 'recording' is installed" in refused.stdout
    assert "render/cleanup-report: fail: not run: the backend does not load" in refused.stdout


def test_unlisted_plugin_is_refused_and_never_imported(tmp_path: Path) -> None:
    marker = tmp_path / "imported"
    target = fake_plugin(tmp_path / "site", "kubeplex-marker", "marker", "kpx_marker", MARKS_IMPORT)
    trust = write_trust(tmp_path / "p.toml", with_default=True)
    env = {"KUBEPLEX_TEST_MARKER": str(marker)}
    for args in (
        render_args("marker"),
        ("run", "--proxy-mode", "marker", "--manifests", str(LAB / "manifests"), "--once"),
    ):
        proc = kubeplex(*args, "--plugins", str(trust), path=tmp_path / "site", env=env)
        assert proc.returncode == 4, proc.stderr
        assert (
            f"backend 'marker' is installed ({target} from kubeplex-marker 0.1) but not listed "
            f"in the trust list {trust} (--plugins)" in proc.stderr
        )
        assert "so it was not imported" in proc.stderr
        hint = f'To allow it, add to {trust}:\n\n[backends.marker]\nentry-point = "{target}"\n'
        assert hint in proc.stderr
        assert "Traceback" not in proc.stderr
    listing = kubeplex("backends", "--plugins", str(trust), path=tmp_path / "site", env=env)
    assert listing.returncode == 0, listing.stderr
    assert "marker: refused: not in the trust list" in listing.stdout
    assert not marker.exists(), "an unlisted plugin was imported"

    # The control: once listed (as the message says), the same module is imported.
    hint = proc.stderr.split("add to", 1)[1].split(":\n\n", 1)[1]
    allowed = write_trust(tmp_path / "allowed.toml", with_default=True)
    allowed.write_text(allowed.read_text() + hint)
    proc = kubeplex(
        *render_args("marker"), "--plugins", str(allowed), path=tmp_path / "site", env=env
    )
    assert marker.exists(), proc.stderr
    assert "backend 'marker' failed to start" in proc.stderr  # it is no real backend


def test_the_packaged_default_refuses_the_example_and_says_where_to_allow_it(
    tmp_path: Path, example: None
) -> None:
    proc = kubeplex(*render_args("recording"))
    assert proc.returncode == 4
    assert "not listed in the trust list" in proc.stderr
    assert "(packaged default)" in proc.stderr
    assert f"copy {plugins.packaged_trust_file()} to /etc/kubeplex/plugins.toml" in proc.stderr
    assert 'entry-point = "kubeplex_example_backend:RecordingBackend"' in proc.stderr
    # Doing what it says makes it load.
    copy = write_trust(tmp_path / "plugins.toml", with_default=True)
    copy.write_text(copy.read_text() + proc.stderr.split("and add:\n\n", 1)[1])
    proc = kubeplex(*render_args("recording"), "--plugins", str(copy))
    assert proc.returncode == 0, proc.stderr
    assert '"clusterIP":"10.96.88.59"' in proc.stdout


def test_another_package_claiming_a_listed_mode_is_never_imported(tmp_path: Path) -> None:
    marker = tmp_path / "imported"
    fake_plugin(tmp_path / "site", "kubeplex-impostor", "iptables", "kpx_impostor", MARKS_IMPORT)
    env = {"KUBEPLEX_TEST_MARKER": str(marker)}
    proc = kubeplex(*render_args("iptables"), path=tmp_path / "site", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "-j KUBE-SVC-LOLE4ISW44XBNF3G" in proc.stdout  # the listed one
    listing = kubeplex("backends", path=tmp_path / "site", env=env)
    assert (
        "iptables: ignored (never imported): kpx_impostor:Backend from kubeplex-impostor 0.1"
        in listing.stdout
    )
    assert not marker.exists(), "an impostor of a listed mode was imported"


def test_wrong_entry_point_for_a_listed_mode_is_refused(tmp_path: Path, example: None) -> None:
    trust = write_trust(
        tmp_path / "p.toml",
        RECORDING.replace("kubeplex_example_backend:", "kubeplex_other_package:"),
    )
    proc = kubeplex(*render_args("recording"), "--plugins", str(trust))
    assert proc.returncode == 4
    assert (
        "backend 'recording': the installed entry point (kubeplex_example_backend:RecordingBackend"
        " from kubeplex-example-backend 0.1.0) is not the one listed in" in proc.stderr
    )
    assert "(kubeplex_other_package:RecordingBackend); refused, and not imported" in proc.stderr
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys\nfrom kubeplex.core.dataplane import plugins\n"
            f"trust = plugins.load_trust_list({str(trust)!r})\n"
            "try:\n    plugins.load_backend_class('recording', trust)\n"
            "except plugins.BackendRefused:\n    pass\n"
            "print('kubeplex_example_backend' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.strip() == "False"


def test_missing_requirements_stop_run_naming_them(tmp_path: Path, example: None) -> None:
    trust = write_trust(
        tmp_path / "p.toml",
        RECORDING,
        "[backends.recording.requires]\n"
        'executables = ["kubeplex-no-such-tool"]\n'
        'paths = ["/proc/kubeplex-no-such-path"]\n'
        'min-kernel = "999.1"\n',
    )
    run = ("run", "--proxy-mode", "recording", "--manifests", str(LAB / "manifests"), "--once")
    proc = kubeplex(*run, "--plugins", str(trust))
    assert proc.returncode == 4, proc.stderr
    assert (
        "kubeplex: mode recording: this node lacks what it needs: executable "
        "'kubeplex-no-such-tool' not found in PATH; /proc/kubeplex-no-such-path does not exist; "
        f"kernel {os.uname().release} is older than the required 999.1" in proc.stderr
    )
    # Rendering needs none of it.
    assert kubeplex(*render_args("recording"), "--plugins", str(trust)).returncode == 0


def test_broken_plugin_fails_with_a_clear_error(tmp_path: Path) -> None:
    target = fake_plugin(
        tmp_path / "site", "kubeplex-broken", "broken", "kpx_broken", "import kpx_missing_dep\n"
    )
    trust = write_trust(
        tmp_path / "p.toml",
        f'[backends.broken]\nentry-point = "{target}"\nplatform = "linux"\n',
        with_default=True,
    )
    run = ("run", "--proxy-mode", "broken", "--manifests", str(LAB / "manifests"), "--once")
    for args in (render_args("broken"), run):
        proc = kubeplex(*args, "--plugins", str(trust), path=tmp_path / "site")
        assert proc.returncode == 4
        assert (
            "kubeplex: backend 'broken' (kpx_broken:Backend from kubeplex-broken 0.1) failed to "
            "import: ModuleNotFoundError(\"No module named 'kpx_missing_dep'\")" in proc.stderr
        )
        assert "Traceback" not in proc.stderr


def test_render_exception_keeps_the_previous_rules_and_the_next_sync_is_full(
    tmp_path: Path, example: None
) -> None:
    from kubeplex_example_backend import RecordingBackend, RecordingRendered

    class Flaky(RecordingBackend):
        """The second render raises, as a bug in a plugin would."""

        renders = 0

        def render(self, state: ProxyState, observed: object = None) -> RecordingRendered:
            self.renders += 1
            if self.renders == 2:
                raise RuntimeError("simulated plugin bug in render")
            return super().render(state, observed)

    out = tmp_path / "rules"
    trust = write_trust(
        tmp_path / "p.toml", RECORDING, f'[backends.recording.options]\ndirectory = "{out}"\n'
    )
    with plugins.trusting(trust):
        backend = Flaky(BackendContext(default_config(), "kind-worker", (IPFamily.IPv4,)))
    state = ClusterState("kind-worker", (IPFamily.IPv4,))
    feed(state, seed_objects())
    backend.prepare()
    proxier = Proxier(state, backend)
    fulls: list[bool] = []
    proxier.listeners.append(lambda _s, result, _t: fulls.append(result.full))

    assert proxier.sync()
    file = out / "kind-worker.jsonl"
    first = file.read_text()
    assert "10.96.10.10" in first and NEW_ENDPOINT not in first

    state.set_endpoint_slice(one_endpoint_more())
    assert not proxier.sync()
    assert "simulated plugin bug in render" in proxier.status.last_error
    assert file.read_text() == first  # the previous sync's rules are still in place
    assert backend.applied_text == first
    assert proxier.next_sync_full

    assert proxier.sync()
    assert fulls == [True, True]
    assert backend.history[-1].startswith('{"family":"IPv4","op":"full"}\n')
    assert NEW_ENDPOINT in file.read_text()
    assert file.read_text() == backend.applied_text


# ------------------------------------------------------------------------- kubeplex backends


def test_backends_command_lists_status_and_capabilities(tmp_path: Path, example: None) -> None:
    site = tmp_path / "site"
    fake_plugin(site, "kubeplex-broken", "broken", "kpx_broken", "import kpx_missing_dep\n")
    fake_plugin(site, "kubeplex-marker", "marker", "kpx_marker", MARKS_IMPORT)
    trust = write_trust(
        tmp_path / "p.toml",
        RECORDING,
        '[backends.broken]\nentry-point = "kpx_broken:Backend"\nplatform = "linux"\n'
        '[backends.ghost]\nentry-point = "kpx_ghost:Backend"\nplatform = "linux"\n',
        with_default=True,
    )
    env = {"KUBEPLEX_TEST_MARKER": str(tmp_path / "imported")}
    proc = kubeplex("--plugins", str(trust), "backends", path=site, env=env)
    assert proc.returncode == 0, proc.stderr
    table = proc.stdout.split("\n\n")[1].splitlines()
    assert re.split(r"\s{2,}", table[0]) == ["MODE", "STATUS", "ENTRY POINT", "CAPABILITIES"]
    rows = {cells[0]: cells[1:] for cells in (re.split(r"\s{2,}", ln) for ln in table[1:])}
    assert proc.stdout.startswith(f"trust list: {trust} (--plugins)\n")
    assert rows["recording"] == [
        "ok",
        "kubeplex_example_backend:RecordingBackend",
        "ipv6, render-only",
    ]
    assert rows["iptables"][:2] == ["ok", "kubeplex.backends.iptables:IptablesBackend"]
    assert rows["broken"] == ["broken", "kpx_broken:Backend", "-"]
    assert rows["marker"] == ["refused", "kpx_marker:Backend", "?"]
    assert rows["kernelspace"][0] == "requirements missing"
    assert rows["ghost"] == ["not installed", "kpx_ghost:Backend", "-"]
    assert "kernelspace: requirements missing: platform windows required" in proc.stdout
    assert "broken: broken: backend 'broken'" in proc.stdout and "failed to import" in proc.stdout
    assert not (tmp_path / "imported").exists()

    as_json = kubeplex("backends", "--json", "--plugins", str(trust), path=site, env=env)
    doc = json.loads(as_json.stdout)
    by_mode = {b["mode"]: b for b in doc["backends"]}
    assert doc["trustList"] == {"path": str(trust), "origin": "--plugins"}
    assert by_mode["recording"]["capabilities"] == ["ipv6", "render-only"]
    assert by_mode["recording"]["distribution"] == "kubeplex-example-backend 0.1.0"
    assert by_mode["marker"]["status"] == "refused" and by_mode["marker"]["capabilities"] is None


def test_backends_command_reads_the_environment_variable(tmp_path: Path) -> None:
    trust = write_trust(tmp_path / "p.toml", with_default=True)
    proc = kubeplex("backends", env={plugins.ENV_VAR: str(trust)})
    assert proc.stdout.startswith(f"trust list: {trust} ($KUBEPLEX_PLUGINS)\n"), proc.stderr


def test_backends_command_reports_capabilities_that_differ(tmp_path: Path, example: None) -> None:
    trust = plugins.load_trust_list(
        write_trust(tmp_path / "p.toml", RECORDING.replace('"ipv6", ', ""))
    )
    [status] = [s for s in plugins.survey(trust, lambda m: _ctx()) if s.mode == "recording"]
    assert status.status == "ok"
    assert status.detail == (
        "capabilities differ: trust list says render-only, the backend says ipv6, render-only"
    )


def _ctx() -> BackendContext:
    return BackendContext(default_config(), "node-a", (IPFamily.IPv4,))


# ------------------------------------------------------------------------------ run --kubeconfig


def test_kubeconfig_flag_overrides_the_configuration(tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        (LAB / "config.yaml").read_text()
        + "clientConnection:\n  kubeconfig: /nonexistent/from-config\n"
    )
    proc = kubeplex("run", "--config", str(cfg), "--kubeconfig", str(tmp_path / "kc"), "--once")
    assert proc.returncode == 4, proc.stderr
    assert f"clientConnection.kubeconfig {tmp_path / 'kc'}: cannot load" in proc.stderr
    assert "from-config" not in proc.stderr


# ------------------------------------------------------------------------ the kit on built-ins
# The Linux backends run the whole kit in tests/kernel/test_conformance.py (its render cases
# need no root); the others run the render suite here.

test_builtin_render_contract_kernelspace = render_contract_tests("kernelspace")


def test_every_in_tree_backend_runs_the_kit() -> None:
    packaged = plugins.packaged_trust_file()
    assert set(plugins.load_trust_list(packaged).backends) == {
        *conformance.linux_modes(packaged),
        "kernelspace",
    }


def test_the_kit_runs_as_a_test_class_of_a_plugin_package(example: None, tmp_path: Path) -> None:
    """``kernel_tests`` gives a test class with one test per kernel case, marked kernel."""
    trust = write_trust(tmp_path / "p.toml", RECORDING)
    cls = kernel_tests("recording", plugins_file=trust)
    assert cls.pytestmark[0].name == "kernel"
    [marks] = [m for m in cls.test_kernel.pytestmark if m.name == "parametrize"]
    assert [p.id for p in marks.args[1]] == [c.name for c in conformance.KERNEL_CASES]
    results = conformance.run(
        "recording", kernel=True, only=["clusterip-spread"], plugins_file=trust
    )
    assert [(r.name, r.outcome) for r in results] == [("clusterip-spread", "skip")]
    assert "declares render-only" in results[0].detail


# ------------------------------------------------------------------------------- packaging


def test_a_wheel_of_kubeplex_carries_the_trust_list(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        (src / name).write_text((ROOT / name).read_text())
    for folder in ("core", "backends", "testing"):
        subprocess.run(["cp", "-r", str(ROOT / folder), str(src / folder)], check=True)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(src)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    [wheel] = tmp_path.glob("kubeplex-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "kubeplex/core/dataplane/plugins.toml" in names
    assert "kubeplex/testing/conformance/__init__.py" in names
    assert "kubeplex/testing/conformance/__main__.py" in names
    with zipfile.ZipFile(wheel).open("kubeplex/core/dataplane/plugins.toml") as packaged:
        in_tree = ROOT / "core" / "dataplane" / "plugins.toml"
        assert packaged.read().decode() == in_tree.read_text()
