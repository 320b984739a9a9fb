"""One way to answer a paused task: the decision is checked (an edit's arguments against
the tool's schema), recorded, then the task continues: in this process (``resume_task``,
``relaygraph resume``) or handed to a ``resume`` callable (the server's workers).

The CLI, the Python API, the HTTP API and the dashboard all decide here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from relaygraph.runner._errors import RequestRefused
from relaygraph.runner._result import Decision
from relaygraph.store import Approval, RecordConflict, Task

if TYPE_CHECKING:
    from langgraph.types import Command

    from relaygraph.store import Ledger

__all__ = ["Answers", "Resume", "decide_task", "resume_input", "waiting_approvals"]

Answers = Mapping[str, Mapping[str, Any]]
"""Per interrupt id (an approval's id), the decision the paused graph resumes with:
``{"decision": ..., "args": ..., "reason": ...}``, JSON throughout."""

Resume = Callable[[str, Answers], bool]
"""Continues a decided task, by id, with its answers when a worker is free; False when the
task no longer waits (another runner took it meanwhile)."""


def waiting_approvals(
    task: Task, *, ledger: Ledger, approval_id: str | None = None
) -> list[Approval]:
    """What a decision on ``task`` answers: the approval ``approval_id``, or every pending
    one when None.

    Raises:
        RequestRefused: ``approval_not_found`` (``approval_id``); ``not_waiting`` (a
            conflict) when the approval is decided or the task does not wait.
    """
    if approval_id is None:
        waiting = [a for a in ledger.approvals(task.id) if a.pending]
        if task.status != "interrupted" or not waiting:
            raise RequestRefused(
                f"task {task.id!r} is not waiting for a decision (its status is {task.status!r})",
                field=None,
                code="not_waiting",
                kind="conflict",
            )
        return waiting
    # An id the ledger could not hold (PostgreSQL text has no NUL) names no approval.
    approval = None if "\x00" in approval_id else ledger.get_approval(task.id, approval_id)
    if approval is None:
        raise RequestRefused(
            f"no approval {approval_id!r}",
            field="approval_id",
            code="approval_not_found",
            kind="not_found",
        )
    if not approval.pending or task.status != "interrupted":
        raise RequestRefused(
            f"approval {approval_id} is already decided or the task is {task.status}",
            field=None,
            code="not_waiting",
            kind="conflict",
        )
    return [approval]


def decide_task(
    task: Task,
    decision: Decision,
    *,
    ledger: Ledger,
    tools: Callable[[], Mapping[str, Any]],
    decided_by: str,
    approval_id: str | None = None,
    resume: Resume | None = None,
) -> dict[str, dict[str, Any]]:
    """Answer what ``task`` waits for: check, record, and hand it on to ``resume``.

    Args:
        task: The paused task (already checked to be the caller's).
        decision: The answer.
        ledger: Where the decision is recorded.
        tools: The tools of the task's team, by name (asked only for an edit): an edit's
            arguments are checked against its tool's schema before anything is recorded.
        decided_by: Who decided, as the approval records it.
        approval_id: The approval to answer; every pending one when None.
        resume: Continues the task; None when the caller runs it itself
            (``resume_task`` runs it in this process).

    Returns:
        The answers the task resumes with (:func:`resume_input`).

    Raises:
        RequestRefused: See :func:`waiting_approvals`; ``args`` the tool refuses; and
            ``not_waiting`` (a conflict) when someone decided it a moment ago or the task
            was taken meanwhile.
    """
    approvals = waiting_approvals(task, ledger=ledger, approval_id=approval_id)
    if decision.args is not None:
        _check_edit(decision.args, approvals, tools)
    for approval in approvals:
        try:
            ledger.record_decision(
                task.id,
                str(approval.interrupt_id),
                decision=decision.decision,
                decided_by=decided_by,
                reason=decision.reason,
                args=decision.args,
            )
        except RecordConflict as exc:  # Someone decided it a moment ago.
            raise RequestRefused(
                str(exc), field=None, code="not_waiting", kind="conflict"
            ) from None
    answers = {str(a.interrupt_id): decision.answer for a in approvals}
    if resume is not None and not resume(task.id, answers):
        raise RequestRefused(
            f"task {task.id} is no longer waiting", field=None, code="not_waiting", kind="conflict"
        )
    return answers


def resume_input(answers: Answers) -> Command[Any]:
    """The graph input that resumes a paused task with ``answers``."""
    from langgraph.types import Command

    return Command(resume={interrupt: dict(answer) for interrupt, answer in answers.items()})


def _check_edit(
    args: Mapping[str, Any], approvals: list[Approval], tools: Callable[[], Mapping[str, Any]]
) -> None:
    """Check edited arguments against each paused tool's schema (edited arguments the tool
    refuses would otherwise fail on the model's side, after the decision was recorded)."""
    from relaygraph.agents.tools import check_tool_args
    from relaygraph.errors import ConfigError

    named = [approval.tool for approval in approvals if approval.tool]
    if not named:
        return
    known = tools()
    for tool in named:
        try:
            check_tool_args(tool, args, known)
        except ConfigError as exc:
            raise RequestRefused(str(exc), field="args") from None
