"""Reading a policy file (TOML). Pydantic parses the file; the result is frozen values.

Every mistake is refused before anything runs, naming the key and the value, and every
mistake in a file is reported at once.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from relaygraph.errors import ConfigError, read_config_file
from relaygraph.policies._policy import (
    AgentLimits,
    AgentPolicy,
    FinalizePolicy,
    PingPongPolicy,
    Price,
    Roster,
    TeamLimits,
    TeamPolicy,
)

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_Value = TypeVar("_Value", bound="DataclassInstance")


def _from_section(cls: type[_Value], section: BaseModel) -> _Value:
    """The frozen value ``cls`` (a dataclass) of a parsed section: each of its fields from
    the section's key of the same name."""
    return cls(**{f.name: getattr(section, f.name) for f in dataclasses.fields(cls)})


# Strict: "5" is not a number and true is not 1. Strict floats still accept integers (300).
_STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


def _default(cls: type, name: str) -> Any:
    """The dataclass default of ``cls.name``: the one place defaults are written down."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            return f.default
    raise AttributeError(f"{cls.__name__} has no field {name!r}")  # pragma: no cover


class _Team(BaseModel):
    model_config = _STRICT
    max_agent_runs: int = Field(default=_default(TeamLimits, "max_agent_runs"), gt=0)
    max_tokens: int = Field(default=_default(TeamLimits, "max_tokens"), gt=0)
    max_cost_usd: float = Field(default=_default(TeamLimits, "max_cost_usd"), gt=0)
    max_seconds: float = Field(default=_default(TeamLimits, "max_seconds"), gt=0)
    on_exhausted: Literal["finalize", "fail"] = _default(TeamLimits, "on_exhausted")


class _PingPong(BaseModel):
    model_config = _STRICT
    max_bounces: int = Field(default=_default(PingPongPolicy, "max_bounces"), gt=0)
    on_detect: Literal["finalize", "supervisor", "human"] = _default(PingPongPolicy, "on_detect")


class _Finalize(BaseModel):
    model_config = _STRICT
    answer: Literal["last_reply", "model"] = _default(FinalizePolicy, "answer")
    citations: Literal["auto", "required"] = _default(FinalizePolicy, "citations")


class _Agent(BaseModel):
    model_config = _STRICT
    tools: list[str] | None = None
    handoffs: list[str] | None = None
    approval: list[str] = Field(default_factory=list)
    max_model_calls: int | None = Field(default=_default(AgentLimits, "max_model_calls"), gt=0)
    max_tool_calls: int | None = Field(default=_default(AgentLimits, "max_tool_calls"), gt=0)
    max_tokens: int | None = Field(default=_default(AgentLimits, "max_tokens"), gt=0)
    max_cost_usd: float | None = Field(default=_default(AgentLimits, "max_cost_usd"), gt=0)
    max_seconds: float | None = Field(default=_default(AgentLimits, "max_seconds"), gt=0)


class _Price(BaseModel):
    model_config = _STRICT
    input: float = Field(ge=0)
    output: float = Field(ge=0)


class _PolicyFile(BaseModel):
    model_config = _STRICT
    team: _Team = Field(default_factory=_Team)
    ping_pong: _PingPong = Field(default_factory=_PingPong)
    agents: dict[str, _Agent] = Field(default_factory=dict)
    prices: dict[str, _Price] = Field(default_factory=dict)
    finalize: _Finalize = Field(default_factory=_Finalize)


_SECTIONS: dict[str, type[BaseModel]] = {
    "team": _Team,
    "ping_pong": _PingPong,
    "agents": _Agent,
    "prices": _Price,
    "finalize": _Finalize,
}

_MISSING = object()


def _key(loc: Iterable[Any]) -> str:
    return ".".join(str(part) for part in loc)


def _show(value: Any) -> str:
    """A value the way it is written in TOML: ``"5"``, ``true``, ``[1, 2]``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k} = {_show(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return repr(value)


def _lookup(data: Any, loc: Iterable[Any]) -> Any:
    """The value at ``loc`` as written in the file, or ``_MISSING``."""
    for part in loc:
        in_table = isinstance(data, Mapping) and part in data
        in_list = isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data)
        if not (in_table or in_list):
            return _MISSING
        data = data[part]
    return data


def _explain(exc: ValidationError, data: Mapping[str, Any]) -> list[str]:
    problems = []
    for err in exc.errors():
        loc = err["loc"]
        key = _key(loc)
        value = _lookup(data, loc)
        if value is _MISSING:
            value = err["input"]
        kind = err["type"]
        if kind == "missing":
            problems.append(f"{key}: required key is missing")
        elif kind == "extra_forbidden":
            section = _SECTIONS.get(str(loc[0])) if len(loc) > 1 else _PolicyFile
            known = ", ".join(section.model_fields) if section else ""
            problems.append(f"{key} = {_show(value)}: unknown key (known keys here: {known})")
        elif kind in {"model_type", "dict_type"}:
            problems.append(f"{key} = {_show(value)}: should be a table")
        else:
            problems.append(f"{key} = {_show(value)}: {err['msg']}")
    return problems


def _strings(value: Any) -> list[str] | None:
    """The strings in a list (others are reported by validation), or None if not a list."""
    if not isinstance(value, list):
        return None
    return [item for item in value if isinstance(item, str)]


def _check_names(data: Mapping[str, Any], roster: Roster) -> list[str]:
    """Agent, tool and peer names: checked on the raw data so that they are reported even
    when some other part of the file does not validate. A policy may name any agent of the
    team and give an agent any tool of the team."""
    agent_names = tuple(roster)
    known_tools = {tool for agent in roster.values() for tool in agent.tools}
    agents = data.get("agents")
    if not isinstance(agents, Mapping):
        return []
    problems: list[str] = []
    for name, section in agents.items():
        if name not in agent_names:
            problems.append(
                f"agents.{name}: unknown agent {_show(name)} (known: {', '.join(agent_names)})"
            )
            continue
        if not isinstance(section, Mapping):
            continue
        tools = _strings(section.get("tools"))
        for tool in tools or []:
            if tool not in known_tools:
                problems.append(
                    f"agents.{name}.tools: unknown tool {_show(tool)} "
                    f"(known: {', '.join(sorted(known_tools))})"
                )
        peers = ", ".join(a for a in agent_names if a != name)
        for peer in _strings(section.get("handoffs")) or []:
            if peer == name:
                problems.append(
                    f"agents.{name}.handoffs: {_show(peer)} cannot hand off to itself "
                    f"(peers: {peers})"
                )
            elif peer not in agent_names:
                problems.append(
                    f"agents.{name}.handoffs: unknown agent {_show(peer)} (peers: {peers})"
                )
        if "tools" not in section:
            tools = list(roster[name].tools)
        if tools is None:  # `tools` is not a list; validation reports it
            continue
        for tool in _strings(section.get("approval")) or []:
            if tool not in tools:
                problems.append(
                    f"agents.{name}.approval: {_show(tool)} is not among {name}'s tools "
                    f"({', '.join(tools) or 'none'})"
                )
    return problems


def parse_policy(
    data: Mapping[str, Any], *, roster: Roster, source: str = "<policy>"
) -> TeamPolicy:
    """Build a :class:`TeamPolicy` from parsed TOML (or any mapping of the same shape).

    Args:
        data: The file's content.
        roster: The team's agents, with the tools and peers each has unless the policy
            narrows them (``Team.roster``).
        source: Where it came from, for messages.

    Raises:
        ConfigError: Unknown key, agent, tool or handoff target; a zero or negative limit;
            a value of the wrong type; an approval for a tool the agent does not have. The
            message names each key and value; all problems in the data are reported at once.
    """
    problems: list[str] = []
    parsed: _PolicyFile | None = None
    try:
        parsed = _PolicyFile.model_validate(data)
    except ValidationError as exc:
        problems.extend(_explain(exc, data))
    problems.extend(_check_names(data, roster))
    if problems or parsed is None:
        raise ConfigError(f"policy {source}: " + "; ".join(problems))

    agents = {}
    for name, defaults in roster.items():
        section = parsed.agents.get(name, _Agent())
        tools = section.tools if section.tools is not None else defaults.tools
        handoffs = section.handoffs if section.handoffs is not None else defaults.handoffs
        agents[name] = AgentPolicy(
            tools=tuple(dict.fromkeys(tools)),
            handoffs=tuple(dict.fromkeys(handoffs)),
            approval=tuple(dict.fromkeys(section.approval)),
            limits=_from_section(AgentLimits, section),
        )
    return TeamPolicy(
        agents=MappingProxyType(agents),
        team=_from_section(TeamLimits, parsed.team),
        ping_pong=_from_section(PingPongPolicy, parsed.ping_pong),
        finalize=_from_section(FinalizePolicy, parsed.finalize),
        prices=MappingProxyType(
            {model: Price(input=p.input, output=p.output) for model, p in parsed.prices.items()}
        ),
        source=source,
    )


def load_policy(path: str | Path, *, roster: Roster) -> TeamPolicy:
    """Read a policy TOML file; see :func:`parse_policy`.

    Raises:
        ConfigError: The file is missing, is not valid TOML, or its content is wrong.
    """
    file = Path(path).expanduser()
    data = read_policy_file(file)
    return parse_policy(data, source=repr(str(file)), roster=roster)


def read_policy_file(path: str | Path) -> dict[str, Any]:
    """The TOML content of a policy file, unchecked (a team file's ``policy`` names one).

    Raises:
        ConfigError: The file is missing or is not valid TOML.
    """
    file, text = read_config_file(path, "policy file")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"policy file {str(file)!r} is not valid TOML: {exc}") from None


def stored_policy(mapping: Mapping[str, Any], *, source: str) -> TeamPolicy:
    """Read back a policy written by :func:`policy_to_mapping`, with exactly its agents
    (a stored policy lists every agent's tools and handoffs in full)."""
    agents = mapping.get("agents")
    if not isinstance(agents, Mapping) or not agents:
        raise ConfigError(f"policy {source}: a stored policy lists its agents; this one has none")
    roster = {
        name: AgentPolicy(
            tools=tuple(section.get("tools") or ()) if isinstance(section, Mapping) else (),
            handoffs=tuple(section.get("handoffs") or ()) if isinstance(section, Mapping) else (),
        )
        for name, section in agents.items()
    }
    return parse_policy(mapping, source=source, roster=roster)


def policy_to_mapping(policy: TeamPolicy) -> dict[str, Any]:
    """The policy in the policy file's shape; :func:`parse_policy` reads it back unchanged.

    A paused task stores its policy this way, so a resume in another process enforces
    exactly the rules the task started with.
    """

    def unset_none(values: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in values.items() if v is not None}

    return {
        "team": unset_none(dataclasses.asdict(policy.team)),
        "ping_pong": dataclasses.asdict(policy.ping_pong),
        "finalize": dataclasses.asdict(policy.finalize),
        "agents": {
            name: {
                "tools": list(agent.tools),
                "handoffs": list(agent.handoffs),
                "approval": list(agent.approval),
                **unset_none(dataclasses.asdict(agent.limits)),
            }
            for name, agent in policy.agents.items()
        },
        "prices": {name: dataclasses.asdict(price) for name, price in policy.prices.items()},
    }
