"""A team graph's node written once as steps (:mod:`relaygraph._calls`), in the two forms
LangGraph runs: on a thread under ``stream``, awaited on the event loop under ``astream``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from langchain_core.runnables import RunnableConfig

from relaygraph._calls import Steps, run_async, run_sync
from relaygraph.supervisor._state import TeamState

__all__ = ["StepsNode", "steps_node"]

StepsNode = Callable[[TeamState, RunnableConfig], Steps[Any]]


def steps_node(steps: StepsNode, name: str, *, subgraph: Any = None) -> Any:
    """The node whose logic is ``steps``: run on the thread (``stream``) or awaited, holding
    no thread while its model answers (``astream``).

    LangGraph's own node wrapper (what ``add_node`` makes of a plain function, untraced),
    given both forms; the public runnable that takes both (``RunnableLambda``) would add a
    run of its own to every node's trace.

    Args:
        subgraph: The graph the node runs inside it (an agent's), if any: LangGraph finds a
            node's subgraph, for its state and its interrupts, among the values the source
            of the node's function names, so the function names it.
    """
    from langgraph._internal._runnable import RunnableCallable

    def node(state: TeamState, config: RunnableConfig) -> Any:
        subgraph  # noqa: B018 (see the docstring)
        return run_sync(steps(state, config))

    async def anode(state: TeamState, config: RunnableConfig) -> Any:
        return await run_async(steps(state, config))

    return RunnableCallable(node, anode, name=name, trace=False)
