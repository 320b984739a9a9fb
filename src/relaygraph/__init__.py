"""relaygraph: a supervised team of agents on LangGraph, with policies and an audit trail.

from relaygraph import Agent, Team, builtin, run_task

team = Team(agents=[builtin.researcher(), builtin.writer(), my_agent])
result = run_task("...", team=team, model="openai:gpt-4o-mini")
"""

from typing import TYPE_CHECKING

from relaygraph._lazy import lazy_imports
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
__getattr__ = lazy_imports(
    __name__,
    {
        "Agent": ".agents",
        "Team": ".team",
        "arun_task": ".runner",
        "builtin": ".agents",
        "run_task": ".runner",
    },
)
