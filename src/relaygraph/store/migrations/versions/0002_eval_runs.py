"""Eval runs and the result of each run of each case, linked to the case's task."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from relaygraph.store.migrations._ops import json_type, references, row_id, timestamp

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"


def upgrade() -> None:
    op.create_table(
        "eval_runs",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("golden", sa.Text(), nullable=False),
        sa.Column("models", json_type(), nullable=False),
        sa.Column("options", json_type(), nullable=False),
        sa.Column("case_count", sa.Integer(), nullable=False),
        sa.Column("run_count", sa.Integer(), nullable=False),
        sa.Column("passed_case_count", sa.Integer(), nullable=True),
        sa.Column("passed_run_count", sa.Integer(), nullable=True),
        sa.Column("pass_rate", sa.Float(), nullable=True),
        sa.Column("metrics", json_type(), nullable=True),
        timestamp("started_at"),
        timestamp("finished_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_eval_runs")),
    )
    op.create_index(op.f("ix_eval_runs_started_at_id"), "eval_runs", ["started_at", "id"])

    op.create_table(
        "eval_case_results",
        row_id(),
        sa.Column("eval_run_id", sa.String(length=36), nullable=False),
        sa.Column("case_id", sa.String(length=255), nullable=False),
        sa.Column("trial", sa.Integer(), nullable=False),
        sa.Column("passed", sa.Boolean(), nullable=False),
        sa.Column("checks", json_type(), nullable=False),
        sa.Column("first_failure", json_type(), nullable=True),
        sa.Column("usage", json_type(), nullable=False),
        sa.Column("latency_seconds", sa.Float(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("task_id", sa.String(length=36), nullable=True),
        timestamp("created_at"),
        references("eval_case_results", "eval_run_id", "eval_runs", ondelete="CASCADE"),
        references("eval_case_results", "task_id", "tasks", ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_eval_case_results")),
        sa.UniqueConstraint(
            "eval_run_id",
            "case_id",
            "trial",
            name=op.f("uq_eval_case_results_eval_run_id_case_id_trial"),
        ),
    )
    op.create_index(op.f("ix_eval_case_results_task_id"), "eval_case_results", ["task_id"])


def downgrade() -> None:
    op.drop_table("eval_case_results")
    op.drop_table("eval_runs")
