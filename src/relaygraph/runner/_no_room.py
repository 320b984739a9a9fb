"""The runs that stopped for lack of room on disk: each task fails once, with the reason,
even when the ledger cannot take that failure yet (the disk it writes to is the full one).

Such a run's task is left ``running`` in the ledger. Continued once room came back, it
would run its step again: the program that filled the disk would fill it again, in a loop.
So its failure is kept here, in the runner's memory, written as soon as the ledger takes
writes again, and the task is never started again meanwhile.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from relaygraph.events import run_finished_event
from relaygraph.store import AttemptSuperseded, RecordNotFound, RunEnd, is_disk_full

if TYPE_CHECKING:
    from relaygraph.store import Ledger

__all__ = ["UnrecordedFailures", "no_room_reason"]

log = logging.getLogger("relaygraph.runner")


def no_room_reason(exc: BaseException) -> str:
    """The stop reason of a run that stopped for lack of room: ``error: no room on disk:``
    and what the database or the system said."""
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    return f"error: no room on disk: {type(cause).__name__}: {cause}"


@dataclass(frozen=True, kw_only=True, slots=True)
class _Failure:
    task_id: str
    attempt: int | None
    """A worker's attempt (the writes' fencing number); None in process."""
    reason: str


class UnrecordedFailures:
    """The failures for lack of room that the ledger did not take yet, by task id."""

    def __init__(self, ledger: Ledger, runner_id: str) -> None:
        self._ledger = ledger
        self._runner_id = runner_id
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
        return self._write(failure)

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
