"""Tenants are projects: ``teams`` becomes ``projects`` and ``team_id`` becomes ``project_id``.

The word *team* now means only the agents' composition (``tasks.team`` records which team
ran a task). Nothing is copied or lost: rows keep their ids, so every API key, task and
checkpoint thread (``<project id>/<thread id>``) stays its project's. Constraints and
indexes take the names the models' naming convention gives them.

PostgreSQL renames in place. SQLite renames the table and its columns in place too, and
copies ``projects``, ``api_keys`` and ``tasks`` to rename their inline constraints (with
foreign keys off, see ``relaygraph.store._migrate.migrating``: the copy of ``tasks`` keeps
every event, handoff, tool call, approval and usage row).
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"

TASK_INDEXES = (
    ("created_at", "id"),
    ("status", "created_at", "id"),
    ("thread_id",),
)
"""The columns after the tenant's in each of ``tasks``' indexes that start with it."""


def upgrade() -> None:
    _rename(old="team", new="project", old_table="teams", new_table="projects")


def downgrade() -> None:
    _rename(old="project", new="team", old_table="projects", new_table="teams")


def _rename(*, old: str, new: str, old_table: str, new_table: str) -> None:
    old_id, new_id = f"{old}_id", f"{new}_id"
    op.rename_table(old_table, new_table)
    indexes = [("api_keys", f"ix_api_keys_{old_id}", f"ix_api_keys_{new_id}", [new_id])]
    for rest in TASK_INDEXES:
        after = "_".join(rest)
        indexes.append(
            ("tasks", f"ix_tasks_{old_id}_{after}", f"ix_tasks_{new_id}_{after}", [new_id, *rest])
        )
    if op.get_context().dialect.name == "postgresql":
        constraints = [
            (new_table, f"pk_{old_table}", f"pk_{new_table}"),
            (new_table, f"uq_{old_table}_name", f"uq_{new_table}_name"),
            ("api_keys", f"fk_api_keys_{old_id}_{old_table}", f"fk_api_keys_{new_id}_{new_table}"),
            ("tasks", f"fk_tasks_{old_id}_{old_table}", f"fk_tasks_{new_id}_{new_table}"),
            (
                "tasks",
                f"uq_tasks_{old_id}_idempotency_key",
                f"uq_tasks_{new_id}_idempotency_key",
            ),
        ]
        for table in ("api_keys", "tasks"):
            op.alter_column(table, old_id, new_column_name=new_id)
        for table, was, now in constraints:
            op.execute(f'ALTER TABLE "{table}" RENAME CONSTRAINT "{was}" TO "{now}"')
        for _, was, now, _ in indexes:
            op.execute(f'ALTER INDEX "{was}" RENAME TO "{now}"')
        return
    # SQLite renames the columns in place (and what refers to them); the indexes are made
    # again, and the constraints inside CREATE TABLE are renamed by copying their tables.
    for table, was, _, _ in indexes:
        op.drop_index(was, table_name=table)
    for table in ("api_keys", "tasks"):
        op.execute(f'ALTER TABLE "{table}" RENAME COLUMN "{old_id}" TO "{new_id}"')
    with op.batch_alter_table(new_table, recreate="always") as batch:
        batch.create_primary_key(f"pk_{new_table}", ["id"])
        batch.drop_constraint(f"uq_{old_table}_name", type_="unique")
        batch.create_unique_constraint(f"uq_{new_table}_name", ["name"])
    for table in ("api_keys", "tasks"):
        with op.batch_alter_table(table, recreate="always") as batch:
            batch.drop_constraint(f"fk_{table}_{old_id}_{old_table}", type_="foreignkey")
            batch.create_foreign_key(
                f"fk_{table}_{new_id}_{new_table}", new_table, [new_id], ["id"], ondelete="CASCADE"
            )
            if table == "tasks":
                batch.drop_constraint(f"uq_tasks_{old_id}_idempotency_key", type_="unique")
                batch.create_unique_constraint(
                    f"uq_tasks_{new_id}_idempotency_key", [new_id, "idempotency_key"]
                )
    for table, _, now, columns in indexes:
        op.create_index(now, table, columns)
