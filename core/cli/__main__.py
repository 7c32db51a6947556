"""``python -m kubeplex.core.cli``: the ``kubeplex`` command."""

import sys

from kubeplex.core.cli.main import main

sys.exit(main())
