"""Boot the guest under qemu, run one command in it, stream its output, return its status."""

from __future__ import annotations

import os
import platform
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from kubeplex.testing.vm import guest, initramfs, kernel
from kubeplex.testing.vm.initramfs import CTL_TAG, ROOT_TAG, SHARE_TAG

#: Exit statuses of a run that did not report the command's own.
TIMEOUT_STATUS = 124
VM_FAILED_STATUS = 125
DEFAULT_MEMORY_MB = 1536
QEMU = "qemu-system-x86_64"
_POWEROFF_GRACE = 20.0  # after the status is in, the guest syncs and powers off
_POLL = 0.05


class VmError(RuntimeError):
    """The VM cannot be prepared (no kernel, no busybox, a bad share path)."""


@dataclass(frozen=True)
class VmResult:
    """How a run ended. ``returncode`` is the command's, or TIMEOUT/VM_FAILED_STATUS."""

    returncode: int
    timed_out: bool
    release: str
    boot_seconds: float | None  # launch -> the command starts (None: it never did)
    command_seconds: float | None  # the command's wall time, seen from the host
    total_seconds: float
    message: str | None = None  # why the command's own status is missing
    log_tail: str = ""  # the end of the guest's console log, for failures

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def vm_unavailable() -> str | None:
    """None when the VM can run here; else the reason, in one line (for a test's skip)."""
    if os.environ.get("KUBEPLEX_IN_VM") == "1":
        return "already inside the test VM"
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return "the test VM needs an x86_64 Linux host"
    if os.geteuid() != 0:
        return "the test VM needs root (its root filesystem is the host's, shared as it is)"
    if shutil.which(QEMU) is None:
        return f"{QEMU} is missing (package qemu-system-x86)"
    if initramfs.find_busybox() is None:
        return "a static busybox is missing (package busybox-static)"
    for tool in ("modprobe", "depmod"):
        if shutil.which(tool) is None:
            return f"{tool} is missing (package kmod)"
    return kernel.available()


def base_env() -> dict[str, str]:
    """The command's environment before the caller's additions."""
    return {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"),
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "TERM": "dumb",  # the output port is a tty: no colours, no cursor tricks
        "KUBEPLEX_IN_VM": "1",
    }


def present_modules(modules_dir: Path, names: Sequence[str]) -> list[str]:
    """The names the kernel has, as a module or built in."""
    have: set[str] = set()
    for index in ("modules.dep", "modules.builtin"):
        path = modules_dir / index
        if path.exists():
            for line in path.read_text().splitlines():
                mod = line.split(":", 1)[0].strip().rsplit("/", 1)[-1]
                have.add(mod.split(".ko", 1)[0].replace("-", "_"))
    return [n for n in names if n.replace("-", "_") in have]


def qemu_argv(
    vmlinuz: Path,
    initrd: Path,
    *,
    ctl: Path,
    share: Path,
    console_log: Path,
    memory_mb: int = DEFAULT_MEMORY_MB,
) -> list[str]:
    """The qemu command line: TCG, one vCPU, no network card, three 9p shares."""

    def fs(tag: str, path: Path, *, readonly: bool) -> list[str]:
        opts = f"local,id={tag},path={path},security_model=passthrough,multidevs=remap"
        if readonly:
            opts += ",readonly=on"
        return ["-fsdev", opts, "-device", f"virtio-9p-pci,fsdev={tag},mount_tag={tag}"]

    for p in (ctl, share):
        if "," in str(p):
            raise VmError(f"qemu cannot share a path with a comma: {p}")
    return [
        QEMU,
        # KVM here may be a nested hypervisor that runs only its own guests: emulate.
        "-accel",
        "tcg",
        "-cpu",
        "max",
        "-smp",
        "1",
        "-m",
        str(memory_mb),
        "-nodefaults",
        "-nic",
        "none",
        "-nographic",
        "-no-reboot",
        "-kernel",
        str(vmlinuz),
        "-initrd",
        str(initrd),
        "-append",
        "console=ttyS0 panic=-1 loglevel=4 quiet",
        "-chardev",
        f"file,id=console,path={console_log}",
        "-serial",
        "chardev:console",
        "-chardev",
        "stdio,id=output,signal=off",
        "-serial",
        "chardev:output",
        *fs(ROOT_TAG, Path("/"), readonly=True),
        *fs(CTL_TAG, ctl, readonly=False),
        *fs(SHARE_TAG, share, readonly=False),
    ]


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _read(fd: int) -> bytes | None:
    """What the pipe holds (b"" at its end, None when nothing is there yet)."""
    try:
        return os.read(fd, 65536)
    except BlockingIOError:
        return None


def run_in_vm(
    argv: Sequence[str],
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    share: str | os.PathLike[str] | None = None,
    memory_mb: int = DEFAULT_MEMORY_MB,
    keep_log: str | os.PathLike[str] | None = None,
    cache: Path | None = None,
    out: BinaryIO | None = None,
    err: BinaryIO | None = None,
) -> VmResult:
    """Run ``argv`` as root in a fresh guest, in ``cwd`` (default: the current folder).

    ``share`` (default: ``cwd``) is shared read-write at the same path; the rest of the host's
    ``/`` is seen read-only, with writes going to a tmpfs. The environment is ``base_env()``
    updated with ``env``. The command's output (stdout and stderr together) is copied to
    ``out`` (default: this process's stdout) as it comes. After ``timeout`` seconds from launch
    the VM is killed and the status is TIMEOUT_STATUS.
    """
    out = out if out is not None else sys.stdout.buffer
    err = err if err is not None else sys.stderr.buffer
    cwd_path = Path(os.path.realpath(cwd if cwd is not None else os.getcwd()))
    share_path = Path(os.path.realpath(share if share is not None else cwd_path))
    if not share_path.is_dir():
        raise VmError(f"not a folder: {share_path}")
    cache = cache or kernel.default_cache()
    busybox = initramfs.find_busybox()
    if busybox is None:
        raise VmError("a static busybox is missing (package busybox-static)")
    try:
        guest_kernel = kernel.ensure(cache)
        initrd = initramfs.build(cache, guest_kernel.release, guest_kernel.modules, busybox)
    except (kernel.KernelError, initramfs.InitramfsError) as exc:
        raise VmError(str(exc)) from exc

    full_env = base_env()
    full_env.update(env or {})
    ctl = Path(tempfile.mkdtemp(prefix="kubeplex-vm-"))
    console_log = Path(keep_log) if keep_log is not None else ctl / "console.log"
    try:
        (ctl / "share").write_text(str(share_path))
        (ctl / "modules_dir").write_text(str(guest_kernel.modules))
        mods = present_modules(guest_kernel.modules, guest.GUEST_MODULES)
        (ctl / "modprobe").write_text(" ".join(mods) + "\n")
        (ctl / "stage2.sh").write_text(guest.STAGE2_SCRIPT)
        (ctl / "command.sh").write_text(guest.command_script(argv, full_env, str(cwd_path)))
        cmd = qemu_argv(
            guest_kernel.vmlinuz,
            initrd,
            ctl=ctl,
            share=share_path,
            console_log=console_log,
            memory_mb=memory_mb,
        )
        return _supervise(cmd, ctl, console_log, guest_kernel.release, timeout, out, err)
    finally:
        shutil.rmtree(ctl, ignore_errors=True)


def _supervise(
    cmd: list[str],
    ctl: Path,
    console_log: Path,
    release: str,
    timeout: float,
    out: BinaryIO,
    err: BinaryIO,
) -> VmResult:
    started_at: float | None = None
    ended_at: float | None = None
    launch = time.monotonic()
    deadline = launch + timeout
    qemu_log = ctl / "qemu.log"  # qemu's own complaints, passed on once it is done
    with qemu_log.open("wb") as qemu_err:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=qemu_err
        )
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    timed_out = False
    try:
        while proc.poll() is None or sel.get_map():
            now = time.monotonic()
            if started_at is None and (ctl / "started").exists():
                started_at = now
            if ended_at is None and (ctl / "status").exists():
                ended_at = now
            if ended_at is not None and now - ended_at > _POWEROFF_GRACE:
                break  # the status is in; a guest that does not power off is killed
            if now >= deadline:
                timed_out = True
                break
            if not sel.get_map():
                time.sleep(_POLL)
                continue
            for _key, _ in sel.select(timeout=min(_POLL, max(0.0, deadline - now))):
                chunk = _read(fd)
                if chunk is None:
                    continue
                if not chunk:
                    sel.unregister(fd)
                    break
                out.write(chunk)
                out.flush()
    finally:
        sel.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    if ended_at is None and (ctl / "status").exists():
        ended_at = time.monotonic()
    complaints = qemu_log.read_bytes()
    if complaints:
        err.write(complaints)
        err.flush()
    total = time.monotonic() - launch
    boot = started_at - launch if started_at is not None else None
    ran = (ended_at or time.monotonic()) - started_at if started_at is not None else None
    if timed_out:
        msg = f"kubeplex-vm: timed out after {timeout:g} s: the VM was killed"
        err.write((msg + "\n").encode())
        err.flush()
        return VmResult(TIMEOUT_STATUS, True, release, boot, ran, total, msg, _tail(console_log))
    status_file = ctl / "status"
    try:
        returncode = int(status_file.read_text().strip())
    except (OSError, ValueError):
        msg = f"kubeplex-vm: the VM stopped (qemu status {proc.returncode}) without the command's"
        msg += " status" if started_at is not None else " having started it"
        err.write((msg + "\n").encode())
        err.flush()
        return VmResult(VM_FAILED_STATUS, False, release, boot, ran, total, msg, _tail(console_log))
    return VmResult(returncode, False, release, boot, ran, total)
