"""The team's agents: each a prebuilt LangGraph agent with real tools.

An :class:`Agent` is a value its user declares (name, description, prompt, tools, handoffs,
model); :mod:`relaygraph.agents.builtin` makes the built-in researcher, coder and writer the
same way. :func:`build_agent` compiles one as ``langchain.agents.create_agent`` under its own
name, run as a subgraph of the team graph, with a ``transfer_to_<peer>`` tool for each peer
its policy allows. Each completed tool call is recorded in the task's :class:`ToolJournal`
(when its :class:`TaskContext` has one) before its result returns into the graph, so a step
re-run after a crash answers it from there instead of running the tool again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from relaygraph.agents import builtin
from relaygraph.agents._agent import RESERVED_NAMES, Agent, check_agent_name, to_tool, tool_name
from relaygraph.agents.context import TaskContext, ToolJournal

if TYPE_CHECKING:
    import asyncio

    from langchain_core.language_models import BaseChatModel
    from langchain_core.tools import BaseTool
    from langgraph.graph.state import CompiledStateGraph

    from relaygraph.policies import TeamPolicy

__all__ = [
    "RESERVED_NAMES",
    "Agent",
    "TaskContext",
    "ToolJournal",
    "background_loop",
    "build_agent",
    "builtin",
    "check_agent_name",
    "to_tool",
    "tool_name",
]


def background_loop() -> asyncio.AbstractEventLoop:
    """The event loop this process runs coroutine-only tools and MCP sessions on, in a
    daemon thread started on first use: a tool that keeps state bound to a loop (an HTTP
    client's pool, an MCP session) finds it again at every call."""
    from relaygraph.agents._async_tools import background_loop

    return background_loop()


def build_agent(
    agent: Agent,
    model: BaseChatModel,
    team_policy: TeamPolicy,
    tools: Mapping[str, BaseTool],
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """Compile one agent as a LangGraph subgraph with the tools its policy allows.

    The model is bound only to the allowed tools; the policy middleware still refuses any
    other tool name at execution (a made-up name, or one planted by a prompt injection),
    and enforces the agent's budgets, repeated-call rule and approvals. Innermost, around
    the tool itself, the journal records each call that ran and answers a re-run from it.

    Args:
        agent: Which agent.
        model: Its chat model.
        team_policy: The team's policy; this agent's part gives its tools and handoffs.
        tools: Every tool of the team by name (the policy may give an agent any of them).

    Raises:
        ConfigError: The policy names a tool the team does not have.
    """
    from langchain.agents import create_agent

    from relaygraph.agents._journal import ToolJournalMiddleware
    from relaygraph.agents._middleware import ToolEventsMiddleware
    from relaygraph.errors import ConfigError
    from relaygraph.handoffs import create_handoff_tool
    from relaygraph.policies.middleware import PolicyMiddleware

    policy = team_policy.agent(agent.name)
    unknown = [t for t in policy.tools if t not in tools]
    if unknown:
        raise ConfigError(
            f"agent {agent.name!r}: unknown tool(s) {', '.join(map(repr, unknown))}; "
            f"the team's tools: {', '.join(tools)}"
        )
    given = [tools[t] for t in policy.tools]
    given += [create_handoff_tool(peer, source=agent.name) for peer in policy.handoffs]
    return create_agent(
        model,
        given,
        system_prompt=agent.prompt,
        # Tool events wrap the policy, so refused calls are reported like any other result;
        # the journal sits inside the policy, so it sees only calls that run (never a
        # refusal, and an approval pauses before it).
        middleware=[
            ToolEventsMiddleware(agent.name),
            PolicyMiddleware(agent.name, team_policy),
            ToolJournalMiddleware(agent.name),
        ],
        context_schema=TaskContext,
        name=agent.name,
    )
