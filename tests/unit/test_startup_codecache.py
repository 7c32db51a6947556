"""The compiled dataclass methods kept between starts: the same code as compiled without it,
read back from the file the image's build writes, never written by a start, and a missing,
foreign or unwritable file costs only the speed."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest

from kubeplex.core.startup import SWITCH, codecache
from kubeplex.core.startup.codecache import HEADER, CodeCache

METHODS = ("__init__", "__repr__", "__eq__", "__hash__", "__setattr__", "__delattr__", "__lt__")


def define() -> list[type]:
    """Classes in the shapes kubeplex uses, defined anew at each call."""

    @dataclasses.dataclass(frozen=True)
    class Frozen:
        name: str
        port: int = 80
        tags: tuple[str, ...] = ()
        KIND: ClassVar[str] = "x"

    @dataclasses.dataclass(frozen=True, slots=True, order=True)
    class Ordered:
        a: int
        b: str = "b"

    @dataclasses.dataclass
    class Plain:
        items: list[int] = dataclasses.field(default_factory=list)
        note: str = dataclasses.field(default="", repr=False)

        def __post_init__(self) -> None:
            self.items.append(len(self.items))

    @dataclasses.dataclass(slots=True, kw_only=True)
    class KeywordOnly:
        later: Forward | None = None

    return [Frozen, Ordered, Plain, KeywordOnly]


class Forward:
    pass


def hooked(cache: CodeCache, monkeypatch: pytest.MonkeyPatch) -> Callable[[], list[type]]:
    monkeypatch.setattr(dataclasses, "exec", cache.exec, raising=False)
    return define


def functions(cls: type) -> dict[str, Any]:
    return {m: cls.__dict__[m] for m in METHODS if callable(cls.__dict__.get(m))}


def test_the_code_is_what_dataclasses_compiles_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(dataclasses, "exec", raising=False)  # the command line's own hook
    plain = define()
    cache = CodeCache(str(tmp_path / "cache"))
    cached = hooked(cache, monkeypatch)()
    assert cache.compiled >= 12 and len(cache.used) == cache.compiled
    for a, b in zip(plain, cached, strict=True):
        fa, fb = functions(a), functions(b)
        assert fa.keys() == fb.keys() and "__init__" in fa
        for name in fa:
            assert fa[name].__code__ == fb[name].__code__, (a.__name__, name)
            # Compiled as dataclasses does, not with this module's ``annotations`` future.
            assert fa[name].__annotations__ == fb[name].__annotations__, (a.__name__, name)
        assert a.__doc__ == b.__doc__
    frozen, ordered, plain_cls, keyword_only = cached
    f = frozen("web")
    assert f == frozen("web", 80) and hash(f) == hash(frozen("web")) and f != frozen("db")
    assert repr(f) == "define.<locals>.Frozen(name='web', port=80, tags=())"
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.port = 81  # type: ignore[misc]
    assert ordered(1) < ordered(2, "a")
    assert plain_cls().items == [0] and "note" not in repr(plain_cls(note="n"))
    with pytest.raises(TypeError):
        keyword_only(Forward())


def test_a_saved_cache_compiles_nothing_the_next_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "pycache" / "methods.marshal"
    first = CodeCache(str(path))
    hooked(first, monkeypatch)()
    assert first.save() and path.read_bytes().startswith(HEADER)
    assert not list(path.parent.glob("*.tmp"))

    again = CodeCache(str(path))
    assert again.loaded.keys() == first.used.keys()
    frozen = hooked(again, monkeypatch)()[0]
    assert again.compiled == 0 and len(again.used) == len(first.used)
    assert frozen("a") == frozen("a") and repr(frozen("a")).endswith("(name='a', port=80, tags=())")
    assert not again.save()  # nothing new: not written again


def test_what_was_kept_stays_beside_what_this_start_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "cache")
    seed = CodeCache(path)
    seed.exec("x = 1", {})
    assert seed.save()
    cache = CodeCache(path)
    hooked(cache, monkeypatch)()
    assert cache.save()
    assert CodeCache(path).loaded.keys() == {"x = 1", *cache.used}

    # Past the bound only this start's sources are kept.
    monkeypatch.setattr(codecache, "MAX_ENTRIES", len(cache.used))
    cache = CodeCache(path)
    cache.exec("y = 2", {})
    assert cache.save()
    assert CodeCache(path).loaded.keys() == {"y = 2"}


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"not a cache",
        HEADER[:-4] + b"\x00\x00\r\n" + b"\x00",  # another interpreter's bytecode
        HEADER + b"\xff\x00",  # broken
        HEADER + b"N",  # marshal's None, not a dict
    ],
)
def test_a_file_of_another_kind_is_ignored_and_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: bytes
) -> None:
    path = tmp_path / "cache"
    path.write_bytes(content)
    cache = CodeCache(str(path))
    assert cache.loaded == {}
    frozen = hooked(cache, monkeypatch)()[0]
    assert frozen("a").port == 80 and cache.compiled > 0
    assert cache.save() and CodeCache(str(path)).loaded.keys() == cache.used.keys()


def test_a_file_that_cannot_be_written_is_an_error(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    unwritable = CodeCache(str(blocked / "cache"))  # its folder cannot be made
    unwritable.exec("x = 1", {})
    with pytest.raises(OSError):
        unwritable.save()
    assert blocked.read_text() == ""
    assert not CodeCache(None).save()


def test_exec_runs_what_it_is_given_as_the_builtin_does() -> None:
    cache = CodeCache(None)
    ns: dict[str, Any] = {}
    cache.exec("def f(a: int) -> int:\n    return a + 1\n", ns)
    assert ns["f"](1) == 2 and ns["f"].__annotations__ == {"a": int, "return": int}
    cache.exec(compile("g = 2", "<string>", "exec"), ns)
    cache.exec(b"h = 3", ns)
    local: dict[str, Any] = {}
    cache.exec("i = g + h", ns, local)
    assert (ns["g"], ns["h"], local) == (2, 3, {"i": 5})
    assert cache.compiled == 2  # the code object is not compiled, bytes are not kept


#: A command's start, then its end: what it compiled and loaded, and whether it still hooks.
START = (
    "import dataclasses\n"
    "import kubeplex.core.cli.main\n"
    "from kubeplex.core.startup import codecache\n"
    "cache = codecache._active\n"
    "hooked = cache is not None and dataclasses.exec == cache.exec\n"
    "print(cache.compiled if cache else '-', len(cache.loaded) if cache else '-', hooked)\n"
    "assert codecache.done() is cache and 'exec' not in vars(dataclasses)\n"
)


def start(env: dict[str, str]) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", START], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.split()


def test_a_start_reads_what_the_build_step_wrote_and_writes_nothing(tmp_path: Path) -> None:
    """Starts with their bytecode under a prefix, where no build step wrote the cache: they
    compile and write nothing; after the build step, a start compiles no dataclass method."""
    env = dict(os.environ, PYTHONPYCACHEPREFIX=str(tmp_path))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    for _ in range(2):
        compiled, loaded, hooked = start(env)
        assert int(compiled) > 0 and loaded == "0" and hooked == "True"
        assert not list(tmp_path.rglob("dataclass-methods.*"))
    warm = [sys.executable, "-m", "kubeplex.core.cli.warm_cache"]
    subprocess.run(warm, env=env, check=True, capture_output=True)
    (path,) = tmp_path.rglob("dataclass-methods.*.marshal")
    assert path.parent.name == "core"  # under the prefix, as the modules' bytecode
    compiled, loaded, hooked = start(env)
    assert compiled == "0" and int(loaded) > 0


def test_with_the_tricks_off_dataclasses_compile_as_they_do(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPYCACHEPREFIX=str(tmp_path), **{SWITCH: "0"})
    assert start(env) == ["-", "-", "False"]
    warm = [sys.executable, "-m", "kubeplex.core.cli.warm_cache"]
    assert subprocess.run(warm, env=env, capture_output=True).returncode != 0


def test_warm_keeps_what_every_start_of_every_mode_compiles(tmp_path: Path) -> None:
    """An image's build: then a daemon's imports in any mode compile nothing."""
    # (as an image's build may: warm() writes all the same)
    env = dict(os.environ, PYTHONPYCACHEPREFIX=str(tmp_path), PYTHONDONTWRITEBYTECODE="1")
    warm = "from kubeplex.core.cli.warm_cache import warm; print(warm())"
    start = (
        "import kubeplex.core.cli.main, kubeplex.core.cli.run, kubeplex.core.sources.kubeapi\n"
        "import kubeplex.core.daemon.operations\n"
        "from kubeplex.core.startup import codecache\n"
        "from kubeplex.core.daemon.modes import platform_modes\n"
        "from kubeplex.core.dataplane.plugins import load_backend_class\n"
        "modes = platform_modes()\n"
        "for mode in modes:\n"
        "    load_backend_class(mode)\n"
        "print(len(modes), codecache._active.compiled, len(codecache._active.used))\n"
    )

    def run(code: str) -> list[int]:
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        return [int(x) for x in out.stdout.split()]

    (kept,) = run(warm)
    modes, compiled, used = run(start)
    assert modes >= 3 and compiled == 0 and 100 < used <= kept
