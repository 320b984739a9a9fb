"""The bounds a project's team definition is held to: how many agents, how many tools each,
how deeply it nests. A definition arrives in a request; past these it is refused before
anything is built from it, so that one project's definition cannot take the server's time
(or its stack: a parser that recurses once per level) from the others."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from relaygraph.team._errors import TeamFileError

__all__ = ["TeamBounds", "check_bounds", "check_tool_counts", "nesting_depth", "read_toml"]


@dataclass(frozen=True, kw_only=True, slots=True)
class TeamBounds:
    """How large a project's team definition may be (the operator's
    ``RELAYGRAPH_TEAM_MAX_*`` settings, whose defaults are written there)."""

    max_agents: int
    """Agents in the team."""
    max_tools_per_agent: int
    """Tools one agent has, counted after an MCP server's ``*`` is expanded."""
    max_depth: int
    """Levels of tables and arrays inside one another, the definition itself the first
    (``[agents.NAME] tools = [...]`` is 4 levels; ``[policy.agents.NAME] tools``, 5)."""


def nesting_depth(value: Any, *, stop_past: int | None = None) -> int:
    """How many levels of tables and arrays ``value`` is, one inside another (a scalar: 0,
    ``{"a": [1]}``: 2). Walked without recursion; with ``stop_past``, it stops as soon as
    the depth passes it (and returns that depth)."""
    deepest = 0
    pending: list[tuple[Any, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        if stop_past is not None and deepest > stop_past:
            return deepest
        pending.extend((child, depth) for child in children)
    return deepest


def read_toml(text: str, *, bounds: TeamBounds, field: str = "toml") -> dict[str, Any]:
    """A team definition's TOML text, parsed within ``bounds.max_depth``.

    Raises:
        TeamFileError: Not valid TOML, or nested deeper than the bound (the message names
            ``field``, the bound and the depth).
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TeamFileError(f"{field} is not valid TOML: {exc}") from None
    except RecursionError:
        # tomllib recurses once per level of arrays and inline tables and has no limit of
        # its own: a text past the interpreter's stack is deeper than any bound.
        raise TeamFileError(
            f"{field} nests arrays or tables deeper than the interpreter's stack allows; "
            f"the bound is {bounds.max_depth} levels (RELAYGRAPH_TEAM_MAX_DEPTH)"
        ) from None
    _check_depth(data, bounds, field)
    return data


def check_bounds(definition: Mapping[str, Any], bounds: TeamBounds, *, field: str) -> None:
    """Refuse a definition past ``bounds``, from its raw content, before it is built.

    Raises:
        TeamFileError: Naming the bound, its setting and the value: too deep, too many
            agents, too many tools listed for one agent.
    """
    _check_depth(definition, bounds, field)
    agents = definition.get("agents")
    if not isinstance(agents, Mapping):
        return  # Building the team reports it.
    if len(agents) > bounds.max_agents:
        raise TeamFileError(
            f"{field}: the team has {len(agents)} agents; the bound is {bounds.max_agents} "
            "(RELAYGRAPH_TEAM_MAX_AGENTS)",
            key="agents",
        )
    for name, table in agents.items():
        tools = table.get("tools") if isinstance(table, Mapping) else None
        if isinstance(tools, list):
            _check_tool_count(str(name), len(tools), bounds)


def check_tool_counts(agents: Mapping[str, int], bounds: TeamBounds) -> None:
    """Refuse an agent of a built team with more tools than the bound (an MCP server's
    ``*`` may give one reference many tools).

    Args:
        agents: Each agent's number of tools, by name.
        bounds: The bounds.

    Raises:
        TeamFileError: Naming the agent, the bound and the count.
    """
    for name, count in agents.items():
        _check_tool_count(name, count, bounds)


def _check_tool_count(name: str, count: int, bounds: TeamBounds) -> None:
    if count > bounds.max_tools_per_agent:
        raise TeamFileError(
            f"agent {name!r} has {count} tools; the bound is {bounds.max_tools_per_agent} "
            "per agent (RELAYGRAPH_TEAM_MAX_TOOLS_PER_AGENT)",
            table=f"agents.{name}",
            key="tools",
        )


def _check_depth(data: Any, bounds: TeamBounds, field: str) -> None:
    depth = nesting_depth(data, stop_past=bounds.max_depth)
    if depth > bounds.max_depth:
        raise TeamFileError(
            f"{field} nests tables and arrays {depth} levels deep (or more); the bound is "
            f"{bounds.max_depth} (RELAYGRAPH_TEAM_MAX_DEPTH)"
        )
