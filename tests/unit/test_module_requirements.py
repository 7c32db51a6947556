"""Whether a kernel module can be had on a node, and if not, what is missing or what stops it:
``module_unavailable`` read against a scratch copy of a node's /sys/module, /proc,
/lib/modules and modprobe.d (the VM suite checks the same against a real kernel)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubeplex.core.dataplane.requirements import module_unavailable

RELEASE = "6.1.0-57-amd64"
DEP = (
    "kernel/net/netfilter/ipvs/ip_vs.ko.xz: kernel/lib/libcrc32c.ko.xz\n"
    "kernel/net/netfilter/ipvs/ip_vs_rr.ko.xz: kernel/net/netfilter/ipvs/ip_vs.ko.xz\n"
    "kernel/drivers/net/dummy.ko.xz:\n"
)


@pytest.fixture
def node(tmp_path: Path) -> Path:
    """A node whose ip_vs, ip_vs_rr and dummy are loadable, none loaded."""
    moddir = tmp_path / "lib/modules" / RELEASE
    moddir.mkdir(parents=True)
    (moddir / "modules.dep").write_text(DEP)
    (moddir / "modules.builtin").write_text("kernel/net/netfilter/nf_conntrack.ko\n")
    (tmp_path / "sys/module").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/modprobe").write_text("/sbin/modprobe\n")
    (tmp_path / "proc/cmdline").write_text("console=ttyS0 quiet\n")
    for folder in ("etc/modprobe.d", "lib/modprobe.d"):
        (tmp_path / folder).mkdir(parents=True)
    return tmp_path


def why(root: Path, name: str, on_demand: bool = True) -> str | None:
    return module_unavailable(name, RELEASE, on_demand=on_demand, root=root)


def test_loaded_built_in_or_loadable_is_available(node: Path) -> None:
    (node / "sys/module/ip_set").mkdir()
    assert why(node, "ip_set") is None  # loaded
    assert why(node, "nf_conntrack") is None  # built in
    assert why(node, "ip_vs") is None  # loadable
    assert why(node, "ip-vs-rr") is None  # - and _ are one to the kernel


def test_a_module_the_node_does_not_have_names_the_index(node: Path) -> None:
    dep = node / "lib/modules" / RELEASE / "modules.dep"
    assert why(node, "ip_vs_nosuch") == (
        f"kernel module 'ip_vs_nosuch' is not loaded, built in or in {dep}"
    )


def test_a_missing_modules_folder_is_named(node: Path) -> None:
    moddir = node / "lib/modules" / RELEASE
    (moddir / "modules.dep").unlink()
    assert why(node, "ip_vs") == (
        f"kernel module 'ip_vs' is not loaded, and {moddir} has no modules.dep to load it from"
    )
    (moddir / "modules.builtin").unlink()
    moddir.rmdir()
    assert why(node, "ip_vs") == (
        f"kernel module 'ip_vs' is not loaded, and {moddir}, where it would be loaded from, "
        "does not exist"
    )


def test_a_blacklist_stops_what_the_kernel_loads_by_alias_only(node: Path) -> None:
    conf = node / "etc/modprobe.d/no-ipvs.conf"
    conf.write_text("# not here\nblacklist ip_vs\nblacklist ip_vs_rr  # nor this\n")
    assert why(node, "ip_vs") == (
        f"kernel module 'ip_vs' is not loaded and is blacklisted in {conf}, so the kernel "
        "does not load it when asked: load it on the node (modprobe ip_vs) or lift the "
        "blacklist"
    )
    # A scheduler is asked for by its name, which a blacklist does not stop.
    assert why(node, "ip_vs_rr", on_demand=False) is None
    # A file of the same name in /etc hides the distribution's.
    (node / "lib/modprobe.d/no-dummy.conf").write_text("blacklist dummy\n")
    assert why(node, "dummy") is not None
    (node / "etc/modprobe.d/no-dummy.conf").write_text("# allowed here\n")
    assert why(node, "dummy") is None
    (node / "proc/cmdline").write_text("quiet modprobe.blacklist=foo,dummy\n")
    assert "blacklisted in the kernel command line (modprobe.blacklist=dummy)" in str(
        why(node, "dummy")
    )


def test_what_stops_every_load_is_named(node: Path) -> None:
    conf = node / "lib/modprobe.d/disable.conf"
    conf.write_text("install ip_vs_rr /bin/false\n")
    assert why(node, "ip_vs_rr", on_demand=False) == (
        f"kernel module 'ip_vs_rr' is not loaded, and {conf} runs `/bin/false` instead of "
        "loading it"
    )
    (node / "proc/cmdline").write_text("quiet module_blacklist=ip_vs,dummy\n")
    assert why(node, "ip_vs") == (
        "kernel module 'ip_vs' is not loaded, and the kernel command line forbids it "
        "(module_blacklist=ip_vs)"
    )
    (node / "proc/sys/kernel/modprobe").write_text("\n")
    assert why(node, "ip_vs_rr", on_demand=False) == (
        "kernel module 'ip_vs_rr' is not loaded, and the kernel loads no module on demand "
        "(kernel.modprobe is empty)"
    )
    (node / "proc/sys/kernel/modules_disabled").write_text("1\n")
    assert why(node, "ip_vs_rr") == (
        "kernel module 'ip_vs_rr' is not loaded, and this kernel loads no more modules "
        "(kernel.modules_disabled = 1)"
    )
    (node / "sys/module/ip_vs_rr").mkdir()
    assert why(node, "ip_vs_rr") is None  # what is loaded stays usable
