"""The team's agents: researcher, coder and writer, each a prebuilt LangGraph agent.

Each agent is ``langchain.agents.create_agent`` compiled under its own name and run as a
subgraph of the team graph, with real tools (see :mod:`relaygraph.agents.tools`) and a
``transfer_to_<peer>`` tool for each peer its policy allows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from relaygraph.agents.context import TaskContext

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel
    from langgraph.graph.state import CompiledStateGraph

    from relaygraph.policies import TeamPolicy

__all__ = ["AGENTS", "AGENT_NAMES", "AgentSpec", "TaskContext", "build_agent"]


@dataclass(frozen=True, kw_only=True, slots=True)
class AgentSpec:
    """An agent of the team: its name, what the supervisor is told about it, its prompt."""

    name: str
    description: str
    """One line the supervisor reads when it chooses who works next."""
    system_prompt: str


_COMMON = (
    "You work in a team with a supervisor. You receive one task and the results other agents "
    "produced so far; you do not see their conversations. Use your tools, then answer with a "
    "short, self-contained result that the next agent can use. If a peer is better suited for "
    "what remains, hand the work to it with a transfer_to_<peer> tool and a self-contained task."
)

AGENTS: Mapping[str, AgentSpec] = MappingProxyType(
    {
        "researcher": AgentSpec(
            name="researcher",
            description="finds facts in the knowledge base (search_docs, read_doc), cites doc ids",
            system_prompt="You are the researcher. Find facts in the knowledge base with "
            "search_docs and read_doc, and cite the doc ids you used in square brackets. "
            + _COMMON,
        ),
        "coder": AgentSpec(
            name="coder",
            description="writes and runs Python in a sandbox (run_python, write_file, read_file)",
            system_prompt="You are the coder. Write Python and run it with run_python to check "
            "it works; keep files in the workspace with write_file and read_file. Report the "
            "code and what running it printed. " + _COMMON,
        ),
        "writer": AgentSpec(
            name="writer",
            description="writes the deliverable (a report or answer) and saves it as an artifact",
            system_prompt="You are the writer. Turn the results so far into a clear deliverable, "
            "save it with save_artifact (for example report.md), and answer with its text. "
            + _COMMON,
        ),
    }
)
"""The built-in agents, by name."""

AGENT_NAMES: tuple[str, ...] = tuple(AGENTS)


def build_agent(
    spec: AgentSpec, model: BaseChatModel, team_policy: TeamPolicy
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """Compile one agent as a LangGraph subgraph with the tools its policy allows.

    The model is bound only to the allowed tools; the policy middleware still refuses any
    other tool name at execution (a made-up name, or one planted by a prompt injection),
    and enforces the agent's budgets, repeated-call rule and approvals.

    Args:
        spec: Which agent.
        model: Its chat model.
        team_policy: The team's policy; this agent's part gives its tools and handoffs.

    Raises:
        ConfigError: The policy names a tool that does not exist.
    """
    from langchain.agents import create_agent

    from relaygraph.agents._middleware import ToolEventsMiddleware
    from relaygraph.agents.tools import TOOLS
    from relaygraph.errors import ConfigError
    from relaygraph.handoffs import create_handoff_tool
    from relaygraph.policies.middleware import PolicyMiddleware

    policy = team_policy.agent(spec.name)
    unknown = [t for t in policy.tools if t not in TOOLS]
    if unknown:
        raise ConfigError(
            f"agent {spec.name!r}: unknown tool(s) {', '.join(map(repr, unknown))}; "
            f"known tools: {', '.join(TOOLS)}"
        )
    tools = [TOOLS[t] for t in policy.tools]
    tools += [create_handoff_tool(peer, source=spec.name) for peer in policy.handoffs]
    return create_agent(
        model,
        tools,
        system_prompt=spec.system_prompt,
        # Tool events wrap the policy, so refused calls are reported like any other result.
        middleware=[ToolEventsMiddleware(spec.name), PolicyMiddleware(spec.name, team_policy)],
        context_schema=TaskContext,
        name=spec.name,
    )
