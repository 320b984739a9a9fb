"""A role's usage row holds the usage records it adds up, not only their ids.

``records`` maps each record's id (the LangGraph task namespace that spent it) to its
figures; the row's totals are their sum. A record sent again replaces the one of the same
id (its node ran again, a tool-calling supervisor's record grew, a visit in progress when
the run stopped finished later), so the ledger stores what the graph recorded and never
re-derives it. A row written before this revision keeps its totals as one record.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from relaygraph.store.migrations._ops import add_columns, json_type

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"

_FIGURES = ("model_calls", "tool_calls", "input_tokens", "output_tokens", "cost_usd", "seconds")


def _usage(*columns: str) -> sa.TableClause:
    return sa.table(
        "usage",
        sa.column("task_id", sa.String()),
        sa.column("agent", sa.String()),
        *(sa.column(name) for name in _FIGURES),
        sa.column("estimated", sa.Boolean()),
        *(sa.column(name, json_type()) for name in columns),
    )


def upgrade() -> None:
    add_columns("usage", sa.Column("records", json_type(), nullable=True))
    usage = _usage("records")
    connection = op.get_bind()
    for row in connection.execute(sa.select(usage)).mappings().all():
        figures = {name: row[name] for name in _FIGURES} | {"estimated": bool(row["estimated"])}
        connection.execute(
            usage.update()
            .where(usage.c.task_id == row["task_id"], usage.c.agent == row["agent"])
            .values(records={f"{row['agent']}:before-0011": figures})
        )
    with op.batch_alter_table("usage") as batch:
        batch.alter_column("records", existing_type=json_type(), nullable=False)
        batch.drop_column("visits")


def downgrade() -> None:
    add_columns("usage", sa.Column("visits", json_type(), nullable=True))
    usage = _usage("records", "visits")
    connection = op.get_bind()
    for row in connection.execute(sa.select(usage)).mappings().all():
        connection.execute(
            usage.update()
            .where(usage.c.task_id == row["task_id"], usage.c.agent == row["agent"])
            .values(visits=sorted(row["records"] or {}))
        )
    with op.batch_alter_table("usage") as batch:
        batch.alter_column("visits", existing_type=json_type(), nullable=False)
        batch.drop_column("records")
