"""Tasks carry a lease: which runner runs them, and until when.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable: a task without a lease (finished, waiting, or recorded before this revision)
    # is held by nobody.
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("runner_id", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("lease_until")
        batch.drop_column("runner_id")
