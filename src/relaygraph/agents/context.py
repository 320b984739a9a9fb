"""The per-task runtime context every tool receives (LangGraph ``context``, never state)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Protocol, runtime_checkable

from pydantic import InstanceOf
from pydantic.json_schema import SkipJsonSchema

from relaygraph._home import TASKS_FOLDER
from relaygraph.backends.sandbox import (
    SandboxLimits,
    SandboxUnavailableError,
    WorkspaceQuota,
    filesystem_isolation,
)

__all__ = ["TaskContext", "ToolJournal"]


@runtime_checkable
class ToolJournal(Protocol):
    """Durable storage of the tool calls that completed, by task and call id.

    The agents' journal middleware reads it before a tool runs and writes a completed
    call's record before the result returns into the graph, so a step re-run after a crash
    answers the call from the record instead of running the tool again. The ledger is one
    (``Ledger.tool_journal``); a record is a JSON object the middleware alone reads.
    """

    def get(self, task_id: str, call_id: str) -> Mapping[str, Any] | None:
        """The call's record; None if it never completed."""
        ...

    def put(self, task_id: str, call_id: str, record: Mapping[str, Any]) -> Mapping[str, Any]:
        """Store the call's record durably before returning; a call recorded already keeps
        its first record, which is returned."""
        ...


@dataclass(frozen=True, kw_only=True, slots=True)
class TaskContext:
    """Where a task's tools may read and write. Passed as ``context=`` to the team graph.

    It lives outside graph state on purpose: a model can write state through tool results,
    but it cannot move its own workspace or knowledge base.
    """

    task_id: str
    thread_id: str
    workspace: Path
    """The coder's working directory for this task; files outside it are refused."""
    artifacts: Path
    """Where the writer's deliverables are stored."""
    knowledge_base: Path
    """The SQLite file of the researcher's document index."""
    sandbox: SandboxLimits = field(default_factory=SandboxLimits)
    sandbox_isolation_required: bool = False
    """Refuse ``run_python`` when this host cannot isolate sandboxed code from the server's
    files (no working bubblewrap), as a server for tenants must. When False, such code
    runs with resource limits and a network namespace only, after one warning per process."""
    data_dir: Path | None = None
    """The data directory (ledger, checkpoints, every task's files). Sandboxed code never
    sees it, even where it lies under a folder the sandbox mounts."""
    # An object the runner passes, not data: checked as an instance where LangChain
    # validates a tool's ``runtime`` argument, and left out of the context's JSON Schema.
    tool_journal: Annotated[InstanceOf[ToolJournal] | None, SkipJsonSchema()] = None
    """Where completed tool calls are recorded, so a re-run step does not repeat them
    (the runner passes the ledger's). None: no journal, a re-run step runs its calls again."""
    workspace_quota: WorkspaceQuota = field(default_factory=WorkspaceQuota)
    """What the task's workspace and artifacts may hold together; ``run_python``,
    ``write_file`` and ``save_artifact`` enforce it (``RELAYGRAPH_WORKSPACE_MAX_MB``)."""

    def unavailable_tool(self, name: str) -> str | None:
        """Why tool ``name`` cannot run on this host now, or None: ``run_python`` where the
        task requires isolation and the host has none (the policy refuses the call before
        it asks anyone's approval, as ``tool_unavailable``)."""
        isolated = not self.sandbox_isolation_required or filesystem_isolation() is not None
        return None if name != "run_python" or isolated else str(SandboxUnavailableError(name))

    @classmethod
    def for_task(cls, home: Path, *, task_id: str, thread_id: str) -> TaskContext:
        """The standard layout under the data directory: ``tasks/<task_id>/...``."""
        task_dir = home / TASKS_FOLDER / task_id
        return cls(
            task_id=task_id,
            thread_id=thread_id,
            workspace=task_dir / "workspace",
            artifacts=task_dir / "artifacts",
            knowledge_base=home / "kb.sqlite",
            data_dir=home,
        )
