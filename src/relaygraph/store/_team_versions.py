"""The teams projects register: each version of each named team, newest by number."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from relaygraph.store._models import TeamVersionRow


def latest(session: Session, project_id: str, name: str) -> TeamVersionRow | None:
    """The project's latest version of team ``name``."""
    return session.scalars(
        select(TeamVersionRow)
        .where(TeamVersionRow.project_id == project_id, TeamVersionRow.name == name)
        .order_by(TeamVersionRow.version.desc())
        .limit(1)
    ).first()


def one(session: Session, project_id: str, name: str, version: int) -> TeamVersionRow | None:
    return session.scalars(
        select(TeamVersionRow).where(
            TeamVersionRow.project_id == project_id,
            TeamVersionRow.name == name,
            TeamVersionRow.version == version,
        )
    ).first()


def every_version(session: Session, project_id: str, name: str) -> list[TeamVersionRow]:
    return list(
        session.scalars(
            select(TeamVersionRow)
            .where(TeamVersionRow.project_id == project_id, TeamVersionRow.name == name)
            .order_by(TeamVersionRow.version)
        )
    )


def latest_of_each(session: Session, project_id: str) -> list[TeamVersionRow]:
    """The latest version of each of the project's teams, by name."""
    newest = (
        select(TeamVersionRow.name, func.max(TeamVersionRow.version).label("version"))
        .where(TeamVersionRow.project_id == project_id)
        .group_by(TeamVersionRow.name)
        .subquery()
    )
    return list(
        session.scalars(
            select(TeamVersionRow)
            .join(
                newest,
                (TeamVersionRow.name == newest.c.name)
                & (TeamVersionRow.version == newest.c.version),
            )
            .where(TeamVersionRow.project_id == project_id)
            .order_by(TeamVersionRow.name)
        )
    )
