"""Request and response bodies of the API (pydantic: the HTTP boundary)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from relaygraph.store import Approval, Task


class TaskCreate(BaseModel):
    """``POST /v1/tasks``."""

    model_config = ConfigDict(extra="forbid")
    input: str = Field(min_length=1, max_length=100_000, description="What the team should do.")
    thread_id: str | None = Field(
        default=None, min_length=1, max_length=200, description="Continue this conversation."
    )
    policy: dict[str, Any] | None = Field(
        default=None, description="Policy-file-shaped overrides; may only tighten the team's."
    )
    model: str | None = Field(default=None, description="Model spec for every role.")
    agent_models: dict[str, str] | None = Field(default=None, description="Spec per role.")
    metadata: dict[str, Any] | None = None
    topology: Literal["structured", "swarm", "supervisor-tools"] = Field(
        default="structured",
        description="How the agents are arranged; a thread keeps the topology it started with.",
    )
    start_agent: str | None = Field(
        default=None, description="swarm only: the agent a new thread starts with."
    )
    output_mode: Literal["last_message", "full_history"] | None = Field(
        default=None,
        description="supervisor-tools only: what an agent's visit adds to the supervisor's "
        "messages (default last_message).",
    )
    multitask: Literal["reject", "enqueue"] = Field(
        default="reject",
        description="When the thread is busy: refuse with 409, or queue behind its task.",
    )


class DecisionIn(BaseModel):
    """``POST /v1/tasks/{id}/approvals/{approval_id}``."""

    model_config = ConfigDict(extra="forbid")
    decision: Literal["approve", "reject", "edit"]
    args: dict[str, Any] | None = None
    reason: str | None = Field(default=None, max_length=2000)


POLICY_SOURCE_KEY = "policy_source"
"""The task metadata key the server fills with where the task's policy came from."""


class TaskOut(BaseModel):
    id: str
    status: str
    input: str
    answer: str | None
    stop_reason: str | None
    thread_id: str
    models: dict[str, Any]
    topology: dict[str, Any]
    metadata: dict[str, Any]
    """What the caller sent as ``metadata``, unchanged."""
    policy_source: str | None
    """Where the task's policy came from, as the server recorded it (``default``, the
    server's policy file; ``+ request`` when the request tightened it)."""
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    last_event_seq: int

    @classmethod
    def of(cls, task: Task) -> TaskOut:
        return cls(
            id=task.id,
            status=task.status,
            input=task.input,
            answer=task.answer,
            stop_reason=task.stop_reason,
            thread_id=task.thread_id,
            models=task.models,
            topology=task.topology or {"kind": "structured"},
            metadata={k: v for k, v in task.metadata.items() if k != POLICY_SOURCE_KEY},
            policy_source=task.metadata.get(POLICY_SOURCE_KEY),
            created_at=task.created_at,
            started_at=task.started_at,
            finished_at=task.finished_at,
            last_event_seq=task.last_event_seq,
        )


class TaskPage(BaseModel):
    tasks: list[TaskOut]
    next_cursor: str | None


class ApprovalOut(BaseModel):
    id: str | None
    kind: str
    agent: str | None
    tool: str | None
    args: dict[str, Any] | None
    requested_at: datetime
    decision: str | None
    decided_by: str | None
    decided_at: datetime | None
    reason: str | None
    edited_args: dict[str, Any] | None
    """The arguments a person put in place of ``args`` (an ``edit``)."""
    applied_at: datetime | None
    """When the resumed run acted on the decision."""

    @classmethod
    def of(cls, approval: Approval) -> ApprovalOut:
        return cls(
            id=approval.interrupt_id,
            kind=approval.kind,
            agent=approval.agent,
            tool=approval.tool,
            args=approval.args,
            requested_at=approval.requested_at,
            decision=approval.decision,
            decided_by=approval.decided_by,
            decided_at=approval.decided_at,
            reason=approval.reason,
            edited_args=approval.edited_args,
            applied_at=approval.applied_at,
        )
