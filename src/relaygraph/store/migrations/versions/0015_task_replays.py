"""A task may be a replay of another: ``replay_of`` names the original, ``from_step`` the
step of the original's trajectory the replay went on from (0: from its request).

The original is never changed: a replay is a new task of the same project, on a thread of
its own. The index answers "which replays has this task" without a scan.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | Sequence[str] | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("replay_of", sa.String(36), nullable=True))
        batch.add_column(sa.Column("from_step", sa.Integer(), nullable=True))
        batch.create_index("ix_tasks_replay_of", ["replay_of"])


def downgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.drop_index("ix_tasks_replay_of")
        batch.drop_column("from_step")
        batch.drop_column("replay_of")
