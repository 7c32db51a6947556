"""What importing the API source costs: the client's REST part and one config loader, not the
whole ``kubernetes`` package; and whoever wants the rest of that package still gets it."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import sys
import kubeplex.core.sources.kubeapi as kubeapi
heavy = ("kubernetes.dynamic", "kubernetes.stream", "kubernetes.watch", "kubernetes.informer",
         "kubernetes.leaderelection", "kubernetes.config.kube_config", "jsonschema",
         "kubernetes.utils.create_from_yaml")
print(sorted(m for m in heavy if m in sys.modules))
from kubernetes import config
print(callable(config.load_kube_config), callable(config.load_incluster_config))
import kubernetes
print(bool(kubernetes.__version__), "kubernetes.dynamic" in sys.modules)
from kubernetes import client, watch
print(client.CoreV1Api.__name__, watch.Watch.__name__)
from kubernetes import utils
print(callable(utils.create_from_yaml), callable(utils.parse_quantity))
try:
    kubernetes.no_such_thing
except AttributeError as err:
    print("AttributeError", err)
"""


def test_the_source_imports_only_what_it_uses_and_the_rest_stays_importable() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out == [
        "[]",
        "True True",
        "True True",
        "CoreV1Api Watch",
        "True True",
        "AttributeError module 'kubernetes' has no attribute 'no_such_thing'",
    ]
