"""A task process of ``serve --processes`` (``python -m relaygraph.api._task_process``): see
:mod:`relaygraph.api._processes`. A module of its own, which the package never imports, so
that running it as ``__main__`` does not run a module the package has loaded already."""

from __future__ import annotations

import logging
import signal
import sys

if __name__ == "__main__":
    # SIGTERM (an operator's kill, a service manager stopping the group) stops this process
    # as the end of its stdin does: running tasks stop at their next step boundary and stay
    # `running`, to continue at the next start, rather than waiting for their leases to
    # lapse. First of all, so that no moment of the start-up dies of it instead.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

from relaygraph.api._processes import serve_tasks

if __name__ == "__main__":
    # As the server's own log: warnings and errors, on stderr (which it shares).
    logging.basicConfig(level=logging.WARNING)
    serve_tasks(sys.stdin)
