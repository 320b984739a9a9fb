"""Tasks and threads: creating a task (idempotently), reading and listing them, their status."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import Connection, Select, Table, and_, bindparam, func, insert, or_, select
from sqlalchemy.exc import IntegrityError

from relaygraph.errors import ConfigError
from relaygraph.store import _cursor
from relaygraph.store import _validate as check
from relaygraph.store._errors import RecordConflict, RecordNotFound
from relaygraph.store._models import (
    ProjectRow,
    TaskRow,
)
from relaygraph.store._quotas import refuse_over_quota
from relaygraph.store._records import (
    ACTIVE_STATUSES,
    FINISHED_STATUSES,
    TASK_STATUSES,
    Quotas,
    Task,
)
from relaygraph.store._repository import Repository
from relaygraph.store._task_rows import (
    TASK_COLUMNS,
    apply_status,
    check_attempt,
    no_live_lease,
    status_values,
    task_of_mapping,
    task_of_row,
    utc_now,
)


class TaskRepository(Repository):
    """Tasks and threads: creating a task (idempotently), reading and listing them, their status."""

    def create_task(
        self,
        *,
        project_id: str,
        input: str,
        thread_id: str | None = None,
        policy: Mapping[str, Any] | None = None,
        models: Mapping[str, str] | None = None,
        topology: Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        team: Mapping[str, Any] | None = None,
        runner_id: str | None = None,
        lease_seconds: float | None = None,
        quotas: Quotas | None = None,
        replay_of: str | None = None,
        from_step: int | None = None,
        task_id: str | None = None,
    ) -> tuple[Task, bool]:
        """Record a new ``queued`` task, or find the one an earlier try created.

        With ``runner_id`` and ``lease_seconds``, a new task is recorded ``running`` under
        that runner's lease instead, as :meth:`take_lease` would leave it (one attempt,
        ``started_at`` stamped), in the same transaction: for a caller that runs the task
        at once (``run_task``), which then takes no lease of its own, and no other server
        can pick the task up meanwhile. A task an earlier try created is returned as it is.

        Args:
            project_id: The owning project (``LOCAL_PROJECT_ID`` for the CLI).
            input: What the team is asked to do.
            thread_id: The conversation to continue; a new one when None.
            policy: The team policy the task runs under, as a JSON object.
            models: The model spec of each role.
            topology: How the agents are arranged, as ``Topology.to_mapping`` writes it.
            metadata: The caller's own JSON object, kept as given.
            idempotency_key: A retry with the same key for the same project returns the task
                the first try created.
            team: Which team definition runs it (``Team.record()``: name, version,
                digest, source).
            runner_id: The runner that holds the new task's lease (with ``lease_seconds``).
            lease_seconds: How long that lease lasts unrenewed.
            quotas: The server's quotas (the project's own, set by the operator, over
                them): a new task past its project's queued quota or daily spend is
                refused; a retry of one recorded before is not. None: no quota.
            replay_of: The task the new one replays (of the same project: the caller
                checked it), with ``from_step``, the step of its trajectory it goes on from.
            task_id: The new task's id, chosen by the caller (a replay copies the
                original's workspace to the new task's folder before it is recorded); a
                new UUID when None.

        Returns:
            The task, and True when this call created it (False: an earlier call with the
            same idempotency key did).

        Raises:
            ConfigError: A bad field, named in the message, or only one of ``runner_id``
                and ``lease_seconds``.
            RecordNotFound: No such project.
            QuotaExceeded: The project is at its queued quota or spent its day's budget.
            RecordConflict: The idempotency key was used for a different request (any of
                input, thread, policy, models, topology or metadata differs); the message
                names what differs.
        """
        given_thread = check.optional_text(thread_id, "thread_id", max_chars=255)
        if (runner_id is None) != (lease_seconds is None):
            raise ConfigError(
                f"create_task takes runner_id and lease_seconds together (got runner_id "
                f"{runner_id!r}, lease_seconds {lease_seconds!r})"
            )
        now = utc_now()
        lease_until = None if lease_seconds is None else now + timedelta(seconds=lease_seconds)
        leased = runner_id is not None and lease_until is not None
        row: dict[str, Any] = {
            "id": check.optional_text(task_id, "task_id", max_chars=36) or str(uuid.uuid4()),
            "project_id": project_id,
            "input": check.text(input, "input"),
            # Under a lease, as take_lease leaves a task it starts: running, one attempt.
            "status": "running" if leased else "queued",
            "answer": None,
            "stop_reason": None,
            "policy": None if policy is None else check.json_object(policy, "policy"),
            "models": check.json_object(models or {}, "models"),
            "topology": None if topology is None else check.json_object(topology, "topology"),
            "team": None if team is None else check.json_object(team, "team"),
            "thread_id": given_thread or str(uuid.uuid4()),
            "idempotency_key": check.optional_text(
                idempotency_key, "idempotency_key", max_chars=check.MAX_KEY_CHARS
            ),
            "metadata": check.json_object(metadata or {}, "metadata"),
            "last_event_seq": 0,
            "runner_id": runner_id,
            "lease_until": lease_until,
            "attempts": 1 if leased else 0,
            "cancel_requested_at": None,
            "dispatch": 0,
            "dispatch_attempts": 0,
            "replay_of": replay_of,
            "from_step": from_step,
            "created_at": now,
            "started_at": now if leased else None,
            "finished_at": None,
            "updated_at": now,
        }
        row["request_digest"] = _request_digest(row, given_thread)
        key = row["idempotency_key"]
        # SQLAlchemy Core, statements built once: every task starts here.
        try:
            with self._core.write_connection() as connection:
                project = connection.execute(
                    _PROJECT if quotas is None else _PROJECT_LOCKED, {"project_id": project_id}
                ).first()
                if project is None:
                    raise RecordNotFound("project", project_id)
                earlier = _by_idempotency_key(connection, project_id, key)
                if earlier is not None:
                    return _same_request(earlier, row), False
                if quotas is not None:
                    refuse_over_quota(connection, project, quotas, now=now)
                row["checkpoint_thread"] = _checkpoint_thread(
                    connection, project_id, row["thread_id"], new=given_thread is None
                )
                connection.execute(_ADD_TASK, row)
            return task_of_mapping(row), True
        except IntegrityError:
            # Another writer created the task with this key between our check and insert
            # (PostgreSQL; SQLite's writers take turns and cannot race here).
            with self._core.read_connection() as connection:
                earlier = _by_idempotency_key(connection, project_id, key)
                if earlier is None:
                    raise
                return _same_request(earlier, row), False

    def get_task(self, task_id: str, *, project_id: str) -> Task | None:
        """The task, if it belongs to ``project_id``; None otherwise, whether or not it exists."""
        # In SQLAlchemy Core, the statement built once: every served task is read by id
        # when it is handed to a worker, and every poll of a task reads it.
        return self._task_of(_TASK, {"task_id": task_id, "project_id": project_id})

    def list_tasks(
        self,
        *,
        project_id: str,
        status: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> tuple[list[Task], str | None]:
        """A page of the project's tasks, newest first.

        The cursor marks a position, not an offset: tasks created while a client pages do
        not shift later pages, so no task is seen twice or skipped.

        Returns:
            The tasks, and the cursor for the next page (None on the last page).

        Raises:
            ConfigError: An unknown status, a limit outside 1..200, or a cursor this
                method did not return.
        """
        if status is not None and status not in TASK_STATUSES:
            raise ConfigError(f"status {status!r} is not one of {', '.join(TASK_STATUSES)}")
        check.page_limit(limit)
        query = select(TaskRow).where(TaskRow.project_id == project_id)
        if status is not None:
            query = query.where(TaskRow.status == status)
        if cursor is not None:
            created_at, last_id = _cursor.decode(cursor)
            query = query.where(
                or_(
                    TaskRow.created_at < created_at,
                    and_(TaskRow.created_at == created_at, TaskRow.id < last_id),
                )
            )
        query = query.order_by(TaskRow.created_at.desc(), TaskRow.id.desc()).limit(limit + 1)
        with self._core.read() as session:
            tasks = [task_of_row(row) for row in session.scalars(query)]
        if len(tasks) <= limit:
            return tasks, None
        tasks = tasks[:limit]
        return tasks, _cursor.encode(tasks[-1].created_at, tasks[-1].id)

    def tasks_ended_before(self, cutoff: datetime) -> list[str]:
        """The ids of the tasks, of every project, that ended (succeeded, degraded, failed,
        cancelled) before ``cutoff``, oldest first: what retention may clear the files of.
        A task that ended without its end time recorded counts from its last update."""
        ended = func.coalesce(TaskRow.finished_at, TaskRow.updated_at)
        query = (
            select(TaskRow.id)
            .where(TaskRow.status.in_(FINISHED_STATUSES), ended < cutoff)
            .order_by(ended, TaskRow.id)
        )
        with self._core.read() as session:
            return list(session.scalars(query))

    def unfinished_tasks(self, *, exclude_project: str | None = None) -> list[Task]:
        """``queued`` tasks, and ``running`` ones whose runner's lease has lapsed (or that
        nobody holds), of every project but ``exclude_project``, oldest first: what a server picks
        up, at its start and from time to time after."""
        now = utc_now()
        query = select(TaskRow).where(
            or_(
                TaskRow.status == "queued",
                and_(TaskRow.status == "running", no_live_lease(now)),
            )
        )
        if exclude_project is not None:
            query = query.where(TaskRow.project_id != exclude_project)
        with self._core.read() as session:
            rows = session.scalars(query.order_by(TaskRow.created_at, TaskRow.id))
            return [task_of_row(row) for row in rows]

    def task_owner(self, task_id: str) -> str | None:
        """The project of task ``task_id``, or None when there is no such task.

        For the operator's own tools (``relaygraph trace``), which read every project's
        tasks; the API looks tasks up by project instead.
        """
        with self._core.read_connection() as connection:
            return connection.execute(_TASK_OWNER, {"task_id": task_id}).scalar()

    def task_by_idempotency_key(self, project_id: str, key: str) -> Task | None:
        """The project's task created with Idempotency-Key ``key``, if any."""
        with self._core.read_connection() as connection:
            found = _by_idempotency_key(connection, project_id, key)
        return None if found is None else task_of_mapping(found)

    def thread_exists(self, thread_id: str, *, project_id: str) -> bool:
        """Whether the project has a task on ``thread_id`` (another project's use of the same id
        does not count, and is never revealed)."""
        with self._core.read() as session:
            found = session.scalar(
                select(TaskRow.id)
                .where(TaskRow.project_id == project_id, TaskRow.thread_id == thread_id)
                .limit(1)
            )
            return found is not None

    def thread_topology(self, thread_id: str, *, project_id: str) -> dict[str, Any] | None:
        """The topology of the project's latest task on the thread (None: structured, or no
        task yet)."""
        with self._core.read() as session:
            return session.scalar(
                select(TaskRow.topology)
                .where(TaskRow.project_id == project_id, TaskRow.thread_id == thread_id)
                .order_by(TaskRow.created_at.desc(), TaskRow.id.desc())
                .limit(1)
            )

    def active_task_on_thread(self, thread_id: str, *, project_id: str) -> Task | None:
        """The project's oldest task on the thread that is queued, running or waiting for a
        person."""
        # Core, built once: asked before and after every served task runs.
        return self._task_of(_ACTIVE_ON_THREAD, {"project_id": project_id, "thread": thread_id})

    def _task_of(self, statement: Select[Any], parameters: Mapping[str, str]) -> Task | None:
        """The task that ``statement`` (of :data:`TASK_COLUMNS`) selects, if any."""
        with self._core.read_connection() as connection:
            found = connection.execute(statement, parameters).first()
        return None if found is None else task_of_mapping(found._mapping)

    def set_status(
        self, task_id: str, status: str, *, attempt: int | None = None, **fields: str | None
    ) -> Task:
        """Move a task to ``status``, with its ``answer`` or ``stop_reason`` if given.

        ``running`` stamps ``started_at`` the first time; a finished status
        (succeeded, degraded, failed, cancelled) stamps ``finished_at``.

        Args:
            attempt: The worker's attempt that writes: the status is set only while the
                task is still on it (see ``append_events``). None: unfenced.

        Raises:
            ConfigError: An unknown status or field.
            RecordNotFound: No such task.
            AttemptSuperseded: The task is on another attempt than ``attempt``.
        """
        values = status_values(status, fields)
        with self._core.write() as session:
            row = session.get(TaskRow, task_id, with_for_update=True)
            if row is None:
                raise RecordNotFound("task", task_id)
            check_attempt(row, attempt)
            apply_status(row, values)
            return task_of_row(row)

    def count_tasks_by_status(self) -> dict[str, int]:
        """How many tasks of every project have each status (every status named, 0 too):
        what the service's ``/metrics`` reports."""
        with self._core.read() as session:
            counted = session.execute(
                select(TaskRow.status, func.count()).group_by(TaskRow.status)
            ).all()
        counts: dict[str, int] = dict.fromkeys(TASK_STATUSES, 0)
        counts.update({status: int(count) for status, count in counted})
        return counts

    def oldest_queued_at(self) -> datetime | None:
        """Since when the task that has waited longest of those ``queued`` in any project
        waits (its submission, or the decision that handed it to the workers again); None
        when none waits. A queue that does not move shows here first."""
        with self._core.read() as session:
            # A queued task's row changes when it is queued and next when it starts (or is
            # cancelled), so its updated_at is when it was queued.
            return session.scalar(
                select(func.min(TaskRow.updated_at)).where(TaskRow.status == "queued")
            )


_PROJECT = select(
    ProjectRow.id, ProjectRow.name, ProjectRow.max_queued, ProjectRow.daily_cost_usd
).where(ProjectRow.id == bindparam("project_id"))
_PROJECT_LOCKED = _PROJECT.with_for_update(key_share=True)
"""The project's row, locked against another submission of the project (not against its
tasks' own writes) on PostgreSQL until the new task is recorded: its queued count and
spend are read and the task added as one step, so two submissions cannot both take the
last place under the quota. SQLite's writers take turns anyway."""
_ADD_TASK = insert(cast("Table", TaskRow.__table__))
_BY_IDEMPOTENCY_KEY = select(*TASK_COLUMNS, TaskRow.request_digest).where(
    TaskRow.project_id == bindparam("project_id"), TaskRow.idempotency_key == bindparam("key")
)
_TASK = select(*TASK_COLUMNS).where(
    TaskRow.id == bindparam("task_id"), TaskRow.project_id == bindparam("project_id")
)
_TASK_OWNER = select(TaskRow.project_id).where(TaskRow.id == bindparam("task_id"))
_ACTIVE_ON_THREAD = (
    select(*TASK_COLUMNS)
    .where(
        TaskRow.project_id == bindparam("project_id"),
        TaskRow.thread_id == bindparam("thread"),
        TaskRow.status.in_(ACTIVE_STATUSES),
    )
    .order_by(TaskRow.created_at, TaskRow.id)
    .limit(1)
)
_THREAD_CHECKPOINTS = (
    select(TaskRow.checkpoint_thread)
    .where(TaskRow.project_id == bindparam("project_id"), TaskRow.thread_id == bindparam("thread"))
    .limit(1)
)


def _checkpoint_thread(
    connection: Connection, project_id: str, thread_id: str, *, new: bool
) -> str:
    """The checkpointer's thread for the project's ``thread_id``: the one its earlier tasks
    used, else a new one (``new``: the thread id was made for this task, and has none).
    Never the bare thread id: another project may use it."""
    if new:
        return new_checkpoint_thread(project_id, thread_id)
    earlier = connection.execute(
        _THREAD_CHECKPOINTS, {"project_id": project_id, "thread": thread_id}
    ).scalar()
    return earlier or new_checkpoint_thread(project_id, thread_id)


def new_checkpoint_thread(project_id: str, thread_id: str) -> str:
    """The checkpointer's thread of the project's new thread ``thread_id`` (a replay copies
    its fork there before the task that runs on it is recorded)."""
    return f"{project_id}/{thread_id}"


def _by_idempotency_key(
    connection: Connection, project_id: str, key: str | None
) -> Mapping[Any, Any] | None:
    """The project's task created with ``key`` (its row, with its request digest)."""
    if key is None:
        return None
    found = connection.execute(_BY_IDEMPOTENCY_KEY, {"project_id": project_id, "key": key})
    row = found.first()
    return None if row is None else row._mapping


_REQUEST_FIELDS = (
    *("team", "input", "thread_id", "policy", "models", "topology", "metadata"),
    *("replay_of", "from_step"),
)


def _request_fields(row: Mapping[str, Any], thread_id: str | None) -> dict[str, Any]:
    # The team enters only when there is one, so the digests of tasks recorded before
    # teams were recorded stay what they were.
    return {
        **({"team": row["team"]} if row["team"] is not None else {}),
        "input": row["input"],
        "thread_id": thread_id,
        "policy": row["policy"],
        "models": row["models"],
        "topology": row["topology"],
        "metadata": row["metadata"],
        # A replay's digest names what it replays and from where, so that one key cannot
        # name a task and a replay, or replays from two steps; a task that replays nothing
        # keeps the digest it had before replays were recorded.
        **(
            {"replay_of": row["replay_of"], "from_step": row["from_step"]}
            if row.get("replay_of") is not None
            else {}
        ),
    }


def _request_digest(row: Mapping[str, Any], thread_id: str | None) -> str:
    """A digest of everything a request asks: an idempotency key names one request."""
    text = json.dumps(
        _request_fields(row, thread_id), sort_keys=True, separators=(",", ":"), default=str
    )
    return hashlib.sha256(text.encode()).hexdigest()


def _canonical(value: Any) -> str:
    """``value`` as the digest writes it: ``1`` and ``1.0`` are two requests there."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def _differences(mine: Mapping[str, Any], theirs: Mapping[str, Any]) -> list[str]:
    """The request fields that differ, as the digest sees them; in ``metadata``, the keys
    (``metadata.policy_source``, which the server adds for a request's policy, is told
    apart from the caller's own keys)."""
    differs = []
    for name in _REQUEST_FIELDS:
        one, other = mine.get(name), theirs.get(name)
        if _canonical(one) == _canonical(other):
            continue
        if name == "metadata" and isinstance(one, Mapping) and isinstance(other, Mapping):
            keys = sorted(
                key
                for key in {*one, *other}
                if key not in one
                or key not in other
                or _canonical(one[key]) != _canonical(other[key])
            )
            differs += [f"metadata.{key}" for key in keys]
        else:
            differs.append(name)
    return differs


def _same_request(stored: Mapping[str, Any], new: Mapping[str, Any]) -> Task:
    """The task ``stored`` when ``new`` asks the same; else the conflict, naming what
    differs (the IETF idempotency-key draft and Stripe answer a reused key with another
    body so)."""
    earlier = task_of_mapping(stored)
    if stored["request_digest"] is None:  # Recorded before digests: the input decides.
        differs = [] if earlier.input == new["input"] else ["input"]
    elif stored["request_digest"] == new["request_digest"]:
        differs = []
    else:
        mine, theirs = _request_fields(new, None), _request_fields(stored, None)
        # The thread is left out here: a request that named none got a new one. When
        # nothing else differs, the requests named different threads (or one named none).
        differs = _differences(mine, theirs) or ["thread_id"]
    if differs:
        raise RecordConflict(
            "task",
            earlier.id,
            f"idempotency key {new['idempotency_key']!r} was used for task {earlier.id} with "
            f"a different request ({', '.join(differs)} differ); use a new key for a new request",
        )
    return earlier
