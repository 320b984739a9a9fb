"""relaygraph teams on LangGraph's own server: the graphs ``langgraph.json`` names.

    pip install -e '.[langgraph-server]'     # langgraph-cli[inmem]; docs/langgraph-server.md
    langgraph dev --no-browser               # in the repository, beside langgraph.json

``langgraph.json`` names two graph factories of this module:

- ``default``: :func:`default_team_graph`, the built-in team (researcher, coder, writer);
- ``team``: :func:`team_file_graph`, the team file that ``RELAYGRAPH_TEAM_FILE`` names.

Each is compiled once per server process, for the model that ``RELAYGRAPH_MODEL`` names
(else the team's own model, else the embedded one). The server provides the checkpointer and
the thread. A run's :class:`~relaygraph.agents.TaskContext` (workspace, artifacts, knowledge
base, under ``RELAYGRAPH_HOME``) is made from its thread: a client passes nothing, or names a
task folder with ``context={"task_id": ...}`` (:class:`ServedContext`). The team's events
(route, handoff, agent and tool events, final) are LangGraph custom stream events, so
``client.runs.stream(..., stream_mode=["custom", "values"])`` shows the handoffs.

:func:`served_graph` serves any team, for a ``langgraph.json`` of your own::

    # my_graphs.py, named in langgraph.json as "./my_graphs.py:graph"
    from relaygraph.langgraph_app import served_graph
    from relaygraph.team import load_team

    graph = served_graph(load_team("team.toml"), model="openai:gpt-4o-mini")
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import sys
import threading
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langchain_core.runnables import RunnableConfig
from langgraph.graph.state import CompiledStateGraph

from relaygraph._home import data_home
from relaygraph.agents import TaskContext
from relaygraph.errors import ConfigError

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel

    from relaygraph.team import Team

__all__ = [
    "MODEL_ENV",
    "TEAM_FILE_ENV",
    "ServedContext",
    "ServedTeamGraph",
    "default_team_graph",
    "served_graph",
    "team_file_graph",
]

TEAM_FILE_ENV = "RELAYGRAPH_TEAM_FILE"
"""The team file the ``team`` graph serves (relative to the server's working directory)."""
MODEL_ENV = "RELAYGRAPH_MODEL"
"""The model spec of every role of a served team (``scripted:PATH``, ``openai:MODEL``, ...);
unset, the team's own model, else the embedded model."""

logger = logging.getLogger(__name__)

_TASK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@dataclass(frozen=True, kw_only=True, slots=True)
class ServedContext:
    """What a client of the LangGraph server may pass as a run's ``context``.

    The paths of a run (workspace, artifacts, knowledge base) are never taken from a
    client: they are made under the server's data directory.
    """

    task_id: str | None = None
    """Names the task's folders (``tasks/<task_id>/`` under ``RELAYGRAPH_HOME``), so that
    runs on several threads may share a workspace; default: ``lg-<thread id>``."""


class ServedTeamGraph(CompiledStateGraph[Any, Any, Any, Any]):
    """A compiled team graph that makes each run's :class:`TaskContext` from its thread.

    LangGraph's server passes a run's context as a JSON object (or its ``configurable``
    when the client sent none); this graph takes at most a ``task_id`` from it and builds
    the task's context under ``home``, so a tool never sees a path a client chose.
    """

    def __init__(
        self, *, served_home: Path, served_knowledge_base: Path | None, **graph: Any
    ) -> None:
        # ``copy()`` (which the server calls on every run) passes every attribute back in,
        # these two included.
        super().__init__(**graph)
        self.served_home = served_home
        self.served_knowledge_base = served_knowledge_base

    def task_context(self, config: RunnableConfig | None, context: Any = None) -> TaskContext:
        """The run's context: ``context`` itself when it is a :class:`TaskContext`, else made
        from its ``task_id`` (if any) and the run's thread.

        Raises:
            ConfigError: The ``task_id`` is not a plain folder name.
        """
        if isinstance(context, TaskContext):
            return context
        configurable = {
            **((self.config or {}).get("configurable") or {}),
            **((config or {}).get("configurable") or {}),
        }
        thread_id = str(configurable.get("thread_id") or "")
        if isinstance(context, ServedContext):
            task_id = context.task_id
        elif isinstance(context, Mapping):
            task_id = context.get("task_id")
        else:
            task_id = None
        task_id = task_id or (f"lg-{thread_id}" if thread_id else None)
        if not task_id:
            raise ConfigError(
                "a served relaygraph team runs on a thread, or with context={'task_id': ...}"
            )
        if not isinstance(task_id, str) or not _TASK_ID.fullmatch(task_id):
            raise ConfigError(
                f"context task_id {task_id!r} is not a folder name (letters, digits, '.', "
                "'_' and '-', at most 128, not starting with '.')"
            )
        made = TaskContext.for_task(
            self.served_home, task_id=task_id, thread_id=thread_id or task_id
        )
        if self.served_knowledge_base is not None:
            made = replace(made, knowledge_base=self.served_knowledge_base)
        return made

    def stream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Iterator[Any]:
        kwargs["context"] = self.task_context(config, kwargs.get("context"))
        return super().stream(input, config, **kwargs)

    def astream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        kwargs["context"] = self.task_context(config, kwargs.get("context"))
        return super().astream(input, config, **kwargs)


def served_graph(
    team: Team,
    *,
    model: str | BaseChatModel | None = None,
    agent_models: Mapping[str, str | BaseChatModel] | None = None,
    home: str | os.PathLike[str] | None = None,
) -> ServedTeamGraph:
    """Compile ``team`` for a LangGraph server (no checkpointer: the server brings its own).

    Args:
        team: The team to serve.
        model: Every role's model (as ``Team.compile``); the team's own when None.
        agent_models: A model per role, over ``model``.
        home: The data directory of task folders and knowledge bases; default
            ``$RELAYGRAPH_HOME`` (else ``~/.relaygraph``).

    Raises:
        ConfigError: A model cannot be built, or a knowledge-base folder cannot be read.
    """
    from relaygraph.runner import prepare_knowledge_base

    root = data_home(home)
    graph = team.compile(model=model, agent_models=agent_models)
    # As a relaygraph task run does: a team with folders of its own reads a knowledge base
    # of exactly those; any other reads the shared one, with the sample corpus when empty.
    knowledge_base = prepare_knowledge_base(team, root)
    attributes = {k: v for k, v in graph.__dict__.items() if k != "__orig_class__"}
    # What the server shows a client (the assistant's context schema) and keeps of a
    # run's context is what it may choose: the task, not the paths.
    attributes["context_schema"] = ServedContext
    served = ServedTeamGraph(served_home=root, served_knowledge_base=knowledge_base, **attributes)
    # The team's own limits stop a run first; LangGraph's limit is the last resort (as in
    # relaygraph's runner). A client's config may still set another.
    return served.with_config(recursion_limit=team.resolved_policy.recursion_limit)


_SERVED: dict[tuple[str, ...], ServedTeamGraph] = {}
_SERVED_LOCK = threading.Lock()


def _served_from_env(team_file: str | None) -> ServedTeamGraph:
    """The graph for ``team_file`` (None: the default team) and ``$RELAYGRAPH_MODEL``,
    compiled once per process and these settings."""
    from relaygraph.team import default_team, load_team

    model = os.environ.get(MODEL_ENV) or None
    key = (team_file or "", model or "", os.environ.get("RELAYGRAPH_HOME", ""))
    with _SERVED_LOCK:
        if key not in _SERVED:
            team = load_team(Path(team_file).resolve()) if team_file else default_team()
            _SERVED[key] = served_graph(team, model=model)
        return _SERVED[key]


async def default_team_graph() -> ServedTeamGraph:
    """``langgraph.json``'s ``default`` graph: the built-in team, on ``$RELAYGRAPH_MODEL``."""
    # Compiling reads files (scripts, the knowledge base); off the server's event loop.
    return await asyncio.to_thread(_served_from_env, None)


async def team_file_graph() -> ServedTeamGraph:
    """``langgraph.json``'s ``team`` graph: the team file ``$RELAYGRAPH_TEAM_FILE`` names.

    Raises:
        ConfigError: The variable is unset, or the file is not a valid team file.
    """
    team_file = os.environ.get(TEAM_FILE_ENV)
    if not team_file:
        raise ConfigError(
            f"the 'team' graph serves the team file ${TEAM_FILE_ENV} names; it is not set "
            f"(start the server as {TEAM_FILE_ENV}=team.toml langgraph dev)"
        )
    return await asyncio.to_thread(_served_from_env, team_file)


_FACTORIES = {"default_team_graph": None, "team_file_graph": TEAM_FILE_ENV}
"""This module's graph factories, with the variable (if any) without which one has no team."""


def _graphs_the_server_names() -> list[str]:
    """The factories of this module that LangGraph's server, now importing it, serves:
    those that ``langgraph.json``'s ``graphs`` name (the CLI passes them to the server as
    ``LANGSERVE_GRAPHS``). None outside that server."""
    if "langgraph_api" not in sys.modules:
        return []
    try:
        graphs = json.loads(os.environ.get("LANGSERVE_GRAPHS") or "{}")
        paths = [g["path"] if isinstance(g, dict) else g for g in graphs.values()]
    except (ValueError, TypeError, KeyError, AttributeError):
        return []
    named = [str(p).rsplit(":", 1) for p in paths]
    return [
        factory
        for where, factory in (n for n in named if len(n) == 2)
        if factory in _FACTORIES and where.replace("/", ".").removesuffix(".py").endswith(__name__)
    ]


def _compile_while_the_server_starts() -> None:
    """Compile the served graphs now, while LangGraph's server imports this module.

    The server calls a graph factory at each access and logs one that takes over 250 ms as
    an error ("Slow graph load"); compiling a team (its imports, the knowledge base, its
    MCP servers' tools) takes longer, so the first run's access did. Done here, at start,
    every access finds the compiled graph. A graph that cannot be made is left to its
    factory, which raises the error where the server reports it.
    """
    for factory in _graphs_the_server_names():
        variable = _FACTORIES[factory]
        team_file = os.environ.get(variable) if variable else None
        if variable and not team_file:
            continue
        try:
            _served_from_env(team_file)
        except Exception as exc:
            logger.warning("graph %s is not ready: %s", factory, exc)


_compile_while_the_server_starts()
