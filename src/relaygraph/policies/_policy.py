"""Policy values: what each agent may do, how much, and what the team does at the limit."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from relaygraph.errors import ConfigError

OnExhausted = Literal["finalize", "fail"]
OnDetect = Literal["finalize", "supervisor", "human"]
FinalAnswer = Literal["last_reply", "model"]
Citations = Literal["auto", "required"]
LIMIT_NAMES = ("max_model_calls", "max_tool_calls", "max_tokens", "max_cost_usd", "max_seconds")


@dataclass(frozen=True, kw_only=True, slots=True)
class AgentLimits:
    """One agent's budget over the whole task (all its visits). ``None`` means no limit."""

    max_model_calls: int | None = 10
    max_tool_calls: int | None = 20
    max_tokens: int | None = None
    """Input plus output tokens."""
    max_cost_usd: float | None = None
    """Cost in US dollars, from the policy's price table."""
    max_seconds: float | None = None
    """Wall-clock seconds spent in this agent's visits."""


@dataclass(frozen=True, kw_only=True, slots=True)
class AgentPolicy:
    """What one agent may do."""

    tools: tuple[str, ...]
    """Tool names the agent is given; a call to any other tool is refused and recorded."""
    handoffs: tuple[str, ...]
    """Peers the agent may hand work to directly (``transfer_to_<peer>`` tools)."""
    approval: tuple[str, ...] = ()
    """Tools that wait for a person's approval before they run."""
    limits: AgentLimits = field(default_factory=AgentLimits)


@dataclass(frozen=True, kw_only=True, slots=True)
class TeamLimits:
    """The whole team's budget for one task, supervisor and finalize included."""

    max_agent_runs: int = 12
    """Agent visits, whether routed by the supervisor or handed off directly."""
    max_tokens: int | None = 200_000
    """Input plus output tokens."""
    max_cost_usd: float | None = 1.00
    """US dollars, from the price table; models without a price count as free."""
    max_seconds: float | None = 300
    """Wall-clock seconds since the task started."""
    on_exhausted: OnExhausted = "finalize"
    """``finalize``: answer from what exists, status ``degraded``; ``fail``: status ``failed``."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PingPongPolicy:
    """What counts as two agents bouncing work, and what to do about it."""

    max_bounces: int = 2
    """How often the same pair may pass work back and forth before it is a ping-pong."""
    on_detect: OnDetect = "finalize"
    """``finalize`` the task degraded; tell the ``supervisor`` and bar the pair; or ask a
    ``human`` (the run is interrupted)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class FinalizePolicy:
    """How the finalize node writes the team's answer to a request."""

    answer: FinalAnswer = "last_reply"
    """``last_reply``: a request the team finished normally (the supervisor said FINISH,
    nothing stopped it, and the last agent ended its visit with a reply) is answered with
    that reply, a writer's deliverable, with no model call; finalize's model writes the
    answer only when the task stopped early or the last visit gave no reply. ``model``:
    finalize's model writes every answer from the results (one more model call per request).
    """
    citations: Citations = "auto"
    """Whether the answer to a request about the docs must cite a document the run's tools
    showed (``[doc_id]``), else the task is ``degraded`` with an ``ungrounded:`` reason.
    ``required``: on any model; ``auto``: when some role runs on the embedded model
    (``local:``), whose answers are built to cite."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Price:
    """US dollars per million tokens."""

    input: float
    output: float


@dataclass(frozen=True, kw_only=True, slots=True)
class TeamPolicy:
    """The team's policy: per-agent permissions and budgets, team limits, prices."""

    agents: Mapping[str, AgentPolicy]
    team: TeamLimits = field(default_factory=TeamLimits)
    ping_pong: PingPongPolicy = field(default_factory=PingPongPolicy)
    finalize: FinalizePolicy = field(default_factory=FinalizePolicy)
    prices: Mapping[str, Price] = field(default_factory=lambda: MappingProxyType({}))
    source: str | None = None
    """The file the policy was read from, for messages; None for the defaults."""

    def agent(self, name: str) -> AgentPolicy:
        try:
            return self.agents[name]
        except KeyError:
            known = ", ".join(self.agents)
            raise ConfigError(f"unknown agent {name!r}; known agents: {known}") from None

    @property
    def max_agent_runs(self) -> int:
        return self.team.max_agent_runs

    @property
    def recursion_limit(self) -> int:
        """A LangGraph recursion limit that the team's own limits always reach first.

        Each visit costs at most two super-steps (supervisor, agent) plus begin and finalize;
        the margin keeps LangGraph's limit a last resort, never the normal way to stop.
        """
        return 2 * self.team.max_agent_runs + 10

    def price_of(self, model_name: str) -> Price | None:
        """The price of a model: by exact name, by the name after a ``provider:`` prefix, or
        by the longest priced name it starts with (providers report dated names such as
        ``gpt-4o-mini-2024-07-18`` for ``gpt-4o-mini``)."""
        bare = model_name.partition(":")[2] if ":" in model_name else model_name
        for name in (model_name, bare):
            if name in self.prices:
                return self.prices[name]
        prefixes = [p for p in self.prices if bare.startswith(p)]
        return self.prices[max(prefixes, key=len)] if prefixes else None


Roster = Mapping[str, AgentPolicy]
"""The team's agents with what each has unless a policy narrows it: its tools and peers
(and default limits). A team makes it (``Team.roster``); a policy file may only narrow it."""


def default_policy(roster: Roster) -> TeamPolicy:
    """Every agent of ``roster`` gets its tools and handoffs there, and default limits."""
    return TeamPolicy(agents=MappingProxyType(dict(roster)))
