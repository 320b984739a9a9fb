"""Projects (the tenants) and their API keys."""

from __future__ import annotations

import hashlib
import secrets
import uuid
from datetime import datetime

from sqlalchemy import bindparam, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from relaygraph.store import _validate as check
from relaygraph.store._core import LedgerCore
from relaygraph.store._errors import RecordConflict, RecordNotFound
from relaygraph.store._models import (
    ApiKeyRow,
    ProjectRow,
)
from relaygraph.store._records import (
    ApiKey,
    Project,
    snapshot,
)
from relaygraph.store._task_rows import utc_now

KEY_PREFIX = "rg_"
"""How every API key the ledger makes begins."""
KEY_DISPLAY_CHARS = 10
"""How many of a key's first characters the ledger keeps to show it (``ApiKey.prefix``)."""

_AUTHENTICATE = (
    select(ProjectRow.id, ProjectRow.name, ProjectRow.created_at)
    .join(ApiKeyRow, ApiKeyRow.project_id == ProjectRow.id)
    .where(ApiKeyRow.key_hash == bindparam("key_hash"), ApiKeyRow.revoked_at.is_(None))
    .limit(1)
)
"""The project of a live key's hash (``key_hash``)."""


def hash_key(key: str) -> str:
    """The SHA-256 hex digest the ledger stores in place of an API key."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class TenantRepository:
    """Projects (the tenants) and their API keys."""

    def __init__(self, core: LedgerCore) -> None:
        self._core = core

    def create_project(self, name: str) -> tuple[Project, str]:
        """Create a project (a tenant of the task service) and its first API key.

        Returns:
            The project and the plain key, which the ledger does not keep: show it once.

        Raises:
            ConfigError: The name is invalid.
            RecordConflict: A project of that name exists.
        """
        check.name(name, "project")
        now = utc_now()
        project = ProjectRow(id=str(uuid.uuid4()), name=name, created_at=now)
        try:
            with self._core.write() as session:
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
        with self._core.write() as session:
            if session.get(ProjectRow, project_id) is None:
                raise RecordNotFound("project", project_id)
            return self._new_key(session, project_id, utc_now())

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
        with self._core.write() as session:
            row = session.get(ApiKeyRow, key_id)
            if row is None:
                raise RecordNotFound("api key", key_id)
            row.revoked_at = row.revoked_at or utc_now()
            return snapshot(ApiKey, row)

    def api_keys(self, project_id: str) -> list[ApiKey]:
        """A project's keys, oldest first, revoked ones included."""
        with self._core.read() as session:
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
        # SQLAlchemy Core, the statement built once: every API request starts here (the
        # ORM query cost a task's submission more of the interpreter than recording it).
        with self._core.read_connection() as connection:
            row = connection.execute(_AUTHENTICATE, {"key_hash": hash_key(key)}).first()
        return None if row is None else Project(**row._mapping)

    def get_project(self, name: str) -> Project | None:
        with self._core.read() as session:
            row = session.scalars(select(ProjectRow).where(ProjectRow.name == name)).first()
            return snapshot(Project, row) if row is not None else None

    def project_by_id(self, project_id: str) -> Project | None:
        """The project ``project_id``; None when there is none."""
        with self._core.read() as session:
            row = session.get(ProjectRow, project_id)
            return snapshot(Project, row) if row is not None else None
