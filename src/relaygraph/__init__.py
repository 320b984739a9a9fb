"""relaygraph: a supervised team of agents on LangGraph, with policies and an audit trail.

from relaygraph import Agent, Team, builtin

team = Team(agents=[builtin.researcher(), builtin.writer(), my_agent])
result = team.run("...", model="openai:gpt-4o-mini")
"""

from typing import TYPE_CHECKING, Any

from relaygraph.errors import (
    ConfigError,
    ModelSpecError,
    RelaygraphError,
    RunError,
    ScriptError,
    TaskBusy,
    ToolInputError,
)

if TYPE_CHECKING:
    from relaygraph.agents import Agent, builtin
    from relaygraph.team import Team

__version__ = "0.1.0"

__all__ = [
    "Agent",
    "ConfigError",
    "ModelSpecError",
    "RelaygraphError",
    "RunError",
    "ScriptError",
    "TaskBusy",
    "Team",
    "ToolInputError",
    "__version__",
    "builtin",
]

# Imported on first use: ``import relaygraph`` (the CLI's first line) stays free of
# LangChain and LangGraph until a team is actually built.
_LAZY = {"Agent": "relaygraph.agents", "Team": "relaygraph.team", "builtin": "relaygraph.agents"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module = importlib.import_module(_LAZY[name])
        value = getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'relaygraph' has no attribute {name!r}")
