"""A project's quotas, as the operator set them (``relaygraph projects quota``).

``max_running``, ``max_queued`` and ``daily_cost_usd`` override the server's settings of the
same names (``RELAYGRAPH_PROJECT_MAX_RUNNING`` and the like) for one project; NULL: the
setting applies. Tasks get an index by project and start time: the fair queue goes first
to the project whose last task started longest ago among those with as many running.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from relaygraph.store.migrations._ops import add_columns, drop_columns

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"


def upgrade() -> None:
    add_columns(
        "projects",
        sa.Column("max_running", sa.Integer(), nullable=True),
        sa.Column("max_queued", sa.Integer(), nullable=True),
        sa.Column("daily_cost_usd", sa.Float(), nullable=True),
    )
    op.create_index(
        "ix_tasks_project_id_started_at", "tasks", ["project_id", "started_at"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_tasks_project_id_started_at", table_name="tasks")
    drop_columns("projects", "daily_cost_usd", "max_queued", "max_running")
