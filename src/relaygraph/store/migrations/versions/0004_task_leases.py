"""Tasks carry a lease: which runner runs them, and until when."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from relaygraph.store.migrations._ops import add_columns, drop_columns, timestamp

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"


def upgrade() -> None:
    # Nullable: a task without a lease (finished, waiting, or recorded before this revision)
    # is held by nobody.
    add_columns(
        "tasks",
        sa.Column("runner_id", sa.String(length=64), nullable=True),
        timestamp("lease_until", nullable=True),
    )


def downgrade() -> None:
    drop_columns("tasks", "lease_until", "runner_id")
