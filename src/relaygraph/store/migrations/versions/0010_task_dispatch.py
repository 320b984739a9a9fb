"""Tasks count their dispatches to the workers, and the workers' starts of the current one.

``dispatch`` is how many times the task was handed to the worker mode's queue (its
submission, then each decision that continues it): a message carries the dispatch it was
published for, and one of an earlier dispatch is stale. ``dispatch_attempts`` counts the
workers' starts of the current dispatch, for the attempt limit (``attempts`` is the fencing
number and never goes back in the worker mode).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from relaygraph.store.migrations._ops import add_columns, drop_columns

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"


def upgrade() -> None:
    add_columns(
        "tasks",
        sa.Column("dispatch", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("dispatch_attempts", sa.Integer(), nullable=False, server_default=sa.text("0")),
    )


def downgrade() -> None:
    drop_columns("tasks", "dispatch_attempts", "dispatch")
