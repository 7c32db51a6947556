"""``python -m kubeplex.testing.conformance MODE [--kernel] [--plugins FILE] [--only CHECK]``."""

import sys

from kubeplex.testing.conformance.runner import main

sys.exit(main())
