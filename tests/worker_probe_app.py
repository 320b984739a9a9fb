"""A real Celery worker for tests/test_worker_app.py: relaygraph's app with a probe for a hook.

Run as ``python -m tests.worker_probe_app NAME@HOST`` with the test's ``RELAYGRAPH_*``
settings (its own queue and control exchange). The probe stands in for the runner: it
appends a line to ``$PROBE_LOG`` when a run starts and when it ends, and does not end before
the folder ``$PROBE_RELEASE`` holds a file named after the task (or ``all``), so a test
decides how long each run lasts.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from celery import signals

from relaygraph.worker import create_celery_app, load_worker_settings, worker_argv


def record(kind: str, **fields: Any) -> None:
    """Append one JSON line to the probe's log (one write: lines never interleave)."""
    line = {"kind": kind, "t": time.time(), "pid": os.getpid(), "ppid": os.getppid(), **fields}
    fd = os.open(os.environ["PROBE_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


def probe(task_id: str, dispatch: int) -> None:
    record("start", task_id=task_id, dispatch=dispatch)
    release = Path(os.environ["PROBE_RELEASE"])
    while not (release / task_id).exists() and not (release / "all").exists():
        time.sleep(0.05)
    record("end", task_id=task_id, dispatch=dispatch)


@signals.worker_ready.connect
def _ready(sender: Any, **_: Any) -> None:
    record("ready", hostname=sender.hostname)


settings = load_worker_settings()
app = create_celery_app(settings, run=probe)

if __name__ == "__main__":
    app.worker_main(worker_argv(settings, hostname=sys.argv[1]))
