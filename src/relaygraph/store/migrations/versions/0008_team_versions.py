"""Projects register teams: ``team_versions`` holds each version of each named team.

A row is one version of a project's team: the definition as pushed (the team file's content
as JSON) and its digest. Versions count from 1 per project and name; a push whose digest is
the latest's adds nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from relaygraph.store.migrations._ops import json_type, references, row_id, timestamp

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"


def upgrade() -> None:
    op.create_table(
        "team_versions",
        row_id(),
        sa.Column("project_id", sa.String(length=36), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("definition", json_type(), nullable=False),
        sa.Column("digest", sa.String(length=100), nullable=False),
        timestamp("created_at"),
        references("team_versions", "project_id", "projects", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_team_versions")),
        sa.UniqueConstraint(
            "project_id", "name", "version", name=op.f("uq_team_versions_project_id_name_version")
        ),
    )


def downgrade() -> None:
    op.drop_table("team_versions")
