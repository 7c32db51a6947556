"""Packages registered without their ``__init__``: only what kubeplex imports is loaded, and
whoever uses the rest of such a package still gets it."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import sys
import kubeplex.core.daemon.metrics as metrics
heavy = ("prometheus_client.exposition", "prometheus_client.asgi", "wsgiref.simple_server",
         "prometheus_client.bridge.graphite", "gzip")
print(sorted(m for m in heavy if m in sys.modules))
import prometheus_client
print(prometheus_client.Counter.__name__, callable(prometheus_client.generate_latest))
print(prometheus_client.REGISTRY is prometheus_client.registry.REGISTRY)
from prometheus_client import start_http_server
print(callable(start_http_server))
try:
    prometheus_client.no_such_thing
except AttributeError as err:
    print("AttributeError", err)
"""


def test_metrics_import_only_what_they_use_and_the_rest_stays_importable() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out == [
        "[]",
        "Counter True",
        "True",
        "True",
        "AttributeError module 'prometheus_client' has no attribute 'no_such_thing'",
    ]


def test_what_is_imported_already_or_not_a_package_is_left_alone() -> None:
    code = (
        "import prometheus_client, sys\n"
        "from kubeplex.core.packages import register_bare\n"
        "before = sys.modules['prometheus_client']\n"
        "register_bare('prometheus_client', 'no_such_package_here', 'no_such_package_here.x',"
        " 'json.decoder', 'xml')\n"
        "print(sys.modules['prometheus_client'] is before, 'no_such_package_here' in sys.modules)\n"
        "print('__getattr__' in vars(sys.modules['xml']))\n"
        "import xml.dom.minidom\n"
        "print(callable(xml.dom.minidom.parseString))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    # A name that is no package here does not stop the ones after it.
    assert out == ["True", "False", "True", "True"]
