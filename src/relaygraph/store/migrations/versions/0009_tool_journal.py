"""The tool journal: ``tool_journal`` holds each tool call that completed, with its result.

A row is one call of one task, keyed by the task and the call's id: the result the graph
received, written before the result returned into the graph, so that a step re-run after
a crash (a worker killed, a task redelivered) answers the call from here instead of running
the tool again.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from relaygraph.store.migrations._ops import belongs_to_task, json_type, timestamp

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"


def upgrade() -> None:
    task_id, task_fk = belongs_to_task("tool_journal")
    op.create_table(
        "tool_journal",
        task_id,
        sa.Column("call_id", sa.String(length=255), nullable=False),
        sa.Column("record", json_type(), nullable=False),
        timestamp("created_at"),
        task_fk,
        sa.PrimaryKeyConstraint("task_id", "call_id", name=op.f("pk_tool_journal")),
    )


def downgrade() -> None:
    op.drop_table("tool_journal")
