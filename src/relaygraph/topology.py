"""Which shape the team takes: the structured supervisor, a swarm, or a tool-calling supervisor.

A light module (no LangGraph import), so that the CLI can list the choices in ``--help``
without loading the team graph.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, cast, get_args

from relaygraph._names import FINALIZE, SUPERVISOR
from relaygraph.errors import ConfigError

__all__ = ["OUTPUT_MODES", "TOPOLOGIES", "OutputMode", "Topology", "TopologyKind"]

TopologyKind = Literal["structured", "swarm", "supervisor-tools"]
OutputMode = Literal["last_message", "full_history"]
TOPOLOGIES: tuple[str, ...] = get_args(TopologyKind)
OUTPUT_MODES: tuple[str, ...] = get_args(OutputMode)


@dataclass(frozen=True, kw_only=True, slots=True)
class Topology:
    """How the agents are arranged; the agents, tools, policies and ledger are the same.

    - ``structured`` (default): relaygraph's supervisor routes with a validated
      ``Route(next, task, reason)``; a finalize model writes the answer.
    - ``swarm``: ``langgraph_swarm.create_swarm``; agents pass control with handoff tools,
      the agent that finishes answers, and the thread remembers who was active.
    - ``supervisor-tools``: ``langgraph_supervisor.create_supervisor``; the supervisor routes
      by calling ``transfer_to_<agent>`` tools and answers in its last message.
    """

    kind: TopologyKind = "structured"
    start_agent: str | None = None
    """``swarm`` only: the agent a new thread starts with (default: the policy's first)."""
    output_mode: OutputMode | None = None
    """``supervisor-tools`` only: what an agent's visit adds to the supervisor's messages —
    its last message, or its whole transcript. None: not chosen (``last_message`` for a new
    thread, the thread's own for a continued one)."""

    @property
    def mode(self) -> OutputMode:
        """The output mode in effect."""
        return self.output_mode or "last_message"

    @classmethod
    def parse(
        cls,
        kind: str | None = None,
        *,
        start_agent: str | None = None,
        output_mode: str | None = None,
    ) -> Topology:
        """Validate user input (a CLI flag, an API field, a golden-set run).

        Raises:
            ConfigError: An unknown kind or output mode, or an option of another topology.
        """
        kind = kind or "structured"
        if kind not in TOPOLOGIES:
            raise ConfigError(f"topology {kind!r} is not one of: {', '.join(TOPOLOGIES)}")
        if start_agent is not None and kind != "swarm":
            raise ConfigError(
                f"start_agent {start_agent!r} applies only to the swarm topology, not {kind!r}"
            )
        if output_mode is not None and kind != "supervisor-tools":
            raise ConfigError(
                f"output_mode {output_mode!r} applies only to the supervisor-tools topology, "
                f"not {kind!r}"
            )
        if output_mode is not None and output_mode not in OUTPUT_MODES:
            raise ConfigError(
                f"output_mode {output_mode!r} is not one of: {', '.join(OUTPUT_MODES)}"
            )
        return cls(
            kind=cast(TopologyKind, kind),
            start_agent=start_agent,
            output_mode=cast(OutputMode | None, output_mode),
        )

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None) -> Topology:
        """Read a stored topology (``None``: a task from before topologies, structured)."""
        if not data:
            return cls()
        return cls.parse(
            data.get("kind"),
            start_agent=data.get("start_agent"),
            output_mode=data.get("output_mode"),
        )

    def to_mapping(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": self.kind}
        if self.kind == "swarm" and self.start_agent is not None:
            data["start_agent"] = self.start_agent
        if self.kind == "supervisor-tools":
            data["output_mode"] = self.mode
        return data

    def continuing(self, thread_id: str, earlier: Topology) -> Topology:
        """This topology for a thread whose earlier tasks ran ``earlier``: a thread keeps its
        topology (its checkpoints hold that graph's state) and its output mode, unless
        another mode is chosen explicitly.

        Raises:
            ConfigError: Another kind, or another explicit output mode, than the thread's.
        """
        if earlier.kind != self.kind:
            raise ConfigError(
                f"thread {thread_id!r} runs the {earlier.kind!r} topology, not {self.kind!r}; "
                "continue it with that topology, or start a new thread"
            )
        if self.kind != "supervisor-tools":
            return self
        if self.output_mode is None:
            return replace(self, output_mode=earlier.mode)
        if self.output_mode != earlier.mode:
            raise ConfigError(
                f"thread {thread_id!r} runs with output_mode {earlier.mode!r}, not "
                f"{self.output_mode!r}: the supervisor's messages so far were kept that way; "
                "start a new thread for another mode"
            )
        return self

    def roles(self, agents: Sequence[str]) -> tuple[str, ...]:
        """The roles that need a model: the agents, plus the supervisor and finalize where
        the topology has them (a swarm has neither; the tool supervisor answers itself)."""
        if self.kind == "swarm":
            return tuple(agents)
        if self.kind == "supervisor-tools":
            return (SUPERVISOR, *agents)
        return (SUPERVISOR, *agents, FINALIZE)

    def check_agents(self, agents: Sequence[str]) -> None:
        """Refuse a start agent the policy's team does not have.

        Raises:
            ConfigError: ``start_agent`` is not one of ``agents``.
        """
        if self.start_agent is not None and self.start_agent not in agents:
            raise ConfigError(
                f"start_agent {self.start_agent!r} is not an agent of this team; "
                f"agents: {', '.join(agents)}"
            )
