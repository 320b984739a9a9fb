"""A task may be a replay of another: ``replay_of`` names the original, ``from_step`` the
step of the original's trajectory the replay went on from (0: from its request).

The original is never changed: a replay is a new task of the same project, on a thread of
its own. The index answers "which replays has this task" without a scan.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from relaygraph.store.migrations._ops import add_columns, drop_columns

revision: str = "0015"
down_revision: str | Sequence[str] | None = "0014"


def upgrade() -> None:
    add_columns(
        "tasks",
        sa.Column("replay_of", sa.String(36), nullable=True),
        sa.Column("from_step", sa.Integer(), nullable=True),
    )
    op.create_index("ix_tasks_replay_of", "tasks", ["replay_of"])


def downgrade() -> None:
    op.drop_index("ix_tasks_replay_of", table_name="tasks")
    drop_columns("tasks", "from_step", "replay_of")
