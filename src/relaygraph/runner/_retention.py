"""Retention: the files of tasks that ended long ago are deleted; their ledger records stay.

``RELAYGRAPH_RETENTION_DAYS`` has the server delete the workspaces of tasks that ended more
than that many days ago, every :data:`RETENTION_SWEEP_SECONDS` (with
``RELAYGRAPH_RETENTION_ARTIFACTS=true``, their artifacts too); ``relaygraph gc`` does the
same on demand. Only ended tasks' folders are touched, and they are deleted without
following a symlink the sandbox may have planted (``backends.workspace.delete_folder``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from relaygraph._home import TASKS_FOLDER
from relaygraph.backends.workspace import delete_folder
from relaygraph.store import Ledger

__all__ = ["RETENTION_SWEEP_SECONDS", "Freed", "collect_garbage"]

RETENTION_SWEEP_SECONDS = 3600.0
"""How often a server with ``RELAYGRAPH_RETENTION_DAYS`` looks for files to delete."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Freed:
    """What one collection deleted."""

    tasks: int = 0
    """Tasks that had files deleted."""
    files: int = 0
    """Files and folders deleted."""
    bytes: int = 0
    """Bytes they held on disk."""
    task_ids: Sequence[str] = field(default=())

    def to_json(self) -> dict[str, object]:
        return {
            "tasks": self.tasks,
            "files": self.files,
            "bytes": self.bytes,
            "task_ids": list(self.task_ids),
        }


def collect_garbage(
    ledger: Ledger,
    home: Path,
    *,
    older_than_days: float,
    artifacts: bool = False,
    now: datetime | None = None,
) -> Freed:
    """Delete the workspaces (with ``artifacts``: and the artifacts) of the tasks that
    ended more than ``older_than_days`` days before ``now``.

    Args:
        ledger: Says which tasks ended when; its records are left as they are.
        home: The data directory.
        older_than_days: Days since a task ended.
        artifacts: Delete the artifacts too.
        now: The present (the clock when None).
    """
    cutoff = (now or datetime.now(UTC)) - timedelta(days=older_than_days)
    tasks = files = size = 0
    cleared: list[str] = []
    for task_id in ledger.tasks_ended_before(cutoff):
        task_dir = home / TASKS_FOLDER / task_id
        folders = [task_dir / "workspace", *([task_dir / "artifacts"] if artifacts else [])]
        present = [f for f in folders if f.is_dir() and not f.is_symlink()]
        if not present:
            continue
        for folder in present:
            usage = delete_folder(folder)
            files += usage.files + 1
            size += usage.bytes
        tasks += 1
        cleared.append(task_id)
    return Freed(tasks=tasks, files=files, bytes=size, task_ids=tuple(cleared))
