"""``python -m server.cli``: the ``lethe`` command line."""

import sys

from server.cli import main

sys.exit(main())
