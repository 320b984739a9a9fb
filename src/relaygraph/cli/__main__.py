"""``python -m relaygraph.cli``: the same as the ``relaygraph`` command."""

import sys

from relaygraph.cli import main

sys.exit(main())
