"""The ``kubeplex`` and ``kube-proxy`` commands.

Before any of their modules defines a class, ``@dataclass`` compiles through the methods kept
when the image was built (:mod:`kubeplex.core.startup.codecache`).
"""

from kubeplex.core.startup import codecache

codecache.install()
