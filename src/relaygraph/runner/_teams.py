"""Which team runs a task (the one a caller names, or the one a task records), and the
knowledge base that team reads."""

from __future__ import annotations

import hashlib
import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from relaygraph.errors import ConfigError

if TYPE_CHECKING:
    from relaygraph.store import Task
    from relaygraph.team import Team

__all__ = ["prepare_knowledge_base", "team_from_argument", "team_of_record"]

log = logging.getLogger("relaygraph.runner")
_SKIPS_TOLD: set[tuple[str, str]] = set()
_SKIPS_LOCK = threading.Lock()


def team_from_argument(team: Team | str | Path | None) -> Team:
    """The team a caller names: a :class:`~relaygraph.team.Team`, the path of a team file,
    or None for the built-in team.

    Raises:
        ConfigError: The team file is missing or bad.
    """
    from relaygraph.team import Team, default_team, load_team

    if team is None:
        return default_team()
    if isinstance(team, Team):
        return team
    return load_team(team)


def team_of_record(task: Task) -> Team:
    """The team a task records, from the process's own knowledge: the built-in team, or
    the team file it was read from (read again; :meth:`TaskRunner.recorded_team` checks that it
    is unchanged).

    Raises:
        ConfigError: The task's team is neither.
    """
    from relaygraph.team import DEFAULT_TEAM_NAME, default_team, load_team

    record = task.team or {}
    if record.get("source"):
        return load_team(record["source"])
    if record.get("name", DEFAULT_TEAM_NAME) == DEFAULT_TEAM_NAME:
        return default_team()
    raise ConfigError(
        f"task {task.id} ran team {record.get('name')!r}, which this process does not know; "
        "pass the team (relaygraph resume --team FILE)"
    )


def prepare_knowledge_base(team: Team, home: Path) -> Path | None:
    """Bring the knowledge base ``team`` reads up to date, and say where it is.

    A team with folders of its own reads a knowledge base of exactly those (one per set of
    folders, under ``home/kb``), brought up to date at each call; any other reads the shared
    one (``home/kb.sqlite``), given the sample corpus when it is empty.

    Returns:
        The team's own knowledge base; None for a team that reads the shared one.

    Raises:
        ConfigError: A folder cannot be read.
    """
    from relaygraph.backends.kb import KnowledgeBase, ensure_sample_corpus

    folders = sorted({str(folder) for agent in team.agents for folder in agent.kb})
    own = None
    if folders:
        key = hashlib.sha256("\n".join(folders).encode()).hexdigest()[:16]
        own = home / "kb" / f"{key}.sqlite"
    path = own or home / "kb.sqlite"
    path.parent.mkdir(parents=True, exist_ok=True)
    with KnowledgeBase(path) as kb:
        for folder in folders:
            _tell_skips(kb.add_folder(Path(folder)).skipped)
        if not folders:
            ensure_sample_corpus(kb)
    return own


def _tell_skips(skipped: tuple[tuple[Path, str], ...]) -> None:
    """Log each file of a team's folders that its knowledge base skips (a symlink, a pipe,
    a file too large), once per process: the folders are brought up to date at every run,
    and whoever wrote the team should learn why a document is missing."""
    for path, reason in skipped:
        key = (str(path), reason)
        with _SKIPS_LOCK:
            if key in _SKIPS_TOLD:
                continue
            _SKIPS_TOLD.add(key)
        log.warning("knowledge base: skipped %s: %s", path, reason)
