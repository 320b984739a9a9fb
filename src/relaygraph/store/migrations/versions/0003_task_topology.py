"""Tasks record their topology (structured, swarm, supervisor-tools) and its options."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from relaygraph.store.migrations._ops import add_columns, drop_columns, json_type

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"


def upgrade() -> None:
    # Nullable: tasks recorded before this revision ran the structured team.
    add_columns("tasks", sa.Column("topology", json_type(), nullable=True))


def downgrade() -> None:
    drop_columns("tasks", "topology")
