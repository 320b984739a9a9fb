"""A caller's policy on top of the team's own: it may only tighten, never loosen."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from relaygraph.errors import ConfigError
from relaygraph.policies._ceiling import loosenings, policy_ceiling
from relaygraph.policies._file import parse_policy, policy_to_mapping
from relaygraph.policies._policy import TeamPolicy


def _merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def tighten(
    base: TeamPolicy, override: Mapping[str, Any], *, source: str = "override"
) -> TeamPolicy:
    """``base`` with ``override`` (same shape as a policy file) applied on top.

    Raises:
        ConfigError: The override is malformed, or loosens anything
            (:func:`~relaygraph.policies.loosenings`, with ``base`` as the ceiling: a higher
            limit, a tool or handoff the base does not allow, an approval dropped for a tool
            the agent keeps, a milder ``on_exhausted`` or ``on_detect``), or changes a price.
            The message names the key and both values. ``finalize.answer`` is no limit: a
            caller may choose either.
    """
    merged = parse_policy(
        _merge(policy_to_mapping(base), override), source=source, roster=base.agents
    )
    ceiling = policy_ceiling(base, roster=base.agents)
    problems = [str(loosened) for loosened in loosenings(merged, ceiling, whose="the team's")]
    if dict(merged.prices) != dict(base.prices):
        problems.append("prices are the team's own and cannot be changed per task")
    if problems:
        raise ConfigError(f"policy {source} loosens the team's policy: " + "; ".join(problems))
    return merged
