"""Tasks carry what isolates and contains them: a thread per tenant, the request's digest,
their attempts and a cancel request.

- ``checkpoint_thread``: the LangGraph thread the task's checkpoints live under. Thread ids
  are the tenant's own (two tenants may both use ``ticket-4711``), so the checkpointer's
  key is not the thread id itself. Existing tasks keep the key they ran under (their
  thread id), so their checkpoints stay theirs.
- ``request_digest``: a digest of the whole request, so that an Idempotency-Key reused for
  a different request is refused; NULL for tasks recorded before (their input decides).
- ``attempts``: how many times a runner started running the task; a task that kills its
  runner every time is failed after a bounded number.
- ``cancel_requested_at``: a cancel asked for while another runner holds the task; the
  holder sees it at its next lease renewal.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from relaygraph.store.migrations._ops import add_columns, timestamp

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"


def upgrade() -> None:
    add_columns(
        "tasks",
        sa.Column("checkpoint_thread", sa.String(length=300), nullable=True),
        sa.Column("request_digest", sa.String(length=64), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default=sa.text("0")),
        timestamp("cancel_requested_at", nullable=True),
    )
    op.execute("UPDATE tasks SET checkpoint_thread = thread_id")
    with op.batch_alter_table("tasks") as batch:
        batch.alter_column("checkpoint_thread", existing_type=sa.String(length=300), nullable=False)
        batch.drop_index("ix_tasks_thread_id")
        batch.create_index("ix_tasks_team_id_thread_id", ["team_id", "thread_id"])


def downgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.drop_index("ix_tasks_team_id_thread_id")
        batch.create_index("ix_tasks_thread_id", ["thread_id"])
        batch.drop_column("cancel_requested_at")
        batch.drop_column("attempts")
        batch.drop_column("request_digest")
        batch.drop_column("checkpoint_thread")
