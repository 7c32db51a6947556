"""The built container image (scripts/build-image.sh), tried from its own root filesystem:
unpacked with umoci, then each command runs chrooted into it inside a scratch network
namespace, and the rules it wrote are read back from the host. Also the image's iptables
wrapper choosing the node's variant (legacy or nft) in real namespaces.

The image is $KUBEPLEX_IMAGE (an OCI layout directory or an oci-archive) or build/image/oci;
without one, or without umoci, the image tests skip saying so."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from kits.cli_kit import in_netns
from kits.ebpf_kit import own_cgroup

from kubeplex.core.dataplane import plugins

REPO = Path(__file__).resolve().parents[2]
WRAPPER = REPO / "image" / "iptables-wrapper"
LAB = REPO / "testing" / "lab"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
WEB_CHAIN = "KUBE-SVC-LOLE4ISW44XBNF3G"  # the seed lab's Service web, port 80
WEB_NFT_CHAIN = "service-PFISGYVC-default/web/tcp/"

# Mounts made inside `ip netns exec`'s own mount namespace (it makes / a recursive slave), so
# they never reach the host and vanish with the command: nothing is left to unmount.
CHROOT = (
    'mount --bind /proc "$0/proc" && mount --bind /sys "$0/sys" && mount --bind /dev "$0/dev"'
    ' && exec chroot "$0" "$@"'
)


# The same, with a bpffs and the cgroup2 hierarchy mounted where a pod of the chart finds them
# (in that mount namespace only, so they go with the command, and every pin with them).
CHROOT_EBPF = CHROOT.replace(
    " && exec chroot",
    ' && mount -t bpf bpf "$0/sys/fs/bpf" && mount -t cgroup2 cgroup2 "$0/sys/fs/cgroup"'
    " && exec chroot",
)


def _image_source() -> Path:
    given = os.environ.get("KUBEPLEX_IMAGE")
    path = Path(given) if given else REPO / "build" / "image" / "oci"
    if not path.exists():
        hint = "" if given else ": bash scripts/build-image.sh builds it"
        pytest.skip(f"no image at {path}{hint}")
    return path


@pytest.fixture(scope="module")
def rootfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The image's root filesystem, unpacked once for the module, with the seed lab in /srv."""
    source = _image_source()
    if shutil.which("umoci") is None:
        pytest.skip("umoci is missing (KUBEPLEX_IMAGE_TOOLS=1 bash scripts/setup.sh)")
    work = tmp_path_factory.mktemp("image")
    try:
        layout = source
        if source.is_file():  # an oci-archive: a tar of the layout
            layout = work / "layout"
            with tarfile.open(source) as tar:
                tar.extractall(layout, filter="tar")
        index = json.loads((layout / "index.json").read_text())
        tag = index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"]
        bundle = work / "bundle"
        subprocess.run(
            ["umoci", "unpack", "--image", f"{layout}:{tag}", str(bundle)],
            check=True,
            capture_output=True,
        )
        root = bundle / "rootfs"
        shutil.copytree(LAB, root / "srv" / "lab")
        yield root
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def image(rootfs: Path) -> Path:
    """The root filesystem with the iptables commands back on the wrapper, as built: each test
    sees the first call choose the variant."""
    subprocess.run(
        ["chroot", str(rootfs), "/usr/sbin/iptables-wrapper", "install"],
        check=True,
        capture_output=True,
    )
    return rootfs


def in_image(
    root: Path, ns: str, *argv: str, chroot: str = CHROOT
) -> subprocess.CompletedProcess[str]:
    """``argv`` run from the image's root filesystem in namespace ``ns`` (not checked)."""
    return subprocess.run(
        ["ip", "netns", "exec", ns, "sh", "-c", chroot, str(root), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def run_once(root: Path, ns: str, *extra: str) -> None:
    proc = in_image(
        root,
        ns,
        "kubeplex",
        "run",
        "--config=/srv/lab/config.yaml",
        "--manifests=/srv/lab/manifests",
        "--once",
        *extra,
    )
    assert proc.returncode == 0, proc.stderr


def variant(root: Path) -> str:
    """Where the image's iptables alternative points now."""
    return os.readlink(root / "etc" / "alternatives" / "iptables")


@pytest.mark.kernel
def test_version_and_kube_proxy_version(image: Path, netns: str) -> None:
    proc = in_image(image, netns, "kubeplex", "version")
    assert proc.returncode == 0, proc.stderr
    assert VERSION in proc.stdout
    if not (image / "usr" / "local" / "bin" / "kube-proxy").exists():
        pytest.skip("the wheel declares no kube-proxy command")
    proc = in_image(image, netns, "/usr/local/bin/kube-proxy", "--version")
    assert proc.returncode == 0, proc.stderr
    assert VERSION in proc.stdout


@pytest.mark.kernel
def test_a_start_from_the_image_compiles_no_dataclass_method(image: Path, netns: str) -> None:
    """Compiled at build (warm_cache): a pod's first start finds them kept."""
    (kept,) = image.glob(
        "usr/local/lib/python3*/dist-packages/kubeplex/core/__pycache__/dataclass-methods.*.marshal"
    )
    script = (
        "import kubeplex.core.cli.main, kubeplex.core.cli.run, kubeplex.core.daemon.operations\n"
        "from kubeplex.core.startup import codecache\n"
        "from kubeplex.core.dataplane.plugins import load_backend_class\n"
        "for mode in ('iptables', 'nftables', 'ipvs'):\n"
        "    load_backend_class(mode)\n"
        "print(codecache._active.compiled, len(codecache._active.loaded))\n"
    )
    proc = in_image(image, netns, "python3", "-c", script)
    assert proc.returncode == 0, proc.stderr
    compiled, loaded = proc.stdout.split()
    assert compiled == "0" and int(loaded) > 100, (kept, proc.stdout)


@pytest.mark.kernel
def test_backends_lists_the_linux_modes_as_usable(image: Path, netns: str) -> None:
    proc = in_image(image, netns, "kubeplex", "backends")
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line.split()[1] for line in proc.stdout.splitlines() if line}
    assert rows.get("iptables") == "ok"
    assert rows.get("nftables") == "ok"


@pytest.mark.kernel
def test_the_ebpf_mode_is_usable_from_the_image(image: Path, netns: str) -> None:
    """With a bpffs and cgroup2 mounted (as the chart does), `kubeplex backends` finds every
    requirement of the mode in the image (libbpf, the compiled programs); a sync attaches to a
    cgroup of the test's own (named in the trust list's options) and `explain` reads the web
    Service back from the pinned maps."""
    with own_cgroup() as cgroup:
        packaged = (Path(plugins.__file__).parent / "plugins.toml").read_text()
        options = f'[backends.ebpf.options]\ncgroup = "/sys/fs/cgroup/{cgroup.name}"\n'
        (image / "srv" / "plugins.toml").write_text(packaged + "\n" + options)
        lab = ["--config=/srv/lab/config.yaml", "--manifests=/srv/lab/manifests"]
        script = (
            "kubeplex backends --json && kubeplex run --once --proxy-mode=ebpf $0 $1"
            " && kubeplex explain default/web --proxy-mode=ebpf $0 $1"
        )
        proc = in_image(
            image,
            netns,
            "env",
            "KUBEPLEX_PLUGINS=/srv/plugins.toml",
            "sh",
            "-c",
            script,
            *lab,
            chroot=CHROOT_EBPF,
        )
    assert proc.returncode == 0, proc.stderr
    listed, _, explained = proc.stdout.partition("\n}\n")
    (ebpf,) = [b for b in json.loads(listed + "\n}")["backends"] if b["mode"] == "ebpf"]
    assert (ebpf["status"], ebpf["detail"]) == ("ok", "")
    assert "default/web (TCP, IPv4), mode ebpf" in explained
    assert "kpx_svc4 10.96.88.59:80/tcp -> svc 0x" in explained
    assert "drift: none" in explained


@pytest.mark.kernel
def test_the_ipvs_operators_tools_are_in_the_image(image: Path, netns: str) -> None:
    """The ipvs mode talks netlink itself; operators debug it with ipvsadm and ipset."""
    # ipvsadm answers nothing, not even --version, on a kernel without IPVS (as this one).
    assert (image / "usr" / "sbin" / "ipvsadm").is_file()
    proc = in_image(image, netns, "ipset", "version")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.kernel
def test_iptables_mode_on_an_empty_node_writes_nft_rules(image: Path, netns: str) -> None:
    run_once(image, netns)
    assert variant(image) == "/usr/sbin/iptables-nft"
    saved = in_netns(netns, "iptables-nft-save", "-t", "nat")
    assert f"-A {WEB_CHAIN}" in saved
    assert "-j KUBE-SERVICES" in saved
    assert "KUBE-" not in in_netns(netns, "iptables-legacy-save")
    # The image's own iptables-save now reads the same variant.
    assert f"-A {WEB_CHAIN}" in in_image(image, netns, "iptables-save", "-t", "nat").stdout


@pytest.mark.kernel
def test_iptables_mode_follows_a_legacy_node(image: Path, netns: str) -> None:
    """A node whose kubelet uses iptables-legacy: its hint chain sends the image there too."""
    in_netns(netns, "iptables-legacy", "-t", "mangle", "-N", "KUBE-IPTABLES-HINT")
    run_once(image, netns)
    assert variant(image) == "/usr/sbin/iptables-legacy"
    saved = in_netns(netns, "iptables-legacy-save", "-t", "nat")
    assert f"-A {WEB_CHAIN}" in saved
    assert "-j KUBE-SERVICES" in saved
    assert "KUBE-SERVICES" not in in_netns(netns, "iptables-nft-save")


@pytest.mark.kernel
def test_nftables_mode_writes_the_kube_proxy_table(image: Path, netns: str) -> None:
    run_once(image, netns, "--proxy-mode=nftables")
    listed = in_netns(netns, "nft", "list", "table", "ip", "kube-proxy")
    assert f"chain {WEB_NFT_CHAIN}" in listed
    assert "chain services" in listed
    assert "KUBE-SERVICES" not in in_netns(netns, "iptables-nft-save")


@pytest.mark.kernel
def test_image_is_lean(rootfs: Path) -> None:
    """No compiler, no package caches or lists, no pip, no test suites of the dependencies."""
    usr = rootfs / "usr"
    assert not [p.name for p in (usr / "bin").glob("*") if p.name in ("gcc", "cc", "c++", "make")]
    assert not list((rootfs / "var" / "lib" / "apt" / "lists").glob("*_Packages*"))
    assert not list((rootfs / "var" / "cache" / "apt").rglob("*.deb"))
    site = usr / "local" / "lib"
    assert not list(site.glob("python3*/dist-packages/pip"))
    assert not list(site.glob("python3*/dist-packages/*/tests"))


@pytest.mark.kernel
@pytest.mark.parametrize(
    ("hint_tool", "expected"),
    [("iptables-legacy", "legacy"), ("iptables-nft", "nft")],
)
def test_wrapper_detects_the_variant_holding_kubelets_hint(
    netns: str, hint_tool: str, expected: str
) -> None:
    """The wrapper's detection on real kernel state (the host's iptables variants)."""
    if shutil.which("iptables-legacy") is None or shutil.which("iptables-nft") is None:
        pytest.skip("needs both iptables-legacy and iptables-nft")
    in_netns(netns, hint_tool, "-t", "mangle", "-N", "KUBE-KUBELET-CANARY")
    assert in_netns(netns, "sh", str(WRAPPER), "detect").strip() == expected


@pytest.mark.kernel
def test_wrapper_counts_rules_without_a_hint(netns: str) -> None:
    if shutil.which("iptables-legacy") is None:
        pytest.skip("needs iptables-legacy")
    assert in_netns(netns, "sh", str(WRAPPER), "detect").strip() == "nft"  # empty: nft
    in_netns(netns, "iptables-legacy", "-A", "INPUT", "-s", "192.0.2.1", "-j", "ACCEPT")
    assert in_netns(netns, "sh", str(WRAPPER), "detect").strip() == "legacy"
