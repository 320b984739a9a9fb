"""The operator's policy as a ceiling: the most any task's policy may allow, key by key.

Two questions about a policy under another are answered here, once: which keys allow more
than the other does (:func:`loosenings`; a request's policy over its team's is checked the
same way, by :func:`~relaygraph.policies.tighten`), and the policy that allows, key by key,
only what both allow (:func:`meet`).

What "more" means, key by key: a bigger budget, or none where the other has one; a tool or
a peer the other does not give; an approval the other requires, dropped; a milder reaction
at a limit; a lower price (a cheaper model spends a cost budget more slowly).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from types import MappingProxyType
from typing import TypeVar

from relaygraph.policies._policy import (
    LIMIT_NAMES,
    AgentLimits,
    AgentPolicy,
    PingPongPolicy,
    Price,
    Roster,
    TeamLimits,
    TeamPolicy,
)

__all__ = ["Loosening", "PolicyCeiling", "loosenings", "meet", "policy_ceiling"]

TEAM_LIMIT_NAMES = ("max_agent_runs", "max_tokens", "max_cost_usd", "max_seconds")
# What happens at a limit, least strict first. A spent budget that fails the task delivers
# nothing, which is stricter than answering from what exists. A ping-pong the supervisor
# is told about lets the work go on; finalize stops it; human stops it until a person says.
_ON_EXHAUSTED = ("finalize", "fail")
_ON_DETECT = ("supervisor", "finalize", "human")
# Citations required of every model hold a task to more than on the embedded model only.
_CITATIONS = ("auto", "required")

N = TypeVar("N", int, float)
S = TypeVar("S", bound=str)


@dataclass(frozen=True, kw_only=True, slots=True)
class PolicyCeiling:
    """A policy that caps other teams' policies: the operator's ``serve --policy`` (or the
    default policy) over the built-in team. Make one with :func:`policy_ceiling`."""

    policy: TeamPolicy
    tools: frozenset[str]
    """Every tool of the team ``policy`` was written for, allowed or not: the tools it rules
    on. A tool only another team has (a module's, an MCP server's) is that team's to give."""
    stand_in: AgentPolicy
    """The most an agent ``policy`` does not name may have: the tightest limit any of its
    agents has, key by key, and what any of them may use, with every approval any of them
    requires. A name that is not the operator's must not lift an agent's limits."""

    @property
    def source(self) -> str:
        """Where the ceiling's policy came from, for messages."""
        return self.policy.source or "the default policy"

    def agent(self, name: str) -> AgentPolicy:
        """The ceiling over the agent called ``name`` in any team."""
        return self.policy.agents.get(name, self.stand_in)


@dataclass(frozen=True, kw_only=True, slots=True)
class Loosening:
    """One key of a policy that allows more than its ceiling does."""

    key: str
    """The key as a policy file writes it: ``team.max_seconds``, ``agents.coder.tools``."""
    text: str
    """A sentence naming the key and both values."""

    def __str__(self) -> str:
        return self.text


def policy_ceiling(policy: TeamPolicy, *, roster: Roster) -> PolicyCeiling:
    """``policy``, over the team whose ``roster`` it was written for, as a ceiling."""
    agents = list(policy.agents.values())
    limits = AgentLimits(
        **{key: _lowest(getattr(agent.limits, key) for agent in agents) for key in LIMIT_NAMES}
    )
    stand_in = AgentPolicy(
        tools=_union(agent.tools for agent in agents),
        handoffs=_union(agent.handoffs for agent in agents),
        approval=_union(agent.approval for agent in agents),
        limits=limits,
    )
    tools = frozenset(tool for agent in roster.values() for tool in agent.tools)
    return PolicyCeiling(policy=policy, tools=tools, stand_in=stand_in)


def loosenings(policy: TeamPolicy, ceiling: PolicyCeiling, *, whose: str) -> list[Loosening]:
    """Every key of ``policy`` that allows more than ``ceiling`` does; empty when none.

    Args:
        policy: The policy checked.
        ceiling: What it may allow at most.
        whose: Whose the ceiling is, for the messages (``the operator's``).

    Returns:
        One per key, its sentence naming the key and both values:
        ``agents.coder.max_tool_calls = 1000000 is above the operator's 3``.
    """
    top = ceiling.policy
    problems: list[Loosening] = []

    def add(key: str, text: str) -> None:
        problems.append(Loosening(key=key, text=f"{key} {text}"))

    for key in TEAM_LIMIT_NAMES:
        new, old = getattr(policy.team, key), getattr(top.team, key)
        if _above(new, old):
            add(f"team.{key}", f"= {_show(new)} is above {whose} {_show(old)}")
    for key, order, new_mode, old_mode in (
        ("team.on_exhausted", _ON_EXHAUSTED, policy.team.on_exhausted, top.team.on_exhausted),
        ("ping_pong.on_detect", _ON_DETECT, policy.ping_pong.on_detect, top.ping_pong.on_detect),
        ("finalize.citations", _CITATIONS, policy.finalize.citations, top.finalize.citations),
    ):
        if order.index(new_mode) < order.index(old_mode):
            add(key, f"= {new_mode!r} is less strict than {whose} {old_mode!r}")
    if policy.ping_pong.max_bounces > top.ping_pong.max_bounces:
        add(
            "ping_pong.max_bounces",
            f"= {policy.ping_pong.max_bounces} is above {whose} {top.ping_pong.max_bounces}",
        )
    for name, agent in policy.agents.items():
        cap = ceiling.agent(name)
        for key in LIMIT_NAMES:
            new, old = getattr(agent.limits, key), getattr(cap.limits, key)
            if _above(new, old):
                add(f"agents.{name}.{key}", f"= {_show(new)} is above {whose} {_show(old)}")
        for key, asked, allowed, listed in (
            ("tools", agent.tools, _allowed_tools(agent.tools, cap, ceiling), cap.tools),
            ("handoffs", agent.handoffs, _allowed_peers(agent.handoffs, cap, top), cap.handoffs),
        ):
            extra = sorted(set(asked) - set(allowed))
            if extra:
                add(
                    f"agents.{name}.{key}",
                    f"adds {extra}, which {whose} policy does not allow "
                    f"(it allows {sorted(listed)})",
                )
        dropped = sorted((set(cap.approval) & set(agent.tools)) - set(agent.approval))
        if dropped:
            add(
                f"agents.{name}.approval",
                f"= {sorted(agent.approval)} drops {dropped}, which {whose} policy requires",
            )
    for model, price in policy.prices.items():
        floor = top.price_of(model)
        if floor is not None and (price.input < floor.input or price.output < floor.output):
            add(
                f"prices.{model}",
                f"= (input {price.input}, output {price.output}) is below {whose} "
                f"(input {floor.input}, output {floor.output})",
            )
    return problems


def meet(policy: TeamPolicy, ceiling: PolicyCeiling) -> TeamPolicy:
    """The policy that allows, key by key, only what both ``policy`` and ``ceiling`` allow:
    the lower budget, the stricter reaction at a limit, the tools and peers both give, every
    approval either requires, every price at least the ceiling's, and citations required
    where either requires them. ``finalize.answer`` is no limit: ``policy``'s own stands.

    Returns:
        ``policy`` itself when the ceiling takes nothing from it; else the met policy, whose
        ``source`` names both.
    """
    top = ceiling.policy
    team = TeamLimits(
        max_agent_runs=min(policy.team.max_agent_runs, top.team.max_agent_runs),
        max_tokens=_lower(policy.team.max_tokens, top.team.max_tokens),
        max_cost_usd=_lower(policy.team.max_cost_usd, top.team.max_cost_usd),
        max_seconds=_lower(policy.team.max_seconds, top.team.max_seconds),
        on_exhausted=_stricter(_ON_EXHAUSTED, policy.team.on_exhausted, top.team.on_exhausted),
    )
    ping_pong = PingPongPolicy(
        max_bounces=min(policy.ping_pong.max_bounces, top.ping_pong.max_bounces),
        on_detect=_stricter(_ON_DETECT, policy.ping_pong.on_detect, top.ping_pong.on_detect),
    )
    agents = {
        name: _meet_agent(agent, ceiling.agent(name), ceiling)
        for name, agent in policy.agents.items()
    }
    prices = dict(top.prices)
    for model, own in policy.prices.items():
        floor = top.price_of(model)
        prices[model] = (
            own
            if floor is None
            else Price(input=max(own.input, floor.input), output=max(own.output, floor.output))
        )
    finalize = dataclasses.replace(
        policy.finalize,
        citations=_stricter(_CITATIONS, policy.finalize.citations, top.finalize.citations),
    )
    met = dataclasses.replace(
        policy,
        agents=MappingProxyType(agents),
        team=team,
        ping_pong=ping_pong,
        finalize=finalize,
        prices=MappingProxyType(prices),
    )
    if met == policy:
        return policy
    return dataclasses.replace(
        met, source=f"{policy.source or 'the default policy'} under {ceiling.source}"
    )


def _meet_agent(agent: AgentPolicy, cap: AgentPolicy, ceiling: PolicyCeiling) -> AgentPolicy:
    tools = _allowed_tools(agent.tools, cap, ceiling)
    # An approval is kept only for a tool the agent still has: a policy names no other.
    approval = tuple(t for t in dict.fromkeys((*agent.approval, *cap.approval)) if t in tools)
    return AgentPolicy(
        tools=tools,
        handoffs=_allowed_peers(agent.handoffs, cap, ceiling.policy),
        approval=approval,
        limits=AgentLimits(
            **{
                key: _lower(getattr(agent.limits, key), getattr(cap.limits, key))
                for key in LIMIT_NAMES
            }
        ),
    )


def _allowed_tools(
    tools: tuple[str, ...], cap: AgentPolicy, ceiling: PolicyCeiling
) -> tuple[str, ...]:
    """``tools`` without those the ceiling rules on and does not give ``cap``'s agent."""
    given = set(cap.tools)
    return tuple(t for t in tools if t not in ceiling.tools or t in given)


def _allowed_peers(peers: tuple[str, ...], cap: AgentPolicy, top: TeamPolicy) -> tuple[str, ...]:
    """``peers`` without the ceiling's agents that ``cap``'s agent may not hand work to; a
    peer the ceiling does not know is the team's own agent, for the team to arrange."""
    given = set(cap.handoffs)
    return tuple(p for p in peers if p not in top.agents or p in given)


def _above(new: float | None, old: float | None) -> bool:
    """Whether limit ``new`` allows more than ``old`` (None is no limit)."""
    if old is None:
        return False
    return new is None or new > old


def _lower(a: N | None, b: N | None) -> N | None:
    """The tighter of two limits (None is no limit)."""
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def _lowest(limits: Iterable[N | None]) -> N | None:
    lowest: N | None = None
    for limit in limits:
        lowest = _lower(lowest, limit)
    return lowest


def _stricter(order: tuple[str, ...], a: S, b: S) -> S:
    """The stricter of two reactions at a limit (``order``: least strict first)."""
    return a if order.index(a) >= order.index(b) else b


def _union(groups: Iterable[tuple[str, ...]]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(item for group in groups for item in group))


def _show(limit: float | None) -> str:
    """A limit as a policy file may write it (``20`` for ``20.0``)."""
    if limit is None:
        return "unset (no limit)"
    if isinstance(limit, float) and limit.is_integer():
        return str(int(limit))
    return repr(limit)
