"""The ``relaygraph`` command with a trace of what a worker's processes do, for the cluster tests.

Run as ``python -m tests.worker_trace worker --concurrency N ...`` (the ``relaygraph``
command's arguments). Celery's signals, connected here before the worker starts (and so in
its prefork pool processes too), append one JSON line each to ``$WORKER_TRACE``: ``ready``
from the worker's main process once it consumes, ``prerun`` when a pool process takes a
``relaygraph.run_task`` (with the ledger's task id and dispatch number) and ``postrun`` when
its run returns, whether it ended, paused, raised or was refused. Each line carries its
process's pid and parent pid, so a test knows which worker holds a task (to kill or freeze
it) and when a run is over, from the worker itself rather than from timing.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from celery import signals

from relaygraph.cli import main


def record(kind: str, **fields: Any) -> None:
    """Append one JSON line to the trace (one ``write``: lines of processes never mix)."""
    path = os.environ.get("WORKER_TRACE")
    if not path:
        return
    line = {"kind": kind, "t": time.time(), "pid": os.getpid(), "ppid": os.getppid(), **fields}
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


def _run_fields(args: Any) -> dict[str, Any]:
    task_id, dispatch, *_ = [*list(args or ()), None, None]
    return {"task_id": task_id, "dispatch": dispatch}


@signals.worker_ready.connect
def _ready(sender: Any = None, **_: Any) -> None:
    record("ready", hostname=getattr(sender, "hostname", None))


@signals.task_prerun.connect
def _prerun(task_id: str | None = None, args: Any = None, **_: Any) -> None:
    record("prerun", celery_id=task_id, **_run_fields(args))


@signals.task_postrun.connect
def _postrun(task_id: str | None = None, args: Any = None, state: Any = None, **_: Any) -> None:
    record("postrun", celery_id=task_id, state=state, **_run_fields(args))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
