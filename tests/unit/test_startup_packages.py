"""The ``kubernetes`` packages registered without their ``__init__``: only what kubeplex imports
is loaded, whoever uses the rest of such a package still gets it, from any thread."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from kubeplex.core.startup import SWITCH

CHECK = """
import sys
import kubeplex.core.sources.kubeclient
heavy = ("kubernetes.dynamic", "kubernetes.watch", "kubernetes.stream",
         "kubernetes.leaderelection", "kubernetes.config.kube_config")
print(sorted(m for m in heavy if m in sys.modules))
import kubernetes
print(callable(kubernetes.config.load_kube_config), kubernetes.watch.Watch.__name__)
try:
    kubernetes.no_such_thing
except AttributeError as err:
    print("AttributeError", err)
"""


def python(code: str, **env: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.splitlines()


def test_the_client_imports_only_what_it_uses_and_the_rest_stays_importable() -> None:
    assert python(CHECK) == [
        "[]",
        "True Watch",
        "AttributeError module 'kubernetes' has no attribute 'no_such_thing'",
    ]


def test_with_the_tricks_off_the_packages_are_imported_whole() -> None:
    assert python(CHECK, **{SWITCH: "0"})[0] != "[]"


#: Four threads use a package registered bare at once: each must find what its ``__init__``
#: defines, though it has not run when they ask.
THREADS = """
import threading
from kubeplex.core.startup.packages import register_bare
register_bare("kubernetes", "kubernetes.config")
import kubernetes.config
start = threading.Barrier(4)
errors = []
def touch():
    start.wait()
    try:
        kubernetes.config.load_kube_config
    except AttributeError as err:
        errors.append(err)
threads = [threading.Thread(target=touch) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(len(errors), "__getattr__" in vars(kubernetes.config))
"""


def test_threads_using_a_package_registered_bare_all_find_it_complete() -> None:
    with ThreadPoolExecutor(2) as pool:
        outcomes = list(pool.map(lambda _: python(THREADS), range(40)))
    assert outcomes == [["0 False"]] * 40


def test_what_is_imported_already_or_not_a_package_is_left_alone() -> None:
    code = (
        "import json, sys\n"
        "from kubeplex.core.startup.packages import register_bare\n"
        "before = sys.modules['json']\n"
        "register_bare('json', 'no_such_package_here', 'no_such_package_here.x',"
        " 'json.decoder', 'xml')\n"
        "print(sys.modules['json'] is before, 'no_such_package_here' in sys.modules)\n"
        "print('__getattr__' in vars(sys.modules['xml']))\n"
        "import xml.dom.minidom\n"
        "print(callable(xml.dom.minidom.parseString))"
    )
    # A name that is no package here does not stop the ones after it.
    assert python(code) == ["True False", "True", "True"]
