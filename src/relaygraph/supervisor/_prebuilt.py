"""What the topologies built on a prebuilt LangGraph multi-agent graph share (``swarm`` on
``langgraph_swarm``, ``supervisor-tools`` on ``langgraph_supervisor``): what each is built
from, and the closing ``finalize`` both end with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import RunnableLambda
from langgraph.graph import END, StateGraph

from relaygraph._names import FINALIZE
from relaygraph.policies import TeamPolicy
from relaygraph.supervisor._agent_node import Exits, agent_members
from relaygraph.supervisor._control import make_closing
from relaygraph.topology import Topology


@dataclass(frozen=True, kw_only=True, slots=True)
class PrebuiltTeam:
    """What a prebuilt topology's graph is made of, as ``build_team`` checked it."""

    models: dict[str, BaseChatModel]
    """A chat model for each role of the topology."""
    team: Any
    """The team (``relaygraph.team.Team``): its agents, tools and supervisor prompt."""
    policy: TeamPolicy
    topology: Topology

    @property
    def agents(self) -> tuple[str, ...]:
        """The team's agents, in the policy's order."""
        return tuple(self.policy.agents)

    def members(self, exits: Exits) -> list[RunnableLambda[Any, Any]]:
        """Each agent as a named runnable that leaves its node by ``exits``."""
        return agent_members(self.models, self.team, self.policy, exits)

    def close(self, builder: StateGraph[Any, Any, Any, Any]) -> StateGraph[Any, Any, Any, Any]:
        """End ``builder``'s graph with the closing ``finalize``; it is ready to compile."""
        builder.add_node(FINALIZE, make_closing())
        builder.add_edge(FINALIZE, END)
        return builder
