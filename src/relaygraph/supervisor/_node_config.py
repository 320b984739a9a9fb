"""What a team node reads from its LangGraph config (its task's namespace, its step) and
adds to the config of its model calls."""

from __future__ import annotations

from typing import Any

from langchain_core.runnables import RunnableConfig

from relaygraph._names import PRIOR_CALLS_KEY, REPLAYS_BY_POSITION
from relaygraph.supervisor._state import TeamState

__all__ = ["call_config", "replays_by_position", "step_of", "task_ns"]


def task_ns(config: RunnableConfig) -> str:
    """The running task's checkpoint namespace (``node:<task id>``): stable across re-runs."""
    return str(config.get("configurable", {}).get("checkpoint_ns") or "")


def step_of(config: RunnableConfig) -> int | None:
    step = config.get("metadata", {}).get("langgraph_step")
    return int(step) if step is not None else None


def replays_by_position(model: object) -> bool:
    """Whether ``model`` picks its replies by their position in its role's history
    (:data:`~relaygraph._names.REPLAYS_BY_POSITION`); decided when the graph is built."""
    return getattr(model, REPLAYS_BY_POSITION, False) is True


def call_config(
    config: RunnableConfig,
    state: TeamState,
    role: str,
    *,
    replays: bool,
    **configurable: Any,
) -> RunnableConfig:
    """The node's config for a model call of ``role``, plus ``configurable``. For a model
    that replays by position (``replays``), also how many model calls the role made earlier
    in the thread (:data:`~relaygraph._names.PRIOR_CALLS_KEY`, from its usage records);
    any other model is told nothing of it."""
    extra: dict[str, Any] = dict(configurable)
    metadata = config.get("metadata", {})
    if replays:
        prior = sum(u["model_calls"] for u in state.get("usage", []) if u["agent"] == role)
        extra[PRIOR_CALLS_KEY] = prior
        metadata = {**metadata, PRIOR_CALLS_KEY: prior}
    if not extra:
        return config
    return {
        **config,
        "configurable": {**config.get("configurable", {}), **extra},
        "metadata": metadata,
    }
