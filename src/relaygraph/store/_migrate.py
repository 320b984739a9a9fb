"""Alembic migrations, run from code: the package ships them, no ``alembic.ini`` needed."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, text

from relaygraph.store._engine import WRITE_OPTION

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
    with engine.execution_options(**{WRITE_OPTION: True}).begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": UPGRADE_LOCK})
        command.upgrade(alembic_config(connection), revision)
