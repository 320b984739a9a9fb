"""Alembic migrations, run from code: the package ships them, no ``alembic.ini`` needed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, text

MIGRATIONS = Path(__file__).with_name("migrations")
VERSION_TABLE = "relaygraph_alembic_version"
"""Alembic's bookkeeping table, named so it cannot clash with another app's in a shared database."""
UPGRADE_LOCK = 0x52470001
"""PostgreSQL advisory lock key: two servers starting at once migrate one after the other."""


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic config for the shipped scripts; ``connection`` is the one to migrate."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS).replace("%", "%%"))
    config.attributes["connection"] = connection
    return config


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
        return context.get_current_revision()


def upgrade_engine(engine: Engine, revision: str = "head") -> None:
    """Migrate the database behind ``engine`` to ``revision``, in one transaction."""
    with migrating(engine) as connection:
        command.upgrade(alembic_config(connection), revision)


def downgrade_engine(engine: Engine, revision: str) -> None:
    """Take the database behind ``engine`` back to ``revision``, in one transaction."""
    with migrating(engine) as connection:
        command.downgrade(alembic_config(connection), revision)


@contextmanager
def migrating(engine: Engine) -> Iterator[Connection]:
    """A connection in the one transaction a migration runs in.

    On PostgreSQL it holds the upgrade lock. On SQLite, foreign keys are off for it: SQLite
    changes a table by copying it into a new one and dropping the old, and dropping a
    ``tasks`` table with foreign keys on deletes every event, handoff, tool call, approval
    and usage row of every task (``ON DELETE CASCADE``). SQLite's own procedure for schema
    changes turns them off, outside the transaction (inside it the pragma does nothing),
    and checks them before committing.

    On SQLite, give it an engine whose transactions take the write lock when they begin
    (``make_engine(url, immediate=True)``), as the ledger's writes do.

    Raises:
        RuntimeError: On SQLite, the migrated rows break a foreign key; nothing is committed.
    """
    sqlite = engine.dialect.name == "sqlite"
    with engine.connect() as connection:
        raw: Any = connection.connection.driver_connection
        if sqlite:
            raw.execute("PRAGMA foreign_keys=OFF")
        try:
            with connection.begin():
                if not sqlite:
                    connection.execute(
                        text("SELECT pg_advisory_xact_lock(:key)"), {"key": UPGRADE_LOCK}
                    )
                yield connection
                if sqlite:
                    broken = connection.exec_driver_sql("PRAGMA foreign_key_check").all()
                    if broken:
                        raise RuntimeError(f"the migration breaks foreign keys: {broken[:5]}")
        finally:
            if sqlite:
                raw.execute("PRAGMA foreign_keys=ON")
