"""The ``kubeplex`` and ``kube-proxy`` commands.

Before any of their modules defines a class: ``@dataclass`` compiles through the code kept
from the last start (:mod:`kubeplex.core.cli.codecache`).
"""

from kubeplex.core.cli import codecache

codecache.install()
