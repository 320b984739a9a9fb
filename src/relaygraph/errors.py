"""The exceptions relaygraph raises, split by who has to act.

``ConfigError`` means the person configuring a run made a mistake (a bad model spec, a
broken script file, an unknown agent); fix the input and run again. ``RunError`` means
something failed while a task ran. Every error carries its context as attributes and
names it in its message.

An error that a team graph's node may raise is no dataclass: LangGraph's checkpointer
stores a failed node's exception, a dataclass by its fields (rebuilt, with a warning, when
the checkpoint is read) and any other by its ``repr``. An error only the edges raise (a
refused submission, a conflicting write) may declare its context as dataclass fields.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ConfigError",
    "ModelNotAllowed",
    "ModelSpecError",
    "NoRoomOnDisk",
    "QuotaExceeded",
    "RelaygraphError",
    "RunError",
    "ScriptError",
    "TaskBusy",
    "ToolInputError",
    "read_config_file",
]


class RelaygraphError(Exception):
    """Root of every error relaygraph raises on purpose."""


class ConfigError(RelaygraphError):
    """The configuration of a run is wrong: fix the input named in the message."""


def read_config_file(
    path: str | os.PathLike[str], what: str, *, error: type[ConfigError] = ConfigError
) -> tuple[Path, str]:
    """The path (``~`` expanded) and the UTF-8 text of a file a person named.

    Args:
        path: The file.
        what: What the file is, as the refusal names it: ``golden file``, ``team file``.
        error: The :class:`ConfigError` to raise (a :class:`TeamFileError` for a team file).

    Raises:
        ConfigError: The file does not exist or cannot be read; the message names it.
    """
    file = Path(path).expanduser()
    try:
        return file, file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{what} {str(file)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"{what} {str(file)!r} cannot be read: {exc}") from None


class ModelSpecError(ConfigError):
    """A model spec string (``openai:MODEL``, ``scripted:PATH``, ``local:NAME``) is invalid."""

    def __init__(self, spec: str, problem: str) -> None:
        self.spec = spec
        self.problem = problem
        super().__init__(f"invalid model spec {spec!r}: {problem}")


class ModelNotAllowed(ModelSpecError):
    """A valid model spec that this server does not let a request name (a model outside
    its allowlist, a scripted model outside its scripts folder)."""

    def __init__(self, spec: str, problem: str = "") -> None:
        self.spec = spec
        self.problem = problem
        ConfigError.__init__(
            self,
            f"model {spec!r} is not allowed on this server" + (f": {problem}" if problem else ""),
        )


class RunError(RelaygraphError):
    """A task failed while it ran."""


class TaskBusy(RunError):
    """Another runner (a server's workers, a CLI process) holds the task's lease: it runs it.

    Attributes:
        task_id: The task.
    """

    def __init__(self, task_id: str, detail: str) -> None:
        self.task_id = task_id
        super().__init__(f"task {task_id!r} is being run elsewhere: {detail}")


class NoRoomOnDisk(RunError):
    """A task's run stopped because the disk had no room for what it had to write (its
    events, its checkpoints, its end): the task fails, and is not run again.

    Attributes:
        task_id: The task.
        recorded: Whether the ledger took the failure already; when False, the runner
            keeps it and writes it once the ledger takes writes again.
        reason: The task's stop reason (``error: no room on disk: ...``).
    """

    def __init__(self, task_id: str, *, recorded: bool, reason: str) -> None:
        self.task_id = task_id
        self.recorded = recorded
        self.reason = reason
        later = "" if recorded else " (recorded once the ledger takes writes again)"
        super().__init__(f"task {task_id!r} failed: {reason}{later}")


class ScriptError(RunError):
    """A scripted model cannot answer: its script ran out or has the wrong kind of turn.

    Attributes:
        agent: The script key (an agent name, ``supervisor`` or ``finalize``).
        turn: The 1-based turn number that was requested.
    """

    def __init__(self, agent: str, turn: int, problem: str) -> None:
        self.agent = agent
        self.turn = turn
        self.problem = problem
        super().__init__(f"scripted model for {agent!r}, turn {turn}: {problem}")


class ToolInputError(RelaygraphError):
    """A tool was called with input it refuses (a path outside the workspace, an unknown doc).

    The message is shown to the model as the tool's result, so it says what to do instead.
    """


@dataclass(eq=False, repr=False, kw_only=True)
class QuotaExceeded(RelaygraphError):
    """A project's submission refused by one of its quotas: it may submit again later.

    Attributes:
        project: The project's name.
        quota: The quota's name (``max_queued``, ``daily_cost_usd``).
        limit: The quota's value for the project.
        used: What the project uses of it now.
        retry_after_seconds: When a retry may succeed, at the soonest.
    """

    project: str
    quota: str
    limit: float
    used: float
    retry_after_seconds: int

    def __post_init__(self) -> None:
        what = {"max_queued": "tasks queued", "daily_cost_usd": "USD spent today (UTC)"}
        super().__init__(
            f"project {self.project!r} has {self.used:g} {what.get(self.quota, self.quota)}, "
            f"its quota {self.quota} is {self.limit:g}: retry after {self.retry_after_seconds} s"
        )

    @property
    def code(self) -> str:
        """The API's error code: ``budget_exhausted`` for money, else ``quota_exceeded``."""
        return "budget_exhausted" if self.quota == "daily_cost_usd" else "quota_exceeded"
