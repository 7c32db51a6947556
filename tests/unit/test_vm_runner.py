"""The test VM's runner, on the host: its cpio writer, scripts, module order, kernel cache and
the supervision loop (driven by a stand-in for qemu; the real boot is
tests/kernel/test_vm_suite.py)."""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kubeplex.testing.vm import TIMEOUT_STATUS, VM_FAILED_STATUS, guest, initramfs, kernel, runner
from kubeplex.testing.vm.__main__ import _parse
from kubeplex.testing.vm.initramfs import Entry, load_order, newc, parse_newc

# ------------------------------------------------------------------------------------- cpio

MEMBERS = [
    Entry("bin", stat.S_IFDIR | 0o755),
    Entry("bin/tool", stat.S_IFREG | 0o755, b"#!/bin/sh\necho hi\n"),
    Entry("odd", stat.S_IFREG | 0o644, b"x" * 5),
    Entry("empty", stat.S_IFREG | 0o600),
    Entry("link", stat.S_IFLNK | 0o777, b"bin/tool"),
]


def test_newc_round_trips_and_aligns() -> None:
    blob = newc(MEMBERS)
    assert blob.startswith(b"070701")
    assert len(blob) % 4 == 0
    assert b"TRAILER!!!\0" in blob
    assert parse_newc(blob) == MEMBERS


def test_newc_is_read_by_a_real_cpio(tmp_path: Path) -> None:
    tool = shutil.which("cpio") or initramfs.find_busybox()
    if tool is None:
        pytest.skip("no cpio and no busybox here to read the archive")
    argv = [str(tool), "cpio"] if Path(tool).name == "busybox" else [str(tool)]
    subprocess.run([*argv, "-id"], input=newc(MEMBERS), cwd=tmp_path, check=True)
    assert (tmp_path / "bin" / "tool").read_bytes() == MEMBERS[1].data
    assert os.access(tmp_path / "bin" / "tool", os.X_OK)
    assert (tmp_path / "odd").read_bytes() == b"xxxxx"
    assert os.readlink(tmp_path / "link") == "bin/tool"


# ---------------------------------------------------------------------------------- scripts


def test_scripts_parse_as_shell() -> None:
    for script in (initramfs.INIT_SCRIPT, guest.STAGE2_SCRIPT):
        subprocess.run(["sh", "-n"], input=script, text=True, check=True)


def test_init_mounts_the_shares_and_hands_over_to_stage2() -> None:
    text = initramfs.INIT_SCRIPT
    assert text.startswith("#!/bin/busybox sh\n")
    root = next(line for line in text.splitlines() if initramfs.ROOT_TAG in line)
    assert ",ro," in root and "cache=loose" in root
    share = next(line for line in text.splitlines() if initramfs.SHARE_TAG in line)
    assert "cache=loose" in share
    assert f"{initramfs.CTL_TAG} /newroot{initramfs.GUEST_CTL}" in text
    assert "mount -t overlay" in text
    assert text.rstrip().endswith(f"switch_root /newroot /bin/sh {initramfs.GUEST_CTL}/stage2.sh")


def test_stage2_makes_dev_links_and_reports_status() -> None:
    text = guest.STAGE2_SCRIPT
    for line in ("ln -sf /proc/self/fd /dev/fd", "mount -t tmpfs -o mode=1777,nosuid,nodev shm"):
        assert line in text
    assert text.index("/started") < text.index("command.sh") < text.index("/status")
    assert "echo o > /proc/sysrq-trigger" in text


def test_command_script_keeps_arguments_env_and_cwd(tmp_path: Path) -> None:
    show = "import json, os, sys; print(json.dumps([os.getcwd(), sys.argv[1:], dict(os.environ)]))"
    args = ["a b", "$HOME", "it's", "--x=1"]
    env = {"PATH": os.environ["PATH"], "ODD": "x y 'z' $w"}
    (tmp_path / "sub dir").mkdir()
    script = guest.command_script(
        [sys.executable, "-c", show, *args], env, str(tmp_path / "sub dir")
    )
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout
    cwd, got_args, got_env = json.loads(out)
    assert (cwd, got_args) == (str(tmp_path / "sub dir"), args)
    got_env.pop("LC_CTYPE", None)  # the interpreter may set it on its own
    assert got_env == env


def test_command_script_exits_126_without_its_folder(tmp_path: Path) -> None:
    script = guest.command_script(["true"], {}, str(tmp_path / "gone"))
    assert subprocess.run(["sh", "-c", script], capture_output=True).returncode == 126
    with pytest.raises(ValueError):
        guest.command_script([], {}, "/")


# ---------------------------------------------------------------------------------- modules


def _modules_tree(tmp_path: Path) -> Path:
    mods = tmp_path / "lib" / "modules" / "9.9.9-test"
    mods.mkdir(parents=True)
    (mods / "modules.dep").write_text(
        "kernel/fs/9p/9p.ko: kernel/net/9p/9pnet.ko kernel/fs/fscache/fscache.ko "
        "kernel/fs/netfs/netfs.ko\n"
        "kernel/net/9p/9pnet.ko:\n"
        "kernel/fs/fscache/fscache.ko: kernel/fs/netfs/netfs.ko\n"
        "kernel/fs/netfs/netfs.ko:\n"
        "kernel/net/9p/9pnet_virtio.ko.xz: kernel/net/9p/9pnet.ko\n"
    )
    (mods / "modules.builtin").write_text("kernel/fs/overlayfs/overlay.ko\n")
    return mods


def test_load_order_puts_dependencies_first_and_skips_builtins(tmp_path: Path) -> None:
    mods = _modules_tree(tmp_path)
    order = load_order(mods, ["9pnet_virtio", "9p", "overlay"])
    assert order == [
        "kernel/net/9p/9pnet.ko",
        "kernel/net/9p/9pnet_virtio.ko.xz",
        "kernel/fs/netfs/netfs.ko",
        "kernel/fs/fscache/fscache.ko",
        "kernel/fs/9p/9p.ko",
    ]
    with pytest.raises(initramfs.InitramfsError, match="ip_vs"):
        load_order(mods, ["ip_vs"])


def test_modules_are_decompressed_for_insmod(tmp_path: Path) -> None:
    import lzma

    path = tmp_path / "m.ko.xz"
    path.write_bytes(lzma.compress(b"\x7fELF module"))
    assert initramfs.module_bytes(path) == b"\x7fELF module"


def test_present_modules_keeps_what_the_kernel_has(tmp_path: Path) -> None:
    mods = _modules_tree(tmp_path)
    assert runner.present_modules(mods, ["9p", "overlay", "ip_vs_mh", "9pnet-virtio"]) == [
        "9p",
        "overlay",
        "9pnet-virtio",
    ]


def test_static_elf_detection(tmp_path: Path) -> None:
    (tmp_path / "text").write_text("#!/bin/sh\n")
    assert not initramfs.is_static_elf(tmp_path / "text")
    assert not initramfs.is_static_elf(Path(os.path.realpath(sys.executable)))  # has libc
    busybox = initramfs.find_busybox()
    if busybox is not None:
        assert initramfs.is_static_elf(busybox)


# ----------------------------------------------------------------------------- kernel cache

DEPENDS = """linux-image-amd64
  Depends: linux-image-6.1.0-57-amd64
<linux-image-generic>
"""


def test_apt_answers_are_read() -> None:
    assert kernel.meta_depends(DEPENDS) == {"linux-image-amd64": ["linux-image-6.1.0-57-amd64"]}
    show = (
        "Package: linux-image-6.8.0-40-generic\nVersion: 6.8.0-40.40\n"
        "Depends: linux-base, linux-modules-6.8.0-40-generic | x, kmod (>= 1)\n"
    )
    assert kernel.show_fields(show) == (
        "6.8.0-40.40",
        ["linux-base", "linux-modules-6.8.0-40-generic", "x", "kmod"],
    )


def _fake_tree(cache: Path, pkg: kernel.KernelPackage, release: str, *, complete: bool) -> Path:
    tree = cache / "kernels" / pkg.folder_name
    (tree / "boot").mkdir(parents=True)
    (tree / "boot" / f"vmlinuz-{release}").write_bytes(b"kernel")
    (tree / "lib" / "modules" / release).mkdir(parents=True)
    if complete:
        (tree / ".complete").write_text("x\n")
    return tree


def test_cache_is_reused_and_incomplete_trees_ignored(tmp_path: Path) -> None:
    old = kernel.KernelPackage("linux-image-1.0-amd64", "1.0-1")
    new = kernel.KernelPackage("linux-image-2.0-amd64", "2.0-1")
    half = kernel.KernelPackage("linux-image-3.0-amd64", "3.0-1")
    _fake_tree(tmp_path, old, "1.0-amd64", complete=True)
    time.sleep(0.01)
    _fake_tree(tmp_path, new, "2.0-amd64", complete=True)
    _fake_tree(tmp_path, half, "3.0-amd64", complete=False)
    assert [k.release for k in kernel.cached_kernels(tmp_path)] == ["2.0-amd64", "1.0-amd64"]
    assert kernel.lookup(tmp_path, half) is None
    got = kernel.fetch(tmp_path, new)  # cached: no download
    assert got.release == "2.0-amd64"
    assert got.vmlinuz.read_bytes() == b"kernel"
    assert got.modules == got.root / "lib" / "modules" / "2.0-amd64"
    assert kernel.available(tmp_path) is None


def test_a_tree_must_hold_one_kernel(tmp_path: Path) -> None:
    (tmp_path / "lib" / "modules" / "a").mkdir(parents=True)
    with pytest.raises(kernel.KernelError, match="expected one kernel"):
        kernel.release_of(tmp_path)


def test_cache_folder_default_and_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBEPLEX_VM_CACHE", "/somewhere/vm")
    assert kernel.default_cache() == Path("/somewhere/vm")
    monkeypatch.delenv("KUBEPLEX_VM_CACHE")
    assert kernel.default_cache() == Path.home() / ".cache" / "kubeplex" / "vm"


def test_initramfs_is_built_once_per_content(tmp_path: Path) -> None:
    mods = tmp_path / "mods"
    mods.mkdir()
    lines = []
    for name in ("virtio_pci", "9pnet_virtio", "9p", "overlay"):
        (mods / f"{name}.ko").write_bytes(b"\x7fELF " + name.encode())
        lines.append(f"{name}.ko:")
    (mods / "modules.dep").write_text("\n".join(lines) + "\n")
    busybox = tmp_path / "busybox"
    busybox.write_bytes(b"\x7fELF busybox")
    first = initramfs.build(tmp_path / "cache", "9.9", mods, busybox)
    mtime = first.stat().st_mtime_ns
    assert initramfs.build(tmp_path / "cache", "9.9", mods, busybox) == first
    assert first.stat().st_mtime_ns == mtime
    members = {e.name: e for e in parse_newc(first.read_bytes())}
    assert members["init"].data == initramfs.INIT_SCRIPT.encode()
    assert members["modules.order"].data.decode().split() == [
        "virtio_pci.ko",
        "9pnet_virtio.ko",
        "9p.ko",
        "overlay.ko",
    ]
    (mods / "overlay.ko").write_bytes(b"\x7fELF changed")
    second = initramfs.build(tmp_path / "cache", "9.9", mods, busybox)
    assert second != first and not first.exists()


# ------------------------------------------------------------------------------------- qemu


def test_qemu_command_line(tmp_path: Path) -> None:
    argv = runner.qemu_argv(
        Path("/k"), Path("/i"), ctl=tmp_path, share=Path("/proj"), console_log=tmp_path / "c"
    )
    joined = " ".join(argv)
    for part in ("-accel tcg", "-smp 1", "-nodefaults", "-nic none", "-nographic", "-no-reboot"):
        assert part in joined
    assert "path=/,security_model=passthrough,multidevs=remap,readonly=on" in joined
    assert "path=/proj,security_model=passthrough,multidevs=remap -device" in joined
    with pytest.raises(runner.VmError, match="comma"):
        runner.qemu_argv(Path("/k"), Path("/i"), ctl=tmp_path, share=Path("/a,b"),
                         console_log=tmp_path / "c")  # fmt: skip


def _supervise(ctl: Path, script: str, timeout: float) -> tuple[runner.VmResult, bytes, bytes]:
    """The supervision loop around a stand-in guest: a shell script using ``ctl`` as qemu's."""
    out, err = io.BytesIO(), io.BytesIO()
    log = ctl / "console.log"
    log.write_text("console line\n")
    result = runner._supervise(["sh", "-c", script, "sh", str(ctl)], ctl, log, "9.9", timeout,
                               out, err)  # fmt: skip
    return result, out.getvalue(), err.getvalue()


def test_supervision_streams_output_and_returns_the_status(tmp_path: Path) -> None:
    result, out, _ = _supervise(
        tmp_path, 'echo 1.0 > "$1/started"; echo hello; echo 7 > "$1/status"', 30
    )
    assert (result.returncode, result.timed_out, result.message) == (7, False, None)
    assert out == b"hello\n"
    assert result.boot_seconds is not None and result.command_seconds is not None


def test_supervision_kills_on_timeout(tmp_path: Path) -> None:
    start = time.monotonic()
    result, _, err = _supervise(tmp_path, 'echo 1.0 > "$1/started"; exec sleep 30', 1.0)
    assert time.monotonic() - start < 10
    assert result.returncode == TIMEOUT_STATUS and result.timed_out
    assert b"timed out after 1 s" in err
    assert result.log_tail == "console line"


def test_supervision_without_status_says_so(tmp_path: Path) -> None:
    result, _, err = _supervise(tmp_path, "echo qemu: bad >&2; exit 1", 30)
    assert result.returncode == VM_FAILED_STATUS and not result.timed_out
    assert result.message is not None and "without the command's status" not in result.message
    assert "having started it" in result.message
    assert b"qemu: bad" in err


# -------------------------------------------------------------------------------------- cli


def test_cli_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KPX_TEST_VAR", "v")
    ns = _parse(["--timeout", "5", "--env", "KPX_TEST_VAR", "--env", "A=b", "--", "ls", "-l"])
    assert (ns.timeout, ns.command, dict(ns.env)) == (
        5.0,
        ["ls", "-l"],
        {"KPX_TEST_VAR": "v", "A": "b"},
    )


def test_no_vm_inside_the_vm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBEPLEX_IN_VM", "1")
    assert runner.vm_unavailable() == "already inside the test VM"
