"""What a run gives back (:class:`RunResult`) and what a person answers a paused task
(:class:`Decision`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from relaygraph.runner._errors import RequestRefused

__all__ = ["Decision", "RunResult"]


@dataclass(frozen=True, kw_only=True)
class RunResult:
    """The outcome of one task, as ``relaygraph run --json`` prints it."""

    task_id: str
    thread_id: str
    status: str
    """``succeeded``, ``degraded``, ``failed``, ``interrupted`` or ``cancelled``; ``running``
    when a server shutting down stopped it to be continued later."""
    answer: str | None
    stop_reason: str | None
    """Why the team stopped early; None when it finished on its own."""
    agents_run: list[str]
    handoffs: list[dict[str, Any]]
    """Every transfer of work in order: routes (``kind: route``) and direct handoffs."""
    artifacts: list[str]
    usage: dict[str, dict[str, Any]]
    """Per role: counts, tokens, cost, seconds, and each agent's ``limits`` beside them."""
    team_usage: dict[str, Any] = field(default_factory=dict)
    violations: list[dict[str, str]] = field(default_factory=list)
    pending: list[dict[str, Any]] = field(default_factory=list)
    """What an interrupted task waits for: approval requests and ping-pong decisions."""
    models: dict[str, str] = field(default_factory=dict)
    """The model spec each role ran on."""
    topology: dict[str, Any] = field(default_factory=lambda: {"kind": "structured"})
    """How the agents were arranged (``kind``: structured, swarm, supervisor-tools)."""

    @property
    def ok(self) -> bool:
        return self.status in ("succeeded", "degraded")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class Decision:
    """A person's answer to a paused task.

    Raises:
        RequestRefused: An unknown ``decision``; an ``edit`` without its arguments, or
            arguments with another decision (the field ``args``).
    """

    decision: Literal["approve", "reject", "edit"]
    args: dict[str, Any] | None = None
    """The replacement arguments, for ``edit``."""
    reason: str | None = None

    def __post_init__(self) -> None:
        if self.decision not in ("approve", "reject", "edit"):
            raise RequestRefused(
                f"decision {self.decision!r} must be 'approve', 'reject' or 'edit'",
                field="decision",
            )
        if self.decision == "edit" and not isinstance(self.args, dict):
            raise RequestRefused(
                f"an edit needs the new arguments as a JSON object, got {self.args!r}",
                field="args",
            )
        if self.decision != "edit" and self.args is not None:
            raise RequestRefused(
                f"args {self.args!r} are only for an 'edit', not for {self.decision!r}",
                field="args",
            )

    @property
    def answer(self) -> dict[str, Any]:
        """The decision as the paused graph reads it when it resumes."""
        return {k: v for k, v in asdict(self).items() if v is not None}
