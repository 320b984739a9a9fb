"""The built-in agents (researcher, coder, writer) and tools, made through the public API.

They are ordinary :class:`~relaygraph.agents.Agent` values: a team file's
``use = "builtin:researcher"`` and Python's ``builtin.researcher()`` start from them, and
any field can be replaced (``dataclasses.replace`` or the factories' keyword arguments).

    from relaygraph import Team, builtin

    team = Team(agents=[builtin.researcher(kb="./docs"), builtin.writer()])
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from relaygraph.agents._agent import Agent

if TYPE_CHECKING:
    from langchain_core.tools import BaseTool

__all__ = [
    "AGENT_FACTORIES",
    "COMMON_PROMPT",
    "HANDOFF_PROMPT",
    "agents",
    "coder",
    "researcher",
    "tools",
    "writer",
]

COMMON_PROMPT = (
    "In a team, you see only your task and the results so far. Use your tools, then reply "
    "with a short, self-contained result: the next agent or the user reads only that."
)
"""How every built-in agent is told to work in the team; a custom agent may reuse it. It goes
with every model call of every agent, so it says only what the agent cannot see otherwise."""

HANDOFF_PROMPT = (
    "If a peer suits what remains better, call its transfer_to_<peer> tool with a "
    "self-contained task."
)
"""Told to the built-in agents that may hand off to a peer (not the writer, which has none:
a prompt naming tools the agent does not have only costs tokens and invites refused calls)."""


def tools() -> Mapping[str, BaseTool]:
    """The built-in tools by name: what a name in an agent's ``tools`` refers to."""
    from relaygraph.agents.tools import BUILTIN_TOOLS

    return BUILTIN_TOOLS


def researcher(*, kb: str | Path | Iterable[str | Path] = (), **changes: Any) -> Agent:
    """The researcher: finds facts in the knowledge base and cites doc ids.

    Args:
        kb: Folders to index into the task's knowledge base (the sample corpus when the
            knowledge base is empty and none are given).
        changes: Any other :class:`Agent` field to replace.
    """
    folders = (kb,) if isinstance(kb, str | Path) else tuple(kb)
    return _agent(
        {
            "name": "researcher",
            "description": "finds facts in the knowledge base (search_docs, read_doc), cites "
            "doc ids",
            "prompt": "You are the researcher. Find facts in the knowledge base with "
            "search_docs and read_doc, and cite the doc ids you used in square brackets. "
            + COMMON_PROMPT
            + " "
            + HANDOFF_PROMPT,
            "tools": ("search_docs", "read_doc"),
            "kb": tuple(Path(f) for f in folders),
        },
        changes,
    )


def coder(**changes: Any) -> Agent:
    """The coder: writes Python and runs it in the sandbox; keeps files in the workspace."""
    return _agent(
        {
            "name": "coder",
            "description": "writes and runs Python in a sandbox (run_python, write_file, "
            "read_file)",
            "prompt": "You are the coder. Write Python and run it with run_python to check it "
            "works; keep files in the workspace with write_file and read_file. Report the code "
            "and what running it printed. " + COMMON_PROMPT + " " + HANDOFF_PROMPT,
            "tools": ("run_python", "write_file", "read_file"),
        },
        changes,
    )


def writer(**changes: Any) -> Agent:
    """The writer: turns the results into the deliverable and saves it as an artifact.

    It is the team's last stage and hands off to no peer (``handoffs=()``): its reply is
    the deliverable, which finalize answers with, and work it finds missing goes back
    through the supervisor, which sees every result. Give it ``handoffs`` to change that.
    """
    return _agent(
        {
            "name": "writer",
            "description": "writes the deliverable (a report or answer) and saves it as an "
            "artifact",
            "prompt": "You are the writer. Turn the results so far into a clear deliverable, "
            "save it with save_artifact (for example report.md), and answer with its text. "
            + COMMON_PROMPT,
            "tools": ("save_artifact", "list_artifacts"),
            "handoffs": (),
        },
        changes,
    )


AGENT_FACTORIES = MappingProxyType({"researcher": researcher, "coder": coder, "writer": writer})
"""The built-in agents' factories by name (``use = "builtin:<name>"`` in a team file)."""


def agents() -> tuple[Agent, ...]:
    """The default team's agents: researcher, coder and writer."""
    return (researcher(), coder(), writer())


def _agent(defaults: dict[str, Any], changes: Mapping[str, Any]) -> Agent:
    values = {**defaults, **changes}
    values.setdefault("origins", {})
    origins = dict(values["origins"])
    for name in values.get("tools", ()):
        if isinstance(name, str):
            origins.setdefault(name, "builtin")
    values["origins"] = origins
    return Agent(**values)
