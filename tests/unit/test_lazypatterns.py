"""Patterns some outside modules compile at their top, compiled at first use: only theirs,
only from their own top, the same patterns once used, and the daemon's start compiles none of
those it does not use."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubeplex.core.cli import lazypatterns
from kubeplex.core.cli.lazypatterns import LazyPattern


def run_fresh(code: str, *args: str) -> object:
    """What ``code`` prints as JSON, run in a new interpreter (with its own imports)."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A package of two modules compiling patterns at their top, one of them in MODULES."""
    name = "lazypatterns_probe"
    root = tmp_path / name
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "other.py").write_text("import re\nOTHER = re.compile('o+')\n")
    (root / "lazy.py").write_text(
        textwrap.dedent(
            """
            import re
            import threading
            from . import other  # imported while this module executes: not lazy

            TOP = re.compile(r"(\\d+)-(\\d+)", re.ASCII)
            AGAIN = re.compile(TOP)  # a compiled pattern is passed through as re does

            class Holder:
                IN_CLASS = re.compile(b"[^a]")

            def later():
                return re.compile("x")

            seen = []
            thread = threading.Thread(target=lambda: seen.append(re.compile("t")))
            thread.start()
            thread.join()
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(lazypatterns, "MODULES", frozenset({f"{name}.lazy"}))
    lazypatterns.install()
    try:
        yield name
    finally:
        lazypatterns.uninstall()
        for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[mod]


def test_only_the_named_module_s_own_top_level_patterns_are_lazy(package: str) -> None:
    compile_before = re.compile
    lazy = __import__(f"{package}.lazy", fromlist=["*"])
    assert re.compile is compile_before  # restored once the module is done
    assert isinstance(lazy.TOP, LazyPattern) and isinstance(lazy.Holder.IN_CLASS, LazyPattern)
    assert "not compiled yet" in repr(lazy.TOP)
    # Another module imported meanwhile, another thread, a later call: compiled as ever.
    assert isinstance(lazy.other.OTHER, re.Pattern)
    assert isinstance(lazy.seen[0], re.Pattern)
    assert isinstance(lazy.later(), re.Pattern)
    # Used, it answers as the pattern compiled at once would.
    assert lazy.TOP.match("10-20").groups() == ("10", "20")
    assert lazy.TOP.flags == re.compile(r"(\d+)-(\d+)", re.ASCII).flags
    assert lazy.Holder.IN_CLASS.findall(b"abc") == [b"b", b"c"]
    assert lazy.TOP.sub(r"\2-\1", "1-2 and 3-4") == "2-1 and 4-3"
    assert "compiled" in repr(lazy.TOP) and "not" not in repr(lazy.TOP)
    assert lazy.AGAIN is lazy.TOP


def test_without_install_every_pattern_is_compiled_at_once(package: str) -> None:
    lazypatterns.uninstall()
    lazy = __import__(f"{package}.lazy", fromlist=["*"])
    assert isinstance(lazy.TOP, re.Pattern)


def test_the_module_keeps_its_loader_s_source_for_tracebacks(package: str) -> None:
    lazy = __import__(f"{package}.lazy", fromlist=["*"])
    assert "TOP = re.compile" in lazy.__loader__.get_source(f"{package}.lazy")
    assert lazy.__spec__.origin.endswith("lazy.py")


def test_two_threads_using_one_pattern_get_the_same_answers() -> None:
    pattern = LazyPattern(r"a(b+)")
    got: list[str] = []
    threads = [
        threading.Thread(target=lambda: got.append(pattern.search("xabbb").group(1)))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == ["bbb"] * 8


def test_the_listed_modules_behave_as_with_patterns_compiled_at_once() -> None:
    """YAML the pure-Python and libyaml loaders read (the resolvers, timestamps, a character
    the reader refuses) and URLs urllib3 parses, with and without the lazy patterns."""
    code = """
        import json, sys
        if sys.argv[-1] == "lazy":
            from kubeplex.core.cli import lazypatterns
            lazypatterns.install()
        import platform, yaml
        from urllib3.util import url
        from urllib3.util.ssl_ import is_ipaddress
        docs = ("a: 1\\nb: 0x1f\\nc: yes\\nd: 1.5e3\\ne: ~\\nf: 2001-12-14\\n"
                "j: [on, Off, 0o17, 1_000, .5]\\ng: '<<'\\nh: -.inf\\n")
        out = []
        for loader in (yaml.SafeLoader, yaml.CSafeLoader):
            out.append(repr(yaml.load(docs, Loader=loader)))
            try:
                yaml.load("a: \\x01", Loader=loader)
            except yaml.YAMLError as e:
                out.append(type(e).__name__)
        for u in ("https://10.96.0.1:443/api?x=1", "https://[fd00::1%25eth0]:6443/a b",
                  "http://Kube.Example:80/%7e", "https://[::1]/"):
            out.append(repr(url.parse_url(u)))
        out.append([is_ipaddress(h) for h in ("10.0.0.1", "fd00::1", "kube.example")])
        out.append(platform.python_implementation())
        print(json.dumps(out))
    """
    assert run_fresh(code, "lazy") == run_fresh(code, "eager")


def test_a_daemon_s_start_does_not_compile_what_it_does_not_use() -> None:
    """Its config read, the client's URL of the API server parsed: the pure-Python reader's
    class and urllib3's IPv6 forms are never compiled, what it used is."""
    got = run_fresh(
        """
        import json
        import kubeplex.core.cli  # installs the finder, as the commands do
        from kubeplex.core.config.kubeproxy import parse_config
        parse_config("apiVersion: kubeproxy.config.k8s.io/v1alpha1\\n"
                     "kind: KubeProxyConfiguration\\nmode: nftables\\n", "f")
        from urllib3.util import url
        url.parse_url("https://10.96.0.1:443/api/v1/services?limit=500")
        import yaml.reader
        state = lambda p: getattr(p, "_compiled", "eager") is not None
        print(json.dumps({
            "reader": state(yaml.reader.Reader.NON_PRINTABLE),
            "ipv6": state(url._IPV6_RE), "braceless": state(url._BRACELESS_IPV6_ADDRZ_RE),
            "host_port": state(url._HOST_PORT_RE),
        }))
        """
    )
    assert got == {"reader": False, "ipv6": False, "braceless": False, "host_port": True}
