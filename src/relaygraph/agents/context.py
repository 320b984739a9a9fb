"""The per-task runtime context every tool receives (LangGraph ``context``, never state)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from relaygraph.backends.sandbox import SandboxLimits

__all__ = ["TaskContext"]


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

    @classmethod
    def for_task(cls, home: Path, *, task_id: str, thread_id: str) -> TaskContext:
        """The standard layout under the data directory: ``tasks/<task_id>/...``."""
        task_dir = home / "tasks" / task_id
        return cls(
            task_id=task_id,
            thread_id=thread_id,
            workspace=task_dir / "workspace",
            artifacts=task_dir / "artifacts",
            knowledge_base=home / "kb.sqlite",
            data_dir=home,
        )
