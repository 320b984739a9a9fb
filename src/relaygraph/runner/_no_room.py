"""The runs that stopped for lack of room on disk: each task fails once, with the reason,
even when the ledger cannot take that failure yet (the disk it writes to is the full one).

Such a run's task is left ``running`` in the ledger. Continued once room came back, it
would run its step again: the program that filled the disk would fill it again, in a loop.
So the failure must reach the ledger, even with the disk full:

- A SQLite ledger keeps a :class:`RoomReserve` beside its file: a file of
  :data:`RESERVE_BYTES` that is deleted to make room for the failure, when the ledger
  refuses it for lack of space, and made again once there is room. The failure is then on
  the record at once, and a server restarted before room came back does not continue the
  task (a marker elsewhere could not be written either: the disk is full).
- Should the reserve not be enough (another program took the room it freed, or the
  ledger is on a database server whose disk is full), the failure is kept in the runner's
  memory and written as soon as the ledger takes writes again (the server's sweep; a
  worker hands it to the broker, ``relaygraph.record_no_room``, which keeps it across a
  worker's restart), and the task is never started again meanwhile.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from relaygraph.events import run_finished_event
from relaygraph.store import AttemptSuperseded, RecordNotFound, RunEnd, is_disk_full

if TYPE_CHECKING:
    from relaygraph.store import Ledger

__all__ = ["RESERVE_BYTES", "RoomReserve", "UnrecordedFailures", "no_room_reason"]

log = logging.getLogger("relaygraph.runner")


def no_room_reason(exc: BaseException) -> str:
    """The stop reason of a run that stopped for lack of room: ``error: no room on disk:``
    and what the database or the system said."""
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    return f"error: no room on disk: {type(cause).__name__}: {cause}"


RESERVE_BYTES = 1 << 20
"""The room a SQLite ledger keeps in reserve for the failures of runs stopped on a full
disk: a failure is an event and a task's end, a few pages of the database's log."""


class RoomReserve:
    """A file that holds room on a disk, to be given up for a write that must happen when
    the disk is full (the failure of the run that filled it).

    Args:
        path: The file, on the disk whose room it keeps (beside the SQLite ledger).
        size: Its size in bytes.
    """

    def __init__(self, path: Path, *, size: int = RESERVE_BYTES) -> None:
        self.path = path
        self.size = size
        self._lock = threading.Lock()

    def ensure(self) -> bool:
        """Make the reserve unless it is there; returns whether it is. A disk without the
        room leaves it missing, to be made at a later call."""
        with self._lock:
            if self.path.exists():
                return True
            partial = self.path.with_name(self.path.name + ".part")
            try:
                # Written, not allocated sparsely: a sparse file would hold no room. Made
                # under another name and renamed, so a reserve that is there is whole.
                fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                try:
                    block = b"\0" * 65536
                    for _ in range(0, self.size, len(block)):
                        os.write(fd, block)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(partial, self.path)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    partial.unlink()
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    log.warning("could not keep room in reserve at %s: %s", self.path, exc)
                return False
            return True

    def release(self) -> bool:
        """Give the reserved room up; returns whether there was any to give."""
        with self._lock:
            try:
                self.path.unlink()
            except FileNotFoundError:
                return False
            log.warning("room on disk given up from the reserve %s", self.path)
            return True


@dataclass(frozen=True, kw_only=True, slots=True)
class _Failure:
    task_id: str
    attempt: int | None
    """A worker's attempt (the writes' fencing number); None in process."""
    reason: str


class UnrecordedFailures:
    """The failures for lack of room that the ledger did not take yet, by task id."""

    def __init__(
        self, ledger: Ledger, runner_id: str, *, reserve: RoomReserve | None = None
    ) -> None:
        self._ledger = ledger
        self._runner_id = runner_id
        self.reserve = reserve
        """Room given up for a failure the ledger refused for lack of space (None: none)."""
        self._lock = threading.Lock()
        self._failures: dict[str, _Failure] = {}

    def __contains__(self, task_id: object) -> bool:
        with self._lock:
            return task_id in self._failures

    def __len__(self) -> int:
        with self._lock:
            return len(self._failures)

    def fail(self, task_id: str, *, attempt: int | None, reason: str) -> bool:
        """Record that the task failed with ``reason``: now if the ledger takes it, else
        once it does (:meth:`record`). Returns whether it was recorded now."""
        failure = _Failure(task_id=task_id, attempt=attempt, reason=reason)
        with self._lock:
            self._failures[task_id] = failure
        if self._write(failure):
            return True
        # The ledger's disk is the full one: its reserve makes the room for the failure.
        return self.reserve is not None and self.reserve.release() and self._write(failure)

    def record(self) -> int:
        """Write the failures the ledger did not take before; returns how many it took.
        A disk that is still full leaves them for the next call."""
        with self._lock:
            waiting = list(self._failures.values())
        written = 0
        for failure in waiting:
            if self._write(failure):
                written += 1
            else:
                break  # No room yet: the others would fail as well.
        return written

    def renew_leases(self, seconds: float) -> None:
        """Keep the leases of the tasks whose failure waits, so that no other runner on
        the ledger continues them meanwhile (a disk still full refuses the renewal too;
        the lease then lapses, and the failure is written first where the ledger allows)."""
        with self._lock:
            waiting = [f.task_id for f in self._failures.values() if f.attempt is None]
        for task_id in waiting:
            try:
                self._ledger.renew_lease(task_id, self._runner_id, seconds=seconds)
            except Exception as exc:
                if not is_disk_full(exc):
                    raise

    def _write(self, failure: _Failure) -> bool:
        try:
            # The event and the end in one transaction: neither is written twice.
            self._ledger.append_events(
                failure.task_id,
                [dict(run_finished_event("failed", failure.reason))],
                attempt=failure.attempt,
                end=RunEnd(
                    usage=(),
                    runner_id=self._runner_id,
                    status="failed",
                    stop_reason=failure.reason,
                ),
            )
        except (AttemptSuperseded, RecordNotFound):
            pass  # The task is another attempt's now, or gone: its end is not this run's.
        except Exception as exc:
            if not is_disk_full(exc):
                raise
            return False
        else:
            log.warning("task %s: %s", failure.task_id, failure.reason)
        with self._lock:
            self._failures.pop(failure.task_id, None)
        return True
