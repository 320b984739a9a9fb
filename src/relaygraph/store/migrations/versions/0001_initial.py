"""The ledger's first schema: teams, keys, tasks, events and what is derived from events."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

from relaygraph.store.migrations._ops import (
    belongs_to_task,
    json_type,
    references,
    row_id,
    timestamp,
)

revision: str = "0001"
down_revision: str | Sequence[str] | None = None

LOCAL_TEAM_ID = "local"


def upgrade() -> None:
    teams = op.create_table(
        "teams",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        timestamp("created_at"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_teams")),
        sa.UniqueConstraint("name", name=op.f("uq_teams_name")),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("team_id", sa.String(length=36), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        timestamp("created_at"),
        timestamp("revoked_at", nullable=True),
        references("api_keys", "team_id", "teams", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("key_hash", name=op.f("uq_api_keys_key_hash")),
    )
    op.create_index(op.f("ix_api_keys_team_id"), "api_keys", ["team_id"])

    op.create_table(
        "tasks",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("team_id", sa.String(length=36), nullable=False),
        sa.Column("input", sa.Text(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("answer", sa.Text(), nullable=True),
        sa.Column("stop_reason", sa.Text(), nullable=True),
        sa.Column("policy", json_type(), nullable=True),
        sa.Column("models", json_type(), nullable=False),
        sa.Column("thread_id", sa.String(length=255), nullable=False),
        sa.Column("idempotency_key", sa.String(length=255), nullable=True),
        sa.Column("metadata", json_type(), nullable=False),
        sa.Column("last_event_seq", sa.Integer(), nullable=False),
        timestamp("created_at"),
        timestamp("started_at", nullable=True),
        timestamp("finished_at", nullable=True),
        timestamp("updated_at"),
        references("tasks", "team_id", "teams", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tasks")),
        sa.UniqueConstraint(
            "team_id", "idempotency_key", name=op.f("uq_tasks_team_id_idempotency_key")
        ),
    )
    # Listing a team's tasks newest first (with or without a status), finding the tasks a
    # restarted server must pick up, and the tasks on a thread.
    op.create_index(
        op.f("ix_tasks_team_id_created_at_id"), "tasks", ["team_id", "created_at", "id"]
    )
    op.create_index(
        op.f("ix_tasks_team_id_status_created_at_id"),
        "tasks",
        ["team_id", "status", "created_at", "id"],
    )
    op.create_index(op.f("ix_tasks_status_created_at"), "tasks", ["status", "created_at"])
    op.create_index(op.f("ix_tasks_thread_id"), "tasks", ["thread_id"])

    task_id, task_fk = belongs_to_task("events")
    op.create_table(
        "events",
        task_id,
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("type", sa.String(length=32), nullable=False),
        sa.Column("agent", sa.String(length=64), nullable=True),
        sa.Column("data", json_type(), nullable=False),
        timestamp("created_at"),
        task_fk,
        sa.PrimaryKeyConstraint("task_id", "seq", name=op.f("pk_events")),
    )

    task_id, task_fk = belongs_to_task("handoffs")
    op.create_table(
        "handoffs",
        task_id,
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("event_seq", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=8), nullable=False),
        sa.Column("source", sa.String(length=64), nullable=False),
        sa.Column("target", sa.String(length=64), nullable=False),
        sa.Column("task", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=True),
        sa.Column("checkpoint_ns", sa.String(length=255), nullable=True),
        sa.Column("tokens_so_far", sa.Integer(), nullable=False),
        timestamp("created_at"),
        sa.CheckConstraint("kind IN ('route', 'direct')", name=op.f("ck_handoffs_kind")),
        task_fk,
        sa.PrimaryKeyConstraint("task_id", "seq", name=op.f("pk_handoffs")),
    )

    task_id, task_fk = belongs_to_task("tool_calls")
    op.create_table(
        "tool_calls",
        row_id(),
        task_id,
        sa.Column("event_seq", sa.Integer(), nullable=False),
        sa.Column("agent", sa.String(length=64), nullable=False),
        sa.Column("tool", sa.String(length=128), nullable=False),
        sa.Column("tool_call_id", sa.String(length=255), nullable=True),
        sa.Column("args", json_type(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("result_preview", sa.Text(), nullable=True),
        timestamp("created_at"),
        timestamp("finished_at", nullable=True),
        task_fk,
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tool_calls")),
    )
    op.create_index(
        op.f("ix_tool_calls_task_id_tool_call_id"), "tool_calls", ["task_id", "tool_call_id"]
    )

    task_id, task_fk = belongs_to_task("approvals")
    op.create_table(
        "approvals",
        row_id(),
        task_id,
        sa.Column("interrupt_id", sa.String(length=128), nullable=True),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("agent", sa.String(length=64), nullable=True),
        sa.Column("tool", sa.String(length=128), nullable=True),
        sa.Column("tool_call_id", sa.String(length=255), nullable=True),
        sa.Column("args", json_type(), nullable=True),
        sa.Column("request", json_type(), nullable=False),
        timestamp("requested_at"),
        sa.Column("decision", sa.String(length=16), nullable=True),
        sa.Column("decided_by", sa.String(length=255), nullable=True),
        timestamp("decided_at", nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("edited_args", json_type(), nullable=True),
        timestamp("applied_at", nullable=True),
        task_fk,
        sa.PrimaryKeyConstraint("id", name=op.f("pk_approvals")),
        sa.UniqueConstraint(
            "task_id", "interrupt_id", name=op.f("uq_approvals_task_id_interrupt_id")
        ),
    )

    task_id, task_fk = belongs_to_task("usage")
    op.create_table(
        "usage",
        task_id,
        sa.Column("agent", sa.String(length=64), nullable=False),
        sa.Column("model_calls", sa.Integer(), nullable=False),
        sa.Column("tool_calls", sa.Integer(), nullable=False),
        sa.Column("input_tokens", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("cost_usd", sa.Float(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("estimated", sa.Boolean(), nullable=False),
        sa.Column("visits", json_type(), nullable=False),
        timestamp("updated_at"),
        task_fk,
        sa.PrimaryKeyConstraint("task_id", "agent", name=op.f("pk_usage")),
    )

    # The built-in team that owns the CLI's tasks. It has no API key until one is made.
    op.bulk_insert(teams, [{"id": LOCAL_TEAM_ID, "name": "local", "created_at": datetime.now(UTC)}])


def downgrade() -> None:
    for table in ("usage", "approvals", "tool_calls", "handoffs", "events", "tasks"):
        op.drop_table(table)
    op.drop_table("api_keys")
    op.drop_table("teams")
