"""A task process of ``serve --processes`` (``python -m relaygraph.api._task_process``): see
:mod:`relaygraph.api._processes`. A module of its own, which the package never imports, so
that running it as ``__main__`` does not run a module the package has loaded already."""

from __future__ import annotations

import logging
import sys

from relaygraph.api._processes import serve_tasks

if __name__ == "__main__":
    # As the server's own log: warnings and errors, on stderr (which it shares).
    logging.basicConfig(level=logging.WARNING)
    serve_tasks(sys.stdin)
