"""The worker mode's pool processes report their slots (``worker_slots``).

Each prefork child of a ``relaygraph worker`` reports itself every few seconds while it
lives; the publishers (API servers and workers) keep as many tasks waiting in RabbitMQ as the
live children have free (``Ledger.tasks_to_publish``), instead of a fixed number set by the
operator, so a project's task never waits in the broker behind more of another project's
tasks than the workers can start at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from relaygraph.store.migrations._ops import timestamp

revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"


def upgrade() -> None:
    op.create_table(
        "worker_slots",
        sa.Column("worker_id", sa.String(length=64), nullable=False),
        sa.Column("slots", sa.Integer(), nullable=False),
        timestamp("seen_at"),
        sa.PrimaryKeyConstraint("worker_id", name=op.f("pk_worker_slots")),
    )
    op.create_index(op.f("ix_worker_slots_seen_at"), "worker_slots", ["seen_at"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_worker_slots_seen_at"), table_name="worker_slots")
    op.drop_table("worker_slots")
