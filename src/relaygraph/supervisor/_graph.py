"""The team graph: begin → supervisor ⇄ agents (and agent → agent handoffs) → finalize."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langchain_core.language_models import BaseChatModel
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Checkpointer

from relaygraph._names import BEGIN, FINALIZE, SUPERVISOR
from relaygraph.agents import TaskContext
from relaygraph.errors import ConfigError
from relaygraph.policies import TeamPolicy
from relaygraph.supervisor._agent_node import agent_nodes
from relaygraph.supervisor._begin_node import begin_turn
from relaygraph.supervisor._finalize_node import FinalizeNode
from relaygraph.supervisor._prebuilt import PrebuiltTeam
from relaygraph.supervisor._state import TeamState
from relaygraph.supervisor._supervisor_node import SupervisorNode
from relaygraph.topology import Topology


def build_team(
    models: Mapping[str, BaseChatModel],
    *,
    team: Any,
    policy: TeamPolicy | None = None,
    checkpointer: Checkpointer = None,
    topology: Topology | None = None,
) -> CompiledStateGraph[TeamState, TaskContext, TeamState, TeamState]:
    """Compile the team graph.

    Args:
        models: A chat model for each role of the topology (:meth:`Topology.roles`): each
            agent of the team, and ``supervisor`` and ``finalize`` where it has them.
        team: The team (``relaygraph.team.Team``): its agents, tools and supervisor prompt.
        policy: Tools, handoffs and limits; the team's own policy if None.
        checkpointer: Where runs are checkpointed (needed for ``--thread`` and approvals).
        topology: How the agents are arranged; the team's own if None.

    Raises:
        ConfigError: A model is missing for a role, or the policy does not fit the team.
    """
    policy = policy or team.resolved_policy
    topology = topology or team.arrangement
    _check_team(models, team, policy, topology)
    if topology.kind in ("swarm", "supervisor-tools"):
        if topology.kind == "swarm":
            from relaygraph.supervisor._swarm import build_swarm_team as build
        else:
            from relaygraph.supervisor._tool_supervisor import (
                build_tool_supervisor_team as build,
            )
        parts = PrebuiltTeam(models=dict(models), team=team, policy=policy, topology=topology)
        return build(parts).compile(checkpointer=checkpointer, name="relaygraph")
    return _structured_team(models, team, policy, checkpointer)


def _check_team(
    models: Mapping[str, BaseChatModel], team: Any, policy: TeamPolicy, topology: Topology
) -> None:
    """Refuse a team the policy, the models or the topology do not fit.

    Raises:
        ConfigError: A model is missing for a role, or the policy does not fit the team.
    """
    members = [agent.name for agent in team.agents]
    agents = tuple(policy.agents)
    if set(agents) != set(members):
        raise ConfigError(
            f"the policy is over agents {', '.join(agents)}; the team has {', '.join(members)}"
        )
    missing = [role for role in topology.roles(agents) if role not in models]
    if missing:
        raise ConfigError(f"no model given for: {', '.join(missing)}")
    for name in agents:
        for peer in policy.agents[name].handoffs:
            if peer not in agents or peer == name:
                raise ConfigError(f"agent {name!r} may not hand off to {peer!r}: not a peer")
    topology.check_agents(agents)


def _structured_team(
    models: Mapping[str, BaseChatModel], team: Any, policy: TeamPolicy, checkpointer: Checkpointer
) -> CompiledStateGraph[TeamState, TaskContext, TeamState, TeamState]:
    """The structured team's graph: begin → supervisor ⇄ agents → finalize."""
    members = {agent.name: agent for agent in team.agents}
    agents = tuple(policy.agents)
    builder = StateGraph(TeamState, context_schema=TaskContext)
    builder.add_node(BEGIN, begin_turn)
    builder.add_node(
        SUPERVISOR,
        SupervisorNode(
            models[SUPERVISOR],
            policy,
            [members[a] for a in agents],
            team.supervisor_prompt,
            finalize_model=models[FINALIZE],
        ).runnable(),
        # It may also go to itself (a re-route after a refused ping-pong); that edge is not
        # declared because LangChain's ASCII renderer cannot draw a self-loop. Nor is its
        # end (a FINISH answered with the last reply): the drawing keeps one way out,
        # through finalize, which every other end takes.
        destinations=(*agents, FINALIZE),
    )
    for name, node in agent_nodes(models, team, policy, None).items():
        builder.add_node(
            name, node, destinations=(SUPERVISOR, FINALIZE, *policy.agents[name].handoffs)
        )
    builder.add_node(FINALIZE, FinalizeNode(models[FINALIZE], policy).runnable())
    builder.add_edge(START, BEGIN)
    builder.add_edge(BEGIN, SUPERVISOR)
    builder.add_edge(FINALIZE, END)
    return builder.compile(checkpointer=checkpointer, name="relaygraph")


class _Unused(BaseChatModel):
    """A stand-in for a role's model in a graph that is drawn, never run: it binds tools (a
    prebuilt agent binds them as it is built) and refuses every call."""

    role: str

    @property
    def _llm_type(self) -> str:
        return "relaygraph-unused"

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any) -> Any:
        raise RuntimeError(f"the drawing's stand-in for {self.role!r} was called")

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def draw_team(
    *,
    team: Any,
    policy: TeamPolicy | None = None,
    ascii: bool = False,
    topology: Topology | None = None,
) -> str:
    """The team graph's topology as Mermaid (default) or ASCII art.

    The drawing needs no model: each role gets a stand-in, which is never called.
    """
    policy = policy or team.resolved_policy
    topology = topology or team.arrangement
    models = {role: _Unused(role=role) for role in topology.roles(tuple(policy.agents))}
    graph = build_team(models, team=team, policy=policy, topology=topology).get_graph()
    return graph.draw_ascii() if ascii else graph.draw_mermaid()
