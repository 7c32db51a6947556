"""The ``kubeplex`` and ``kube-proxy`` commands.

Before any of their modules defines a class: ``@dataclass`` compiles through the code kept
from the last start (:mod:`kubeplex.core.cli.codecache`); before anything imports them, some
outside modules' patterns are compiled at first use (:mod:`kubeplex.core.cli.lazypatterns`).
"""

from kubeplex.core.cli import codecache, lazypatterns

codecache.install()
lazypatterns.install()
