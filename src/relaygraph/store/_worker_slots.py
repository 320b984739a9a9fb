"""The worker mode's pool processes and their free slots: how many tasks the publishers keep
waiting in the broker.

Each prefork child of a ``relaygraph worker`` reports itself here every
:data:`WORKER_REPORT_SECONDS` while it lives (:meth:`WorkerSlotRepository.report_worker_slots`)
and forgets itself when it stops. A child not heard from for :data:`WORKER_GONE_SECONDS` is
taken for gone (killed, its host lost). The free slots are the live children's slots less
the tasks running on workers: as many tasks as may start at once, and no more, wait in the
broker, so a project's new task waits there behind no more of another project's tasks than
the workers can take now (the rest wait in the ledger, to be picked fairly).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import Connection, bindparam, delete, func, insert, select, update

from relaygraph.store._core import LedgerCore
from relaygraph.store._models import TaskRow, WorkerSlotRow
from relaygraph.store._task_rows import utc_now

__all__ = [
    "WORKER_GONE_SECONDS",
    "WORKER_REPORT_SECONDS",
    "WorkerSlotRepository",
    "free_worker_slots",
]

WORKER_REPORT_SECONDS = 5.0
"""How often a worker's pool process reports that it lives."""
WORKER_GONE_SECONDS = 3 * WORKER_REPORT_SECONDS
"""A pool process not heard from for this long is gone: two reports may be late (a busy
database, a pause) before its slots stop counting."""

_LIVE_SLOTS = select(func.sum(WorkerSlotRow.slots)).where(
    WorkerSlotRow.seen_at >= bindparam("since")
)
_RUNNING_ON_WORKERS = select(func.count()).where(TaskRow.status == "running", TaskRow.dispatch > 0)
_REPORT = (
    update(WorkerSlotRow)
    .where(WorkerSlotRow.worker_id == bindparam("worker"))
    .values(slots=bindparam("slots"), seen_at=bindparam("now"))
)


def free_worker_slots(connection: Connection, *, now: datetime) -> int | None:
    """The live pool processes' slots less the tasks running on workers (0 at least); None
    when no pool process reported itself lately (none started yet)."""
    live = connection.execute(_LIVE_SLOTS, {"since": now - timedelta(seconds=WORKER_GONE_SECONDS)})
    slots = live.scalar()
    if slots is None:
        return None
    running = int(connection.execute(_RUNNING_ON_WORKERS).scalar() or 0)
    return max(int(slots) - running, 0)


class WorkerSlotRepository:
    """The reports of the worker mode's pool processes."""

    def __init__(self, core: LedgerCore) -> None:
        self._core = core

    def report_worker_slots(
        self, worker_id: str, *, slots: int, now: datetime | None = None
    ) -> None:
        """Record that the pool process ``worker_id`` lives and runs ``slots`` tasks at once
        (each report renews it for :data:`WORKER_GONE_SECONDS`; ``now``: the report's time,
        the clock's when None)."""
        now = now or utc_now()
        values = {"worker": worker_id[:64], "slots": slots, "now": now}
        with self._core.write_connection() as connection:
            # Only the process itself writes its row: an update, then an insert the first
            # time, cannot race with another writer of the same row.
            if connection.execute(_REPORT, values).rowcount == 0:
                connection.execute(
                    insert(WorkerSlotRow).values(
                        worker_id=values["worker"], slots=slots, seen_at=now
                    )
                )
            # Rows of processes long gone (killed, never forgot themselves) go with it.
            connection.execute(
                delete(WorkerSlotRow).where(WorkerSlotRow.seen_at < now - timedelta(hours=1))
            )

    def forget_worker_slots(self, worker_id: str) -> None:
        """The pool process ``worker_id`` stops: its slots no longer count."""
        with self._core.write_connection() as connection:
            connection.execute(
                delete(WorkerSlotRow).where(WorkerSlotRow.worker_id == worker_id[:64])
            )
