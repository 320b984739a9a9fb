"""A team: its agents, the policy over them, how they are arranged, and its default model."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from relaygraph.agents import Agent
from relaygraph.agents import builtin as _builtin
from relaygraph.errors import ConfigError
from relaygraph.policies import (
    AgentPolicy,
    Roster,
    TeamPolicy,
    default_policy,
    load_policy,
    parse_policy,
    policy_to_mapping,
)
from relaygraph.topology import Topology

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel
    from langchain_core.tools import BaseTool
    from langgraph.graph.state import CompiledStateGraph
    from langgraph.types import Checkpointer


__all__ = ["DEFAULT_TEAM_NAME", "Team", "default_team"]

DEFAULT_TEAM_NAME = "default"


@dataclass(frozen=True, kw_only=True, eq=False)
class Team:
    """Agents composed into a team. The default team is :meth:`Team.default`.

    Example:
        team = Team(
            agents=[builtin.researcher(kb="./docs"), builtin.writer(), reviewer],
            policy="policy.toml",
            topology="structured",
        )
        graph = team.compile(model="openai:gpt-4o-mini")  # a LangGraph CompiledStateGraph
        result = run_task("Review the handoff docs", team=team, model="openai:gpt-4o-mini")

    Raises:
        ConfigError: No agents, two agents with one name, a handoff to an agent that is not
            in the team (or to itself), one tool name for two different tools, a bad
            topology or policy. The message names the agent and what is wrong.
    """

    agents: tuple[Agent, ...]
    name: str = "team"
    description: str = ""
    policy: TeamPolicy | str | Path | Mapping[str, Any] | None = None
    """A policy over these agents: a value, a policy file, a mapping in the policy file's
    shape, or None for the defaults (every agent its own tools, every peer a handoff)."""
    topology: Topology | str = "structured"
    model: str | BaseChatModel | None = None
    """The default model of every role; a run's ``model`` overrides it."""
    supervisor_prompt: str | None = None
    """Added to the supervisor's built-in prompt."""
    source: Path | None = None
    """The team file it was read from, if any."""
    definition: Mapping[str, Any] | None = field(default=None, repr=False)
    """The team file's content as read (what the ledger stores of a registered team)."""

    def __post_init__(self) -> None:
        agents = tuple(self.agents) if isinstance(self.agents, Iterable) else None
        if not agents:
            raise ConfigError(f"team {self.name!r} has no agents")
        for agent in agents:
            if not isinstance(agent, Agent):
                raise ConfigError(f"team {self.name!r}: {agent!r} is not an Agent")
        object.__setattr__(self, "agents", agents)
        names = [a.name for a in agents]
        doubled = sorted(name for name, count in Counter(names).items() if count > 1)
        if doubled:
            raise ConfigError(f"team {self.name!r}: two agents are named {doubled[0]!r}")
        # A set: every agent's handoffs are checked against every name, and a team's cost to
        # build must stay linear in its size (a registered team is built on a request).
        known = set(names)
        for agent in agents:
            for peer in agent.handoffs or ():
                if peer == agent.name:
                    raise ConfigError(
                        f"team {self.name!r}: agent {agent.name!r} hands off to itself"
                    )
                if peer not in known:
                    raise ConfigError(
                        f"team {self.name!r}: agent {agent.name!r} hands off to {peer!r}, "
                        f"which is no agent of the team ({', '.join(names)})"
                    )
        if isinstance(self.topology, str):
            object.__setattr__(self, "topology", Topology.parse(self.topology))
        self.arrangement.check_agents(tuple(names))
        if self.model is not None and isinstance(self.model, str):
            from relaygraph.models import parse_model_spec

            parse_model_spec(self.model)
        self.tools  # noqa: B018 (resolves every tool now: a bad one fails here, not mid-run)
        self.resolved_policy  # noqa: B018

    @classmethod
    def default(cls) -> Team:
        """The built-in team: researcher, coder and writer, under the default policy."""
        return default_team()

    @property
    def arrangement(self) -> Topology:
        """The topology as a value."""
        assert isinstance(self.topology, Topology)
        return self.topology

    @property
    def agent_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.agents)

    def agent(self, name: str) -> Agent:
        for agent in self.agents:
            if agent.name == name:
                return agent
        raise ConfigError(f"team {self.name!r} has no agent {name!r}")

    @cached_property
    def roster(self) -> Roster:
        """Each agent's tools and peers before a policy narrows them (made once: the
        digest and the policy read it for every agent)."""
        names = self.agent_names
        return MappingProxyType(
            {
                a.name: AgentPolicy(
                    tools=a.tool_names,
                    handoffs=a.handoffs
                    if a.handoffs is not None
                    else tuple(n for n in names if n != a.name),
                )
                for a in self.agents
            }
        )

    @cached_property
    def tools(self) -> Mapping[str, BaseTool]:
        """Every tool of the team by name (a policy may give an agent any of them).

        Raises:
            ConfigError: A tool cannot be made, or one name means two different tools.
        """
        from relaygraph.agents import to_tool

        builtins = _builtin.tools()
        pool: dict[str, BaseTool] = {}
        given: dict[str, Any] = {}  # What each name was made from: one object per name.
        owner: dict[str, str] = {}
        for agent in self.agents:
            for value in agent.tools:
                made = to_tool(value, builtins, where=f"agent {agent.name!r}")
                if made.name in given:
                    if given[made.name] is not value and pool[made.name] is not made:
                        raise ConfigError(
                            f"team {self.name!r}: tool name {made.name!r} means two different "
                            f"tools (agents {owner[made.name]!r} and {agent.name!r}); "
                            "rename one"
                        )
                    continue
                pool[made.name], given[made.name] = made, value
                owner[made.name] = agent.name
        return MappingProxyType(pool)

    @cached_property
    def resolved_policy(self) -> TeamPolicy:
        """The team's policy as a value over exactly its agents."""
        return self.policy_from(self.policy)

    def policy_from(self, policy: TeamPolicy | str | Path | Mapping[str, Any] | None) -> TeamPolicy:
        """A policy over this team's agents: read from a file or mapping, or checked.

        Raises:
            ConfigError: The policy is malformed or names an agent or tool the team lacks.
        """
        if policy is None:
            return default_policy(self.roster)
        if isinstance(policy, TeamPolicy):
            if set(policy.agents) != set(self.agent_names):
                raise ConfigError(
                    f"team {self.name!r}: the policy is over agents "
                    f"{', '.join(policy.agents)}, the team has {', '.join(self.agent_names)}"
                )
            return parse_policy(
                policy_to_mapping(policy), roster=self.roster, source=policy.source or "<policy>"
            )
        if isinstance(policy, Mapping):
            return parse_policy(policy, roster=self.roster, source=f"team {self.name!r} policy")
        return load_policy(policy, roster=self.roster)

    @cached_property
    def digest(self) -> str:
        """A digest of everything that decides how the team behaves: agents (prompts,
        descriptions, tools with their descriptions and argument schemas, handoffs, models),
        the supervisor's prompt, the policy and the topology. Equal digests, equal teams."""
        described = {
            "agents": [
                {
                    "name": a.name,
                    "description": a.description,
                    "prompt": a.prompt,
                    "handoffs": list(self.roster[a.name].handoffs),
                    "model": _model_name(a.model),
                    "kb": [str(p) for p in a.kb],
                    "tools": [_tool_description(self.tools[n]) for n in a.tool_names],
                }
                for a in self.agents
            ],
            "supervisor_prompt": self.supervisor_prompt,
            "policy": policy_to_mapping(self.resolved_policy),
            "topology": self.arrangement.to_mapping(),
            "model": _model_name(self.model),
            # The content of every local file it references (tool modules, the policy).
            "files": (self.definition or {}).get("_files"),
        }
        text = json.dumps(described, sort_keys=True, separators=(",", ":"), default=str)
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()

    def record(self, *, version: int | None = None) -> dict[str, Any]:
        """What a task records of its team: name, version, digest (and where it was read)."""
        return {
            "name": self.name,
            "version": version,
            "digest": self.digest,
            "source": str(self.source) if self.source else None,
        }

    def describe(self) -> dict[str, Any]:
        """The team as ``relaygraph teams check`` prints it: each agent with its tools (where
        each comes from, its arguments' JSON schema, and whether the policy removes it),
        handoffs and model, after the policy."""
        policy = self.resolved_policy
        return {
            "name": self.name,
            "description": self.description,
            "digest": self.digest,
            "source": str(self.source) if self.source else None,
            "topology": self.arrangement.to_mapping(),
            "policy_source": policy.source or "defaults",
            "supervisor_prompt": self.supervisor_prompt,
            "agents": [
                {
                    "name": agent.name,
                    "description": agent.description,
                    "model": _model_name(agent.model or self.model) or "the run's --model",
                    "tools": [
                        {
                            "name": name,
                            "origin": _origin(self, name),
                            "description": self.tools[name].description,
                            "args": _tool_description(self.tools[name])["args"],
                            "removed_by_policy": name not in policy.agents[agent.name].tools,
                        }
                        for name in _listed_tools(agent.tool_names, policy.agents[agent.name])
                    ],
                    "handoffs": list(policy.agents[agent.name].handoffs),
                    "approval": list(policy.agents[agent.name].approval),
                    "kb": [str(p) for p in agent.kb],
                }
                for agent in self.agents
            ],
        }

    def models_for(
        self,
        model: str | BaseChatModel | None = None,
        agent_models: Mapping[str, str | BaseChatModel] | None = None,
    ) -> dict[str, str | BaseChatModel]:
        """Each role's model: ``agent_models``, else the agent's own, else ``model``, else
        the team's default, else the embedded model.

        Raises:
            ConfigError: ``agent_models`` names a role the team does not have.
        """
        from relaygraph.models import DEFAULT_MODEL

        roles = self.arrangement.roles(self.agent_names)
        chosen = dict(agent_models or {})
        unknown = [r for r in chosen if r not in roles]
        if unknown:
            raise ConfigError(
                f"--agent-model names unknown agent(s) {', '.join(map(repr, unknown))}; "
                f"known: {', '.join(roles)}"
            )
        own = {a.name: a.model for a in self.agents if a.model is not None}
        fallback = model or self.model or DEFAULT_MODEL
        return {role: chosen.get(role) or own.get(role) or fallback for role in roles}

    def compile(
        self,
        *,
        model: str | BaseChatModel | None = None,
        agent_models: Mapping[str, str | BaseChatModel] | None = None,
        checkpointer: Checkpointer = None,
    ) -> CompiledStateGraph[Any, Any, Any, Any]:
        """The team as a plain LangGraph graph (``invoke``/``stream`` with a
        :class:`~relaygraph.agents.TaskContext` as ``context``).

        Raises:
            ConfigError: A model spec is invalid or a model cannot be built.
        """
        from relaygraph.models import load_model
        from relaygraph.supervisor import build_team

        models = {
            role: load_model(m, agent=role) if isinstance(m, str) else m
            for role, m in self.models_for(model, agent_models).items()
        }
        return build_team(models, team=self, checkpointer=checkpointer)


def _listed_tools(own: tuple[str, ...], narrowed: AgentPolicy) -> list[str]:
    """The agent's own tools, then those the policy gives it besides, each once."""
    return list(dict.fromkeys([*own, *narrowed.tools]))


def _origin(team: Team, tool: str) -> str:
    for agent in team.agents:
        if tool in agent.origins:
            return agent.origins[tool]
    return "python"


def _model_name(model: Any) -> str | None:
    if model is None or isinstance(model, str):
        return model
    name = getattr(model, "model_name", None) or getattr(model, "model", "")
    return f"{type(model).__name__}:{name}"


def _tool_description(tool: BaseTool) -> dict[str, Any]:
    try:
        schema = tool.tool_call_schema.model_json_schema()  # type: ignore[union-attr]
    except Exception:  # A tool with a hand-written JSON schema: its dict is the schema.
        schema = tool.args_schema if isinstance(tool.args_schema, dict) else {}
    return {"name": tool.name, "description": tool.description, "args": schema}


_DEFAULT: list[Team] = []


def default_team() -> Team:
    """The built-in team (made once per process): researcher, coder, writer."""
    if not _DEFAULT:
        _DEFAULT.append(Team(agents=_builtin.agents(), name=DEFAULT_TEAM_NAME))
    return _DEFAULT[0]
