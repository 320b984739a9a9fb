"""A caller's policy on top of the team's own: it may only tighten, never loosen."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from relaygraph.errors import ConfigError
from relaygraph.policies._file import parse_policy, policy_to_mapping
from relaygraph.policies._policy import LIMIT_NAMES, TeamPolicy

_TEAM_LIMITS = ("max_agent_runs", "max_tokens", "max_cost_usd", "max_seconds")
# What happens at a limit, least strict first. A spent budget that fails the task delivers
# nothing, which is stricter than answering from what exists. A ping-pong the supervisor
# is told about lets the work go on; finalize stops it; human stops it until a person says.
_ON_EXHAUSTED = ("finalize", "fail")
_ON_DETECT = ("supervisor", "finalize", "human")


def _merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _looser(new: float | None, old: float | None) -> bool:
    """Whether limit ``new`` allows more than ``old`` (None is no limit)."""
    if old is None:
        return False
    return new is None or new > old


def tighten(
    base: TeamPolicy, override: Mapping[str, Any], *, source: str = "override"
) -> TeamPolicy:
    """``base`` with ``override`` (same shape as a policy file) applied on top.

    Raises:
        ConfigError: The override is malformed, or loosens anything: a higher limit, a tool
            or handoff the base does not allow, an approval removed, a price changed, a
            milder ``on_exhausted`` or ``on_detect`` (strictest last: ``finalize`` <
            ``fail``; ``supervisor`` < ``finalize`` < ``human``). The
            message names the key and both values. ``finalize.answer`` is no limit: a
            caller may choose either.
    """
    merged = parse_policy(
        _merge(policy_to_mapping(base), override), source=source, roster=base.agents
    )
    problems: list[str] = []
    for key in _TEAM_LIMITS:
        new, old = getattr(merged.team, key), getattr(base.team, key)
        if _looser(new, old):
            problems.append(f"team.{key} = {new} is above the team's {old}")
    for key, order, new, old in (
        ("team.on_exhausted", _ON_EXHAUSTED, merged.team.on_exhausted, base.team.on_exhausted),
        ("ping_pong.on_detect", _ON_DETECT, merged.ping_pong.on_detect, base.ping_pong.on_detect),
    ):
        if order.index(new) < order.index(old):
            problems.append(f"{key} = {new!r} is less strict than the team's {old!r}")
    if merged.ping_pong.max_bounces > base.ping_pong.max_bounces:
        problems.append(
            f"ping_pong.max_bounces = {merged.ping_pong.max_bounces} is above the team's "
            f"{base.ping_pong.max_bounces}"
        )
    for name, agent in merged.agents.items():
        old_agent = base.agents[name]
        for key in LIMIT_NAMES:
            new, old = getattr(agent.limits, key), getattr(old_agent.limits, key)
            if _looser(new, old):
                problems.append(f"agents.{name}.{key} = {new} is above the team's {old}")
        for field in ("tools", "handoffs"):
            extra = sorted(set(getattr(agent, field)) - set(getattr(old_agent, field)))
            if extra:
                problems.append(f"agents.{name}.{field} adds {extra}, not allowed by the team")
        dropped = sorted(set(old_agent.approval) - set(agent.approval))
        if dropped:
            problems.append(f"agents.{name}.approval drops {dropped}, which the team requires")
    if dict(merged.prices) != dict(base.prices):
        problems.append("prices are the team's own and cannot be changed per task")
    if problems:
        raise ConfigError(f"policy {source} loosens the team's policy: " + "; ".join(problems))
    return merged
