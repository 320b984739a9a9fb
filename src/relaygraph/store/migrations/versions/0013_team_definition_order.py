"""A registered team's definition is kept as pushed, in its own key order.

On PostgreSQL ``team_versions.definition`` was ``jsonb``, which orders an object's keys by
length, then bytes: a team pushed with agents researcher, writer, reviewer read back as
writer, reviewer, researcher, and a process that built it from the ledger (a worker, another
server process) built another team, with another digest, than the one the push built and
the task recorded. It becomes ``json``, which keeps the text as written. SQLite already
stores the text given: nothing changes there.

A row stored before this revision on PostgreSQL keeps the key order jsonb gave it: the order
it was pushed in was never stored, so nothing can recover it. Every process now builds such
a version from the same text, in that order, so a task started on it after the upgrade
records that team's digest and runs wherever it is taken (a task that recorded the digest of
the team as pushed, before the upgrade, is refused as before: that team cannot be rebuilt).
The row's ``digest`` stays the pushed team's, so pushing the same file again is not taken
for no change: the ledger also compares the agents' order (``TeamRepository.register_team``),
and the push makes a new version that keeps it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"

_JSON = sa.JSON(none_as_null=True)
_JSONB = postgresql.JSONB(none_as_null=True, astext_type=sa.Text())


def upgrade() -> None:
    _retype_definition(_JSON, was=_JSONB, cast="json")


def downgrade() -> None:
    _retype_definition(_JSONB, was=_JSON, cast="jsonb")


def _retype_definition(
    type_: sa.types.TypeEngine[Any], *, was: sa.types.TypeEngine[Any], cast: str
) -> None:
    """Make ``team_versions.definition`` a ``type_`` on PostgreSQL, its values cast to
    ``cast``; SQLite stores the text as given either way."""
    if op.get_context().dialect.name != "postgresql":
        return
    op.alter_column(
        "team_versions",
        "definition",
        type_=type_,
        existing_type=was,
        existing_nullable=False,
        postgresql_using=f"definition::{cast}",
    )
