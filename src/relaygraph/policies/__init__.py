"""What each agent may do and how much of it: the policy layer around the team.

A :class:`TeamPolicy` is a value: which tools and which direct handoffs each agent has,
and the limits that end a task gracefully instead of letting it run away.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from relaygraph.errors import ConfigError

__all__ = ["DEFAULT_TOOLS", "AgentPolicy", "TeamPolicy", "default_policy"]

DEFAULT_TOOLS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "researcher": ("search_docs", "read_doc"),
        "coder": ("run_python", "write_file", "read_file"),
        "writer": ("save_artifact", "list_artifacts"),
    }
)
"""The tools each agent has unless a policy narrows them."""


@dataclass(frozen=True, kw_only=True, slots=True)
class AgentPolicy:
    """What one agent may do."""

    tools: tuple[str, ...]
    """Tool names the agent is given; other tools do not exist for it."""
    handoffs: tuple[str, ...]
    """Peers the agent may hand work to directly (``transfer_to_<peer>`` tools)."""
    max_model_calls: int = 8
    """Model calls per visit; at the limit the agent ends its visit with what it has."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TeamPolicy:
    """The team's policy: per-agent permissions and team-wide limits."""

    agents: Mapping[str, AgentPolicy]
    max_agent_runs: int = 12
    """Agent visits per task, routed or handed off; at the limit the task is finalized
    from what exists, with status ``degraded``."""

    def agent(self, name: str) -> AgentPolicy:
        try:
            return self.agents[name]
        except KeyError:
            known = ", ".join(self.agents)
            raise ConfigError(f"unknown agent {name!r}; known agents: {known}") from None

    @property
    def recursion_limit(self) -> int:
        """A LangGraph recursion limit that the team limits always reach first.

        Each visit costs at most two super-steps (supervisor, agent) plus begin and finalize;
        the margin keeps the graph's own limit a last resort, never the normal way to stop.
        """
        return 2 * self.max_agent_runs + 10


def default_policy(agent_names: tuple[str, ...] = tuple(DEFAULT_TOOLS)) -> TeamPolicy:
    """Every agent gets its default tools and a handoff to each other agent."""
    return TeamPolicy(
        agents=MappingProxyType(
            {
                name: AgentPolicy(
                    tools=DEFAULT_TOOLS.get(name, ()),
                    handoffs=tuple(peer for peer in agent_names if peer != name),
                )
                for name in agent_names
            }
        )
    )
