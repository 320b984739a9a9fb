"""The column types, keys and table changes that the ledger's revisions share.

Released revisions build their schema from these too, and a released revision must build
the same schema for ever: a helper here may change only in ways that leave every revision's
DDL as it is, and a revision that needs something else says it itself.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql


def json_type() -> sa.types.TypeEngine[Any]:
    """The ledger's JSON: ``jsonb`` on PostgreSQL, and Python's ``None`` stored as SQL NULL."""
    return sa.JSON(none_as_null=True).with_variant(
        postgresql.JSONB(none_as_null=True, astext_type=sa.Text()), "postgresql"
    )


def timestamp(name: str, *, nullable: bool = False) -> sa.Column[datetime]:
    """A moment, with its time zone."""
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def row_id() -> sa.Column[int]:
    """An ``id`` the database counts up: BIGINT, and INTEGER on SQLite, whose only
    auto-incrementing key is an INTEGER PRIMARY KEY."""
    kind = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
    return sa.Column("id", kind, autoincrement=True, nullable=False)


def references(table: str, column: str, parent: str, *, ondelete: str) -> sa.ForeignKeyConstraint:
    """``table.column`` refers to ``parent.id``, under the name the models' naming
    convention gives it (``fk_<table>_<column>_<parent>``)."""
    return sa.ForeignKeyConstraint(
        [column], [f"{parent}.id"], name=op.f(f"fk_{table}_{column}_{parent}"), ondelete=ondelete
    )


def belongs_to_task(table: str) -> tuple[sa.Column[str], sa.ForeignKeyConstraint]:
    """The ``task_id`` of a row that belongs to a task, and goes when the task goes."""
    column = sa.Column("task_id", sa.String(length=36), nullable=False)
    return column, references(table, "task_id", "tasks", ondelete="CASCADE")


def add_columns(table: str, *columns: sa.Column[Any]) -> None:
    """Add ``columns`` to ``table`` in one batch: on SQLite, at most one copy of the table."""
    with op.batch_alter_table(table) as batch:
        for column in columns:
            batch.add_column(column)


def drop_columns(table: str, *names: str) -> None:
    """Drop the columns ``names`` from ``table`` in one batch (on SQLite, one copy)."""
    with op.batch_alter_table(table) as batch:
        for name in names:
            batch.drop_column(name)
