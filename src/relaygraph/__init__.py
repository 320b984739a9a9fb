"""relaygraph: a supervised team of agents on LangGraph, with policies and an audit trail."""

from relaygraph.errors import (
    ConfigError,
    ModelSpecError,
    RelaygraphError,
    RunError,
    ScriptError,
    TaskBusy,
    ToolInputError,
)

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "ModelSpecError",
    "RelaygraphError",
    "RunError",
    "ScriptError",
    "TaskBusy",
    "ToolInputError",
    "__version__",
]
