"""relaygraph: a supervised team of agents on LangGraph, with policies and an audit trail.

from relaygraph import Agent, Team, builtin, run_task

team = Team(agents=[builtin.researcher(), builtin.writer(), my_agent])
result = run_task("...", team=team, model="openai:gpt-4o-mini")
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
    from relaygraph.runner import arun_task, run_task
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
    "arun_task",
    "builtin",
    "run_task",
]

# Imported on first use: ``import relaygraph`` (the CLI's first line) stays free of
# LangChain and LangGraph until a team is actually built.
_LAZY = {
    "Agent": "relaygraph.agents",
    "Team": "relaygraph.team",
    "arun_task": "relaygraph.runner",
    "builtin": "relaygraph.agents",
    "run_task": "relaygraph.runner",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module = importlib.import_module(_LAZY[name])
        value = getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'relaygraph' has no attribute {name!r}")
