"""Tasks record which team definition ran them: its name, version and digest.

An audit can then answer "which prompt and which tools did the coder have on that run".
NULL on tasks recorded before: they ran the built-in team.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from relaygraph.store.migrations._ops import add_columns, drop_columns, json_type

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"


def upgrade() -> None:
    add_columns("tasks", sa.Column("team", json_type(), nullable=True))


def downgrade() -> None:
    drop_columns("tasks", "team")
