"""Approvals: the decision on a paused tool call."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import select

from relaygraph.errors import ConfigError
from relaygraph.store import _validate as check
from relaygraph.store._errors import RecordConflict, RecordNotFound
from relaygraph.store._models import (
    ApprovalRow,
)
from relaygraph.store._records import (
    Approval,
    snapshot,
)
from relaygraph.store._repository import Repository
from relaygraph.store._task_rows import utc_now

DECISIONS = ("approve", "reject", "edit")


class ApprovalRepository(Repository):
    """Approvals: the decision on a paused tool call."""

    def get_approval(self, task_id: str, approval_id: str) -> Approval | None:
        """The task's pause with interrupt id ``approval_id``."""
        with self._core.read() as session:
            row = session.scalars(
                select(ApprovalRow).where(
                    ApprovalRow.task_id == task_id, ApprovalRow.interrupt_id == approval_id
                )
            ).first()
            return snapshot(Approval, row) if row is not None else None

    def record_decision(
        self,
        task_id: str,
        approval_id: str,
        *,
        decision: str,
        decided_by: str,
        reason: str | None = None,
        args: Mapping[str, Any] | None = None,
    ) -> Approval:
        """Record who decided a paused task's request, what, and when.

        Args:
            task_id: The paused task.
            approval_id: The interrupt id from the ``interrupted`` event.
            decision: ``approve``, ``reject`` or ``edit``.
            decided_by: Who decided (a project's name, a person).
            reason: Why, in the person's words.
            args: The replacement arguments; required for ``edit`` and only for it.

        Raises:
            ConfigError: A bad field, named in the message.
            RecordNotFound: The task has no such request.
            RecordConflict: It was decided already.
        """
        if decision not in DECISIONS:
            raise ConfigError(f"decision {decision!r} must be 'approve', 'reject' or 'edit'")
        if decision == "edit" and not isinstance(args, Mapping):
            raise ConfigError(f"an edit needs the new arguments as a JSON object, got {args!r}")
        if decision != "edit" and args is not None:
            raise ConfigError(f"args {args!r} are only for an 'edit', not for {decision!r}")
        edited = check.json_object(args, "args") if args is not None else None
        who = check.text(decided_by, "decided_by", max_chars=255)
        why = None if reason is None else check.text(reason, "reason")
        with self._core.write() as session:
            # Locked, so that of two people deciding at once one wins and the other hears so.
            row = session.scalars(
                select(ApprovalRow)
                .where(ApprovalRow.task_id == task_id, ApprovalRow.interrupt_id == approval_id)
                .with_for_update()
            ).first()
            if row is None:
                raise RecordNotFound("approval", approval_id)
            if row.decision is not None:
                raise RecordConflict(
                    "approval",
                    approval_id,
                    f"already decided: {row.decision!r} by {row.decided_by!r}",
                )
            row.decision, row.decided_by, row.reason = decision, who, why
            row.edited_args, row.decided_at = edited, utc_now()
            return snapshot(Approval, row)
