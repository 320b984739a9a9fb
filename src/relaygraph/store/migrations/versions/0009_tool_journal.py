"""The tool journal: ``tool_journal`` holds each tool call that completed, with its result.

A row is one call of one task, keyed by the task and the call's id: the result the graph
received, written before the result returned into the graph, so that a step re-run after
a crash (a worker killed, a task redelivered) answers the call from here instead of running
the tool again.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-09
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    json_type = sa.JSON(none_as_null=True).with_variant(
        postgresql.JSONB(none_as_null=True, astext_type=sa.Text()), "postgresql"
    )
    op.create_table(
        "tool_journal",
        sa.Column("task_id", sa.String(length=36), nullable=False),
        sa.Column("call_id", sa.String(length=255), nullable=False),
        sa.Column("record", json_type, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["task_id"],
            ["tasks.id"],
            name=op.f("fk_tool_journal_task_id_tasks"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("task_id", "call_id", name=op.f("pk_tool_journal")),
    )


def downgrade() -> None:
    op.drop_table("tool_journal")
