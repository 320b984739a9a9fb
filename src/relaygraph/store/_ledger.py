"""The ledger: every project, task and thing that happened, in SQL."""

from __future__ import annotations

import hashlib
import json
import secrets
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, Select, and_, case, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from relaygraph.errors import ConfigError
from relaygraph.store import _cursor, _team_versions, _usage
from relaygraph.store import _validate as check
from relaygraph.store._derive import derive, event_agent
from relaygraph.store._engine import WRITE_OPTION, database_url, display_url, make_engine
from relaygraph.store._errors import RecordConflict, RecordNotFound
from relaygraph.store._migrate import current_revision, head_revision, upgrade_engine
from relaygraph.store._models import (
    ApiKeyRow,
    ApprovalRow,
    EvalCaseRow,
    EvalRunRow,
    EventRow,
    HandoffRow,
    ProjectRow,
    TaskRow,
    TeamVersionRow,
    ToolCallRow,
    UsageRow,
)
from relaygraph.store._records import (
    FINISHED_STATUSES,
    TASK_STATUSES,
    AgentUsage,
    ApiKey,
    Approval,
    EvalCaseRecord,
    EvalRunRecord,
    Event,
    Handoff,
    Project,
    Task,
    TeamVersion,
    ToolCall,
    snapshot,
)

KEY_PREFIX = "rg_"
KEY_DISPLAY_CHARS = 10
MAX_PAGE = 200
STATUS_FIELDS = ("answer", "stop_reason")
DECISIONS = ("approve", "reject", "edit")
R = TypeVar("R")


def _now() -> datetime:
    return datetime.now(UTC)


def hash_key(key: str) -> str:
    """The SHA-256 hex digest the ledger stores in place of an API key."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class Ledger:
    """The SQL record of projects, API keys, tasks and everything that happened in each task.

    Safe to share between threads: every call runs in its own short transaction. On SQLite
    writers queue for the database lock; on PostgreSQL writes to one task queue on that
    task's row, so a task's events get gap-free sequence numbers in commit order.

    Args:
        url: A SQLAlchemy URL; ``$RELAYGRAPH_DATABASE_URL`` when None, else the SQLite file
            ``ledger.sqlite`` in the data directory.

    Raises:
        ConfigError: The URL is not one the ledger can use.
    """

    def __init__(self, url: str | None = None) -> None:
        self._url = database_url(url)
        self._engine = make_engine(self._url)
        self._reader = sessionmaker(self._engine, expire_on_commit=False)
        self._writer = sessionmaker(
            self._engine.execution_options(**{WRITE_OPTION: True}), expire_on_commit=False
        )

    def __repr__(self) -> str:
        return f"Ledger({display_url(self._url)!r})"

    @property
    def url(self) -> str:
        """The database URL, password hidden."""
        return display_url(self._url)

    @property
    def dialect(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self._engine.dialect.name

    def close(self) -> None:
        """Close the connection pool; the ledger opens new connections if used again."""
        self._engine.dispose()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # Schema

    def upgrade(self, revision: str = "head") -> None:
        """Apply the shipped migrations up to ``revision``; does nothing when current."""
        upgrade_engine(self._engine, revision)

    def is_current(self) -> bool:
        """Whether the database has every shipped migration (a readiness check)."""
        return current_revision(self._engine) == head_revision()

    @contextmanager
    def _write(self) -> Iterator[Session]:
        with self._writer() as session, session.begin():
            yield session

    @contextmanager
    def _read(self) -> Iterator[Session]:
        with self._reader() as session, session.begin():
            yield session

    # Projects and keys

    def create_project(self, name: str) -> tuple[Project, str]:
        """Create a project (a tenant of the task service) and its first API key.

        Returns:
            The project and the plain key, which the ledger does not keep: show it once.

        Raises:
            ConfigError: The name is invalid.
            RecordConflict: A project of that name exists.
        """
        check.name(name, "project")
        now = _now()
        project = ProjectRow(id=str(uuid.uuid4()), name=name, created_at=now)
        try:
            with self._write() as session:
                if session.scalar(select(ProjectRow.id).where(ProjectRow.name == name)) is not None:
                    raise RecordConflict("project", name, "a project of that name exists")
                session.add(project)
                session.flush()
                _, key = self._new_key(session, project.id, now)
        except IntegrityError:
            raise RecordConflict("project", name, "a project of that name exists") from None
        return snapshot(Project, project), key

    def create_api_key(self, project_id: str) -> tuple[ApiKey, str]:
        """Give a project another API key; returns the record and the plain key (shown once)."""
        with self._write() as session:
            if session.get(ProjectRow, project_id) is None:
                raise RecordNotFound("project", project_id)
            return self._new_key(session, project_id, _now())

    def _new_key(self, session: Session, project_id: str, now: datetime) -> tuple[ApiKey, str]:
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        row = ApiKeyRow(
            id=str(uuid.uuid4()),
            project_id=project_id,
            key_hash=hash_key(key),
            prefix=key[:KEY_DISPLAY_CHARS],
            created_at=now,
        )
        session.add(row)
        return snapshot(ApiKey, row), key

    def revoke_api_key(self, key_id: str) -> ApiKey:
        """Stop a key from authenticating; the record stays for the audit trail."""
        with self._write() as session:
            row = session.get(ApiKeyRow, key_id)
            if row is None:
                raise RecordNotFound("api key", key_id)
            row.revoked_at = row.revoked_at or _now()
            return snapshot(ApiKey, row)

    def api_keys(self, project_id: str) -> list[ApiKey]:
        """A project's keys, oldest first, revoked ones included."""
        with self._read() as session:
            rows = session.scalars(
                select(ApiKeyRow)
                .where(ApiKeyRow.project_id == project_id)
                .order_by(ApiKeyRow.created_at, ApiKeyRow.id)
            )
            return [snapshot(ApiKey, row) for row in rows]

    def authenticate(self, key: str) -> Project | None:
        """The project a live API key belongs to; None for an unknown or revoked key."""
        if not isinstance(key, str) or not key.startswith(KEY_PREFIX):
            return None
        with self._read() as session:
            row = session.scalars(
                select(ProjectRow)
                .join(ApiKeyRow, ApiKeyRow.project_id == ProjectRow.id)
                .where(ApiKeyRow.key_hash == hash_key(key), ApiKeyRow.revoked_at.is_(None))
            ).first()
            return snapshot(Project, row) if row is not None else None

    def get_project(self, name: str) -> Project | None:
        with self._read() as session:
            row = session.scalars(select(ProjectRow).where(ProjectRow.name == name)).first()
            return snapshot(Project, row) if row is not None else None

    # Registered teams: each project's own named team definitions, versioned

    def register_team(
        self, project_id: str, name: str, *, definition: Mapping[str, Any], digest: str
    ) -> tuple[TeamVersion, bool]:
        """Record a version of the project's team ``name``, unless it is no change.

        Args:
            project_id: The project that registers it.
            name: The team's name, as tasks name it.
            definition: The team file's content, as a JSON object.
            digest: The built team's digest (``Team.digest``): when it is the latest
                version's, nothing is written.

        Returns:
            The version, and True when this call made it (False: the latest version is
            already this team).

        Raises:
            ConfigError: A bad field, named in the message.
            RecordNotFound: No such project.
        """
        check.name(name, "team")
        stored = check.json_object(definition, "definition")
        digest = check.text(digest, "digest", max_chars=100)
        while True:
            try:
                with self._write() as session:
                    if session.get(ProjectRow, project_id) is None:
                        raise RecordNotFound("project", project_id)
                    latest = _team_versions.latest(session, project_id, name)
                    if latest is not None and latest.digest == digest:
                        return snapshot(TeamVersion, latest), False
                    row = TeamVersionRow(
                        project_id=project_id,
                        name=name,
                        version=(latest.version if latest is not None else 0) + 1,
                        definition=stored,
                        digest=digest,
                        created_at=_now(),
                    )
                    session.add(row)
                return snapshot(TeamVersion, row), True
            except IntegrityError:
                # Another push took this version number meanwhile (PostgreSQL; SQLite's
                # writers take turns): read the latest again. Each retry follows a commit
                # by another push, so this ends.
                continue

    def team_version(
        self, project_id: str, name: str, version: int | None = None
    ) -> TeamVersion | None:
        """The project's team ``name`` at ``version`` (the latest when None), if it has one."""
        with self._read() as session:
            if version is None:
                row = _team_versions.latest(session, project_id, name)
            else:
                row = _team_versions.one(session, project_id, name, version)
            return snapshot(TeamVersion, row) if row is not None else None

    def team_versions(self, project_id: str, name: str) -> list[TeamVersion]:
        """Every version of the project's team ``name``, oldest first."""
        with self._read() as session:
            rows = _team_versions.every_version(session, project_id, name)
            return [snapshot(TeamVersion, row) for row in rows]

    def teams(self, project_id: str) -> list[TeamVersion]:
        """The latest version of each team the project registered, by name."""
        with self._read() as session:
            rows = _team_versions.latest_of_each(session, project_id)
            return [snapshot(TeamVersion, row) for row in rows]

    # Tasks

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
    ) -> tuple[Task, bool]:
        """Record a new ``queued`` task, or find the one an earlier try created.

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

        Returns:
            The task, and True when this call created it (False: an earlier call with the
            same idempotency key did).

        Raises:
            ConfigError: A bad field, named in the message.
            RecordNotFound: No such project.
            RecordConflict: The idempotency key was used for a different request (any of
                input, thread, policy, models, topology or metadata differs); the message
                names what differs.
        """
        given_thread = check.optional_text(thread_id, "thread_id", max_chars=255)
        row = TaskRow(
            id=str(uuid.uuid4()),
            project_id=project_id,
            input=check.text(input, "input"),
            status="queued",
            policy=None if policy is None else check.json_object(policy, "policy"),
            models=check.json_object(models or {}, "models"),
            topology=None if topology is None else check.json_object(topology, "topology"),
            team=None if team is None else check.json_object(team, "team"),
            thread_id=given_thread or str(uuid.uuid4()),
            idempotency_key=check.optional_text(
                idempotency_key, "idempotency_key", max_chars=check.MAX_KEY_CHARS
            ),
            meta=check.json_object(metadata or {}, "metadata"),
            last_event_seq=0,
            attempts=0,
        )
        row.request_digest = _request_digest(row, given_thread)
        try:
            with self._write() as session:
                if session.get(ProjectRow, project_id) is None:
                    raise RecordNotFound("project", project_id)
                earlier = self._by_idempotency_key(session, project_id, row.idempotency_key)
                if earlier is not None:
                    return _same_request(session, earlier, row), False
                row.checkpoint_thread = self._checkpoint_thread(session, project_id, row.thread_id)
                row.created_at = row.updated_at = _now()
                session.add(row)
            return _task(row), True
        except IntegrityError:
            # Another writer created the task with this key between our check and insert
            # (PostgreSQL; SQLite's writers take turns and cannot race here).
            with self._read() as session:
                earlier = self._by_idempotency_key(session, project_id, row.idempotency_key)
                if earlier is None:
                    raise
                return _same_request(session, earlier, row), False

    @staticmethod
    def _checkpoint_thread(session: Session, project_id: str, thread_id: str) -> str:
        """The checkpointer's thread for the project's ``thread_id``: the one its earlier
        tasks used, else a new one. Never the bare thread id: another project may use it."""
        earlier = session.scalar(
            select(TaskRow.checkpoint_thread)
            .where(TaskRow.project_id == project_id, TaskRow.thread_id == thread_id)
            .limit(1)
        )
        return earlier or f"{project_id}/{thread_id}"

    def _by_idempotency_key(
        self, session: Session, project_id: str, key: str | None
    ) -> Task | None:
        if key is None:
            return None
        found = session.scalars(
            select(TaskRow).where(TaskRow.project_id == project_id, TaskRow.idempotency_key == key)
        ).first()
        return _task(found) if found is not None else None

    def get_task(self, task_id: str, *, project_id: str) -> Task | None:
        """The task, if it belongs to ``project_id``; None otherwise, whether or not it exists."""
        with self._read() as session:
            row = session.get(TaskRow, task_id)
            return _task(row) if row is not None and row.project_id == project_id else None

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
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
            raise ConfigError(f"limit {limit!r} must be a whole number from 1 to {MAX_PAGE}")
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
        with self._read() as session:
            tasks = [_task(row) for row in session.scalars(query)]
        if len(tasks) <= limit:
            return tasks, None
        tasks = tasks[:limit]
        return tasks, _cursor.encode(tasks[-1].created_at, tasks[-1].id)

    def unfinished_tasks(self, *, exclude_project: str | None = None) -> list[Task]:
        """``queued`` tasks, and ``running`` ones whose runner's lease has lapsed (or that
        nobody holds), of every project but ``exclude_project``, oldest first: what a server picks
        up, at its start and from time to time after."""
        now = _now()
        query = select(TaskRow).where(
            or_(
                TaskRow.status == "queued",
                and_(
                    TaskRow.status == "running",
                    or_(TaskRow.lease_until.is_(None), TaskRow.lease_until < now),
                ),
            )
        )
        if exclude_project is not None:
            query = query.where(TaskRow.project_id != exclude_project)
        with self._read() as session:
            rows = session.scalars(query.order_by(TaskRow.created_at, TaskRow.id))
            return [_task(row) for row in rows]

    def task_owner(self, task_id: str) -> str | None:
        """The project of task ``task_id``, or None when there is no such task.

        For the operator's own tools (``relaygraph trace``), which read every project's
        tasks; the API looks tasks up by project instead.
        """
        with self._read() as session:
            return session.scalar(select(TaskRow.project_id).where(TaskRow.id == task_id))

    def task_by_idempotency_key(self, project_id: str, key: str) -> Task | None:
        """The project's task created with Idempotency-Key ``key``, if any."""
        with self._read() as session:
            return self._by_idempotency_key(session, project_id, key)

    # Threads: each project has its own namespace of thread ids, so every lookup names it.

    def thread_exists(self, thread_id: str, *, project_id: str) -> bool:
        """Whether the project has a task on ``thread_id`` (another project's use of the same id
        does not count, and is never revealed)."""
        with self._read() as session:
            found = session.scalar(
                select(TaskRow.id)
                .where(TaskRow.project_id == project_id, TaskRow.thread_id == thread_id)
                .limit(1)
            )
            return found is not None

    def thread_topology(self, thread_id: str, *, project_id: str) -> dict[str, Any] | None:
        """The topology of the project's latest task on the thread (None: structured, or no
        task yet)."""
        with self._read() as session:
            return session.scalar(
                select(TaskRow.topology)
                .where(TaskRow.project_id == project_id, TaskRow.thread_id == thread_id)
                .order_by(TaskRow.created_at.desc(), TaskRow.id.desc())
                .limit(1)
            )

    def active_task_on_thread(self, thread_id: str, *, project_id: str) -> Task | None:
        """The project's oldest task on the thread that is queued, running or waiting for a
        person."""
        with self._read() as session:
            row = session.scalars(
                select(TaskRow)
                .where(
                    TaskRow.project_id == project_id,
                    TaskRow.thread_id == thread_id,
                    TaskRow.status.in_(("queued", "running", "interrupted")),
                )
                .order_by(TaskRow.created_at, TaskRow.id)
                .limit(1)
            ).first()
            return _task(row) if row is not None else None

    def set_status(self, task_id: str, status: str, **fields: str | None) -> Task:
        """Move a task to ``status``, with its ``answer`` or ``stop_reason`` if given.

        ``running`` stamps ``started_at`` the first time; a finished status
        (succeeded, degraded, failed, cancelled) stamps ``finished_at``.

        Raises:
            ConfigError: An unknown status or field.
            RecordNotFound: No such task.
        """
        values = _status_values(status, fields)
        with self._write() as session:
            row = session.get(TaskRow, task_id, with_for_update=True)
            if row is None:
                raise RecordNotFound("task", task_id)
            _apply_status(row, values)
            return _task(row)

    def claim(
        self, task_id: str, status: str = "running", *, only_from: Iterable[str] = ("queued",)
    ) -> Task | None:
        """Move a task to ``status`` only if its status is one of ``only_from``, atomically.

        Two workers that claim the same task cannot both win: use it to start a queued task
        or to mark a running one ``cancelled``.

        Returns:
            The updated task, or None when its status was not in ``only_from`` (or there is
            no such task).
        """
        values = _status_values(status, {})
        allowed = tuple(only_from)
        for each in allowed:
            if each not in TASK_STATUSES:
                raise ConfigError(f"only_from status {each!r} is not a task status")
        with self._write() as session:
            claimed = session.scalar(
                update(TaskRow)
                .where(TaskRow.id == task_id, TaskRow.status.in_(allowed))
                .values(status=status, updated_at=values["updated_at"])
                .returning(TaskRow.id)
            )
            return None if claimed is None else _updated(session, task_id, values)

    # Leases: who runs a task, so that it never runs in two places at once

    def take_lease(
        self,
        task_id: str,
        runner_id: str,
        *,
        seconds: float,
        only_from: Iterable[str] = ("queued", "running", "interrupted"),
    ) -> Task | None:
        """Make ``runner_id`` the one that runs the task, for ``seconds``, and mark it running.

        Atomic: it succeeds only if the task's status is one of ``only_from``, no other
        runner holds a lease that has not lapsed yet (a runner may take its own again), and
        no cancel waits on it. A server that took over a task whose runner died, and the
        runner still alive, cannot both hold it. A runner that takes a task it did not hold
        counts one more attempt (:meth:`settle_abandoned` fails a task after too many).

        Returns:
            The task, now ``running``; None when another runner holds it, or its status is
            not one of ``only_from``, or a cancel waits on it, or there is no such task.
        """
        allowed = tuple(only_from)
        for each in allowed:
            if each not in TASK_STATUSES:
                raise ConfigError(f"only_from status {each!r} is not a task status")
        values = _status_values("running", {})
        now = values["updated_at"]
        with self._write() as session:
            taken = session.scalar(
                update(TaskRow)
                .where(
                    TaskRow.id == task_id,
                    TaskRow.status.in_(allowed),
                    TaskRow.cancel_requested_at.is_(None),
                    or_(
                        TaskRow.runner_id.is_(None),
                        TaskRow.runner_id == runner_id,
                        TaskRow.lease_until.is_(None),
                        TaskRow.lease_until < now,
                    ),
                )
                .values(
                    status="running",
                    attempts=case(
                        (TaskRow.runner_id == runner_id, TaskRow.attempts),
                        else_=TaskRow.attempts + 1,
                    ),
                    runner_id=runner_id,
                    lease_until=now + timedelta(seconds=seconds),
                    updated_at=now,
                )
                .returning(TaskRow.id)
            )
            return None if taken is None else _updated(session, task_id, values)

    def renew_lease(self, task_id: str, runner_id: str, *, seconds: float) -> bool:
        """Extend ``runner_id``'s lease on the task; False if it no longer holds it."""
        now = _now()
        with self._write() as session:
            renewed = session.scalar(
                update(TaskRow)
                .where(TaskRow.id == task_id, TaskRow.runner_id == runner_id)
                .values(lease_until=now + timedelta(seconds=seconds))
                .returning(TaskRow.id)
            )
        return renewed is not None

    def release_lease(self, task_id: str, runner_id: str) -> None:
        """Give up ``runner_id``'s lease on the task (if it holds it): another runner may
        take the task at once (a server that stopped mid-run, for the next to continue)."""
        with self._write() as session:
            session.execute(
                update(TaskRow)
                .where(TaskRow.id == task_id, TaskRow.runner_id == runner_id)
                .values(runner_id=None, lease_until=None)
            )

    def cancel_requested(self, task_id: str) -> bool:
        """Whether a cancel waits for the task's runner to act on it."""
        with self._read() as session:
            at = session.scalar(select(TaskRow.cancel_requested_at).where(TaskRow.id == task_id))
            return at is not None

    def request_cancel(self, task_id: str) -> Task:
        """Cancel the task: at once if no live runner holds it (queued, waiting for a
        person, or running under a lease that lapsed: its runner died); otherwise ask its
        runner, which sees the request at its next lease renewal and stops at the next step
        boundary. A task whose runner dies before then is cancelled by
        :meth:`settle_abandoned` once its lease lapses, never run again.

        Returns:
            The task as it is now: ``cancelled``, or still running with
            ``cancel_requested_at`` set, or finished already (unchanged).

        Raises:
            RecordNotFound: No such task.
        """
        values = _status_values("cancelled", {"stop_reason": "cancelled by request"})
        now = values["updated_at"]
        with self._write() as session:
            cancelled = session.scalar(
                update(TaskRow)
                .where(
                    TaskRow.id == task_id,
                    or_(
                        TaskRow.status.in_(("queued", "interrupted")),
                        and_(TaskRow.status == "running", _no_live_lease(now)),
                    ),
                )
                .values(
                    status="cancelled",
                    stop_reason=values["stop_reason"],
                    runner_id=None,
                    lease_until=None,
                    updated_at=now,
                )
                .returning(TaskRow.id)
            )
            if cancelled is not None:
                # Its event history ends like any run's, so a stream or an audit sees why.
                _add_finish_event(session, task_id, "cancelled", values["stop_reason"], now)
                return _updated(session, task_id, values)
            row = session.get(TaskRow, task_id, with_for_update=True)
            if row is None:
                raise RecordNotFound("task", task_id)
            if row.status == "running" and row.cancel_requested_at is None:
                row.cancel_requested_at = now
            return _task(row)

    def settle_abandoned(self, task_id: str, *, max_attempts: int) -> Task | None:
        """End a ``running`` task that no live runner holds, if it must not run again:
        ``cancelled`` when a cancel waited on it, ``failed`` when runners already started it
        ``max_attempts`` times without a run ending (each of them died on it: a task that
        crashes its runner must not take down every server that picks it up).

        Returns:
            The task, now ``cancelled`` or ``failed``; None when it may run again (or is not
            running, or a live runner holds it).
        """
        now = _now()
        with self._write() as session:
            row = session.get(TaskRow, task_id, with_for_update=True)
            if row is None or row.status != "running":
                return None
            if row.runner_id is not None and row.lease_until is not None and row.lease_until >= now:
                return None
            if row.cancel_requested_at is not None:
                values = _status_values("cancelled", {"stop_reason": "cancelled by request"})
            elif row.attempts >= max_attempts:
                values = _status_values(
                    "failed",
                    {
                        "stop_reason": (
                            f"error: the task was started {row.attempts} times and its runner "
                            f"stopped without ending it each time (attempt limit "
                            f"{max_attempts}, RELAYGRAPH_MAX_ATTEMPTS); it is not run again"
                        )
                    },
                )
            else:
                return None
            _apply_status(row, values)
            row.runner_id = row.lease_until = None
            row.updated_at = values["updated_at"]
            _add_finish_event(session, task_id, values["status"], values["stop_reason"], now)
            session.refresh(row)
            return _task(row)

    def lease_of(self, task_id: str) -> tuple[str | None, datetime | None]:
        """Who holds the task's lease and until when: ``(runner_id, lease_until)``."""
        with self._read() as session:
            row = session.get(TaskRow, task_id)
            if row is None:
                raise RecordNotFound("task", task_id)
            return row.runner_id, row.lease_until

    # Events and what they imply

    def append_event(self, task_id: str, event: Mapping[str, Any]) -> int:
        """Record the task's next event and the rows it implies; returns its sequence number.

        A ``route`` or ``handoff`` adds a handoff row; ``tool_call`` and ``tool_result`` a
        tool-call row; an ``interrupted`` event an approval request and ``approval`` its
        outcome; ``agent_finished`` adds the visit's usage to the agent's total.

        Raises:
            ConfigError: The event is not a JSON object with a ``type``.
            RecordNotFound: No such task.
        """
        return self.append_events(task_id, [event])[0]

    def append_events(self, task_id: str, events: Sequence[Mapping[str, Any]]) -> list[int]:
        """Record the task's next events, in order, in one transaction (see
        :meth:`append_event`); returns their sequence numbers.

        A running task's events are written in batches: one transaction per batch instead
        of one per event is most of what the ledger costs a run.

        Raises:
            ConfigError: An event is not a JSON object with a ``type``; nothing is written.
            RecordNotFound: No such task.
        """
        batch = [check.event_data(event) for event in events]
        if not batch:
            return []
        now = _now()
        with self._write() as session:
            # The update locks the task's row until commit, so concurrent appends to one
            # task take their sequence numbers (and commit) strictly one after another.
            last = session.scalar(
                update(TaskRow)
                .where(TaskRow.id == task_id)
                .values(last_event_seq=TaskRow.last_event_seq + len(batch), updated_at=now)
                .returning(TaskRow.last_event_seq)
            )
            if last is None:
                raise RecordNotFound("task", task_id)
            first = last - len(batch) + 1
            _add_events(session, task_id, first, batch, now)
        return list(range(first, last + 1))

    def events_after(
        self, task_id: str, after_seq: int = 0, *, limit: int | None = None
    ) -> list[Event]:
        """The task's events with a sequence number above ``after_seq``, in order."""
        query = (
            select(EventRow)
            .where(EventRow.task_id == task_id, EventRow.seq > after_seq)
            .order_by(EventRow.seq)
        )
        if limit is not None:
            query = query.limit(limit)
        with self._read() as session:
            return [snapshot(Event, row) for row in session.scalars(query)]

    def handoffs(self, task_id: str) -> list[Handoff]:
        """Every transfer of work in the task, in order."""
        query = select(HandoffRow).where(HandoffRow.task_id == task_id).order_by(HandoffRow.seq)
        return self._snapshots(Handoff, query)

    def tool_calls(self, task_id: str) -> list[ToolCall]:
        """The task's tool calls, in the order they were made."""
        query = select(ToolCallRow).where(ToolCallRow.task_id == task_id)
        return self._snapshots(ToolCall, query.order_by(ToolCallRow.id))

    def approvals(self, task_id: str) -> list[Approval]:
        """The task's pauses for a person, oldest first, decided or not."""
        query = select(ApprovalRow).where(ApprovalRow.task_id == task_id)
        return self._snapshots(Approval, query.order_by(ApprovalRow.id))

    def usage(self, task_id: str) -> list[AgentUsage]:
        """The task's usage, one entry per role."""
        query = select(UsageRow).where(UsageRow.task_id == task_id).order_by(UsageRow.agent)
        return self._snapshots(AgentUsage, query)

    def _snapshots(self, record: type[R], query: Select[Any]) -> list[R]:
        with self._read() as session:
            return [snapshot(record, row) for row in session.scalars(query)]

    def record_usage(self, task_id: str, usage: Mapping[str, Mapping[str, Any]]) -> None:
        """Set each role's totals for the task, replacing what events added up.

        Events carry the agents' usage; the supervisor's and finalize's arrive only in the
        run's result, so a worker records ``RunResult.usage`` here when a run ends.
        """
        now = _now()
        with self._write() as session:
            if not _lock_task(session, task_id, now):
                raise RecordNotFound("task", task_id)
            for agent, totals in usage.items():
                if not isinstance(totals, Mapping):
                    raise ConfigError(f"usage[{agent!r}] {totals!r} must be a mapping")
                _usage.set_totals(session, task_id, agent, totals, now)

    def end_run(
        self,
        task_id: str,
        *,
        usage: Mapping[str, Mapping[str, Any]],
        runner_id: str | None = None,
        status: str | None = None,
        **fields: str | None,
    ) -> None:
        """What a run writes when it ends, in one transaction: each role's usage (as
        :meth:`record_usage`), the task's ``status`` with its ``answer`` or ``stop_reason``
        (as :meth:`set_status`; None leaves it, as for a run that was suspended), and
        ``runner_id``'s lease given up (as :meth:`release_lease`).

        Raises:
            ConfigError: An unknown status or field, or a usage entry that is not a mapping.
            RecordNotFound: No such task.
        """
        values = _status_values(status, fields) if status is not None else None
        now = _now()
        with self._write() as session:
            row = session.get(TaskRow, task_id, with_for_update=True)
            if row is None:
                raise RecordNotFound("task", task_id)
            for agent, totals in usage.items():
                if not isinstance(totals, Mapping):
                    raise ConfigError(f"usage[{agent!r}] {totals!r} must be a mapping")
                _usage.set_totals(session, task_id, agent, totals, now)
            row.updated_at = now
            if values is not None:
                _apply_status(row, values)
            if runner_id is not None and row.runner_id == runner_id:
                row.runner_id = row.lease_until = None
            # The run ended on its own (finished, paused or stopped cleanly): the next start
            # is not a retry after a crash.
            row.attempts = 0
            if row.cancel_requested_at is not None and row.status == "interrupted":
                # A cancel asked for while the run went on to a pause: it is not waited on.
                _apply_status(
                    row, _status_values("cancelled", {"stop_reason": "cancelled by request"})
                )
            if row.status in FINISHED_STATUSES:
                row.cancel_requested_at = None

    def usage_for_project(
        self, project_id: str, since: datetime | None = None, until: datetime | None = None
    ) -> dict[str, Any]:
        """What the project's tasks created in ``[since, until)`` used, per role and in total.

        Returns:
            ``{"project_id", "since", "until", "tasks", "total": {...}, "agents": {role: {...}}}``
            where each usage entry has model and tool calls, input and output tokens,
            ``cost_usd``, ``seconds`` and ``estimated``; times are ISO 8601 or None.

        Raises:
            ConfigError: ``since`` or ``until`` has no time zone, or ``since`` is later.
        """
        start = check.aware(since, "since")
        end = check.aware(until, "until")
        if start is not None and end is not None and start > end:
            raise ConfigError(f"since {start.isoformat()!r} is after until {end.isoformat()!r}")
        with self._read() as session:
            usage = _usage.project_usage(session, project_id, start, end)
        return {
            "project_id": project_id,
            "since": start.astimezone(UTC).isoformat() if start else None,
            "until": end.astimezone(UTC).isoformat() if end else None,
            **usage,
        }

    # Approvals

    def get_approval(self, task_id: str, approval_id: str) -> Approval | None:
        """The task's pause with interrupt id ``approval_id``."""
        with self._read() as session:
            row = session.scalars(
                select(ApprovalRow).where(
                    ApprovalRow.task_id == task_id, ApprovalRow.interrupt_id == approval_id
                )
            ).first()
            return snapshot(Approval, row) if row is not None else None

    def record_decision(
        self,
        task_id: str,
        approval_id: str,
        *,
        decision: str,
        decided_by: str,
        reason: str | None = None,
        args: Mapping[str, Any] | None = None,
    ) -> Approval:
        """Record who decided a paused task's request, what, and when.

        Args:
            task_id: The paused task.
            approval_id: The interrupt id from the ``interrupted`` event.
            decision: ``approve``, ``reject`` or ``edit``.
            decided_by: Who decided (a project's name, a person).
            reason: Why, in the person's words.
            args: The replacement arguments; required for ``edit`` and only for it.

        Raises:
            ConfigError: A bad field, named in the message.
            RecordNotFound: The task has no such request.
            RecordConflict: It was decided already.
        """
        if decision not in DECISIONS:
            raise ConfigError(f"decision {decision!r} must be 'approve', 'reject' or 'edit'")
        if decision == "edit" and not isinstance(args, Mapping):
            raise ConfigError(f"an edit needs the new arguments as a JSON object, got {args!r}")
        if decision != "edit" and args is not None:
            raise ConfigError(f"args {args!r} are only for an 'edit', not for {decision!r}")
        edited = check.json_object(args, "args") if args is not None else None
        who = check.text(decided_by, "decided_by", max_chars=255)
        why = None if reason is None else check.text(reason, "reason")
        with self._write() as session:
            # Locked, so that of two people deciding at once one wins and the other hears so.
            row = session.scalars(
                select(ApprovalRow)
                .where(ApprovalRow.task_id == task_id, ApprovalRow.interrupt_id == approval_id)
                .with_for_update()
            ).first()
            if row is None:
                raise RecordNotFound("approval", approval_id)
            if row.decision is not None:
                raise RecordConflict(
                    "approval",
                    approval_id,
                    f"already decided: {row.decision!r} by {row.decided_by!r}",
                )
            row.decision, row.decided_by, row.reason = decision, who, why
            row.edited_args, row.decided_at = edited, _now()
            return snapshot(Approval, row)

    # Eval runs

    def record_eval_run(
        self,
        *,
        golden: str,
        models: Mapping[str, Any],
        options: Mapping[str, Any],
        case_count: int,
        run_count: int,
        started_at: datetime | None = None,
    ) -> str:
        """Record the start of an eval run; returns its id for its case results.

        Args:
            golden: The golden file's path.
            models: ``{"model": spec or None, "agent_models": {role: spec}}``.
            options: How it runs: ``repeat``, ``concurrency``, ``tags``, ``baseline``.
            case_count: Cases selected to run.
            run_count: Case runs planned (cases times ``repeat``).
            started_at: When it started; now when None.

        Raises:
            ConfigError: A bad field, named in the message.
        """
        row = EvalRunRow(
            id=str(uuid.uuid4()),
            golden=check.text(golden, "golden"),
            models=check.json_object(models, "models"),
            options=check.json_object(options, "options"),
            case_count=check.whole(case_count, "case_count"),
            run_count=check.whole(run_count, "run_count"),
            started_at=check.aware(started_at, "started_at") or _now(),
        )
        with self._write() as session:
            session.add(row)
        return row.id

    def record_eval_case(
        self,
        eval_run_id: str,
        *,
        case_id: str,
        trial: int,
        passed: bool,
        checks: Sequence[Mapping[str, Any]],
        task_id: str | None = None,
        usage: Mapping[str, Any] | None = None,
        latency_seconds: float = 0.0,
        error: str | None = None,
    ) -> EvalCaseRecord:
        """Record one run of one case of an eval run.

        Args:
            eval_run_id: What :meth:`record_eval_run` returned.
            case_id: The golden case's id.
            trial: Which run of the case, from 1.
            passed: Whether every check passed.
            checks: Each check as a JSON object with ``name``, ``passed``, ``expected`` and
                ``actual``; the first with a false ``passed`` is kept as ``first_failure``.
            task_id: The ledger task the run was; None when the case failed before it had one.
            usage: The team's usage totals for the run.
            latency_seconds: Wall-clock seconds of the run.
            error: Why the case could not run at all.

        Raises:
            ConfigError: A bad field, named in the message.
            RecordNotFound: No such eval run or task.
            RecordConflict: This trial of this case was recorded already.
        """
        if not isinstance(passed, bool):
            raise ConfigError(f"passed {passed!r} must be True or False")
        stored = check.json_list(checks, "checks", scrub=True)
        for n, each in enumerate(stored):
            if not isinstance(each, dict) or not isinstance(each.get("passed"), bool):
                raise ConfigError(f"checks[{n}] {each!r} must be an object with a bool 'passed'")
        key = f"{case_id}#{trial}"
        row = EvalCaseRow(
            eval_run_id=eval_run_id,
            case_id=check.text(case_id, "case_id", max_chars=255),
            trial=check.whole(trial, "trial", minimum=1),
            passed=passed,
            checks=stored,
            first_failure=next((each for each in stored if not each["passed"]), None),
            usage=check.scrubbed_object(usage or {}, "usage"),
            latency_seconds=check.amount(latency_seconds, "latency_seconds"),
            error=None if error is None else str(error).replace(check.NUL, check.REPLACEMENT),
            task_id=check.optional_text(task_id, "task_id", max_chars=36),
            created_at=_now(),
        )
        try:
            with self._write() as session:
                if session.get(EvalRunRow, eval_run_id) is None:
                    raise RecordNotFound("eval run", eval_run_id)
                if task_id is not None and session.get(TaskRow, task_id) is None:
                    raise RecordNotFound("task", task_id)
                earlier = session.scalar(
                    select(EvalCaseRow.id).where(
                        EvalCaseRow.eval_run_id == eval_run_id,
                        EvalCaseRow.case_id == row.case_id,
                        EvalCaseRow.trial == row.trial,
                    )
                )
                if earlier is not None:
                    raise RecordConflict("eval case", key, "this trial was recorded already")
                session.add(row)
        except IntegrityError:
            raise RecordConflict("eval case", key, "this trial was recorded already") from None
        return snapshot(EvalCaseRecord, row)

    def finish_eval_run(
        self,
        eval_run_id: str,
        *,
        metrics: Mapping[str, Any],
        finished_at: datetime | None = None,
    ) -> EvalRunRecord:
        """Record an eval run's end: its metrics, pass rate and the passed counts.

        The pass rate is ``metrics["pass_rate"]``; the passed counts are those of the case
        results recorded for the run (a case passes when all its runs passed).

        Raises:
            ConfigError: A bad field, named in the message.
            RecordNotFound: No such eval run.
            RecordConflict: It was finished already.
        """
        stored = check.json_object(metrics, "metrics")
        pass_rate = check.share(stored.get("pass_rate"), "metrics.pass_rate")
        when = check.aware(finished_at, "finished_at") or _now()
        with self._write() as session:
            row = session.get(EvalRunRow, eval_run_id, with_for_update=True)
            if row is None:
                raise RecordNotFound("eval run", eval_run_id)
            if row.finished_at is not None:
                raise RecordConflict("eval run", eval_run_id, "it was finished already")
            outcomes = session.execute(
                select(EvalCaseRow.case_id, EvalCaseRow.passed).where(
                    EvalCaseRow.eval_run_id == eval_run_id
                )
            ).all()
            by_case: dict[str, bool] = {}
            for case_id, passed in outcomes:
                by_case[case_id] = by_case.get(case_id, True) and bool(passed)
            row.metrics, row.pass_rate, row.finished_at = stored, pass_rate, when
            row.passed_run_count = sum(bool(passed) for _, passed in outcomes)
            row.passed_case_count = sum(by_case.values())
            session.flush()
            return self._eval_records(session, [row])[0]

    def eval_runs(self, limit: int = 20) -> list[EvalRunRecord]:
        """The latest eval runs, newest first, each with its case results.

        Raises:
            ConfigError: A limit outside 1..200.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
            raise ConfigError(f"limit {limit!r} must be a whole number from 1 to {MAX_PAGE}")
        query = (
            select(EvalRunRow)
            .order_by(EvalRunRow.started_at.desc(), EvalRunRow.id.desc())
            .limit(limit)
        )
        with self._read() as session:
            return self._eval_records(session, list(session.scalars(query)))

    def eval_run(self, eval_run_id: str) -> EvalRunRecord:
        """One eval run with every case result, by case id and trial.

        Raises:
            RecordNotFound: No such eval run.
        """
        with self._read() as session:
            row = session.get(EvalRunRow, eval_run_id)
            if row is None:
                raise RecordNotFound("eval run", eval_run_id)
            return self._eval_records(session, [row])[0]

    def _eval_records(self, session: Session, rows: list[EvalRunRow]) -> list[EvalRunRecord]:
        cases: dict[str, list[EvalCaseRecord]] = {row.id: [] for row in rows}
        if rows:
            query = (
                select(EvalCaseRow)
                .where(EvalCaseRow.eval_run_id.in_(list(cases)))
                .order_by(EvalCaseRow.case_id, EvalCaseRow.trial)
            )
            for case in session.scalars(query):
                cases[case.eval_run_id].append(snapshot(EvalCaseRecord, case))
        return [snapshot(EvalRunRecord, row, cases=tuple(cases[row.id])) for row in rows]


def _add_events(
    session: Session, task_id: str, first: int, batch: Sequence[dict[str, Any]], now: datetime
) -> None:
    """Add the event rows numbered from ``first``, and the rows derived from them."""
    session.add_all(
        EventRow(
            task_id=task_id,
            seq=seq,
            type=data["type"][:32],
            agent=event_agent(data),
            data=data,
            created_at=now,
        )
        for seq, data in enumerate(batch, start=first)
    )
    for seq, data in enumerate(batch, start=first):
        derive(session, task_id, seq, data, now)


def _add_finish_event(
    session: Session, task_id: str, status: str, stop_reason: str | None, now: datetime
) -> None:
    """Record the ``run_finished`` event of a task the ledger ended itself (a cancel of a
    task no runner holds, a task abandoned too often)."""
    seq = session.scalar(
        update(TaskRow)
        .where(TaskRow.id == task_id)
        .values(last_event_seq=TaskRow.last_event_seq + 1)
        .returning(TaskRow.last_event_seq)
    )
    assert seq is not None
    event = {"type": "run_finished", "status": status, "stop_reason": stop_reason}
    _add_events(session, task_id, seq, [event], now)


def _no_live_lease(now: datetime) -> ColumnElement[bool]:
    """No runner holds the task, or its lease has lapsed."""
    return or_(
        TaskRow.runner_id.is_(None), TaskRow.lease_until.is_(None), TaskRow.lease_until < now
    )


def _lock_task(session: Session, task_id: str, now: datetime) -> bool:
    locked = session.scalar(
        update(TaskRow).where(TaskRow.id == task_id).values(updated_at=now).returning(TaskRow.id)
    )
    return locked is not None


def _status_values(status: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    if status not in TASK_STATUSES:
        raise ConfigError(f"status {status!r} is not one of {', '.join(TASK_STATUSES)}")
    unknown = [name for name in fields if name not in STATUS_FIELDS]
    if unknown:
        raise ConfigError(
            f"set_status got unknown field(s) {', '.join(map(repr, unknown))}; "
            f"it takes {', '.join(STATUS_FIELDS)}"
        )
    for name, value in fields.items():
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"{name} {value!r} must be a string or None")
    return {"status": status, "updated_at": _now(), **fields}


def _updated(session: Session, task_id: str, values: Mapping[str, Any]) -> Task:
    """The task row an UPDATE just changed, read again, with ``values`` applied (the times
    a status stamps)."""
    row = session.get(TaskRow, task_id, populate_existing=True)
    assert row is not None
    _apply_status(row, values)
    return _task(row)


def _apply_status(row: TaskRow, values: Mapping[str, Any]) -> None:
    for name, value in values.items():
        setattr(row, name, value)
    if row.status == "running" and row.started_at is None:
        row.started_at = values["updated_at"]
    if row.status in FINISHED_STATUSES:
        row.finished_at = values["updated_at"]


_REQUEST_FIELDS = ("team", "input", "thread_id", "policy", "models", "topology", "metadata")


def _request_fields(row: TaskRow, thread_id: str | None) -> dict[str, Any]:
    # The team enters only when there is one, so the digests of tasks recorded before
    # teams were recorded stay what they were.
    return {
        **({"team": row.team} if row.team is not None else {}),
        "input": row.input,
        "thread_id": thread_id,
        "policy": row.policy,
        "models": row.models,
        "topology": row.topology,
        "metadata": row.meta,
    }


def _request_digest(row: TaskRow, thread_id: str | None) -> str:
    """A digest of everything a request asks: an idempotency key names one request."""
    text = json.dumps(
        _request_fields(row, thread_id), sort_keys=True, separators=(",", ":"), default=str
    )
    return hashlib.sha256(text.encode()).hexdigest()


def _same_request(session: Session, earlier: Task, new: TaskRow) -> Task:
    """``earlier`` when ``new`` asks the same; else the conflict, naming what differs (the
    IETF idempotency-key draft and Stripe answer a reused key with another body so)."""
    stored = session.get(TaskRow, earlier.id)
    assert stored is not None
    if stored.request_digest is None:  # Recorded before digests: the input decides.
        differs = [] if earlier.input == new.input else ["input"]
    elif stored.request_digest == new.request_digest:
        differs = []
    else:
        mine, theirs = _request_fields(new, None), _request_fields(stored, None)
        # The thread is left out here: a request that named none got a new one. When
        # nothing else differs, the requests named different threads (or one named none).
        differs = [n for n in _REQUEST_FIELDS if mine.get(n) != theirs.get(n)] or ["thread_id"]
    if differs:
        raise RecordConflict(
            "task",
            earlier.id,
            f"idempotency key {new.idempotency_key!r} was used for task {earlier.id} with a "
            f"different request ({', '.join(differs)} differ); use a new key for a new request",
        )
    return earlier


def _task(row: TaskRow) -> Task:
    return snapshot(Task, row, metadata=row.meta)
