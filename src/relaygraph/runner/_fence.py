"""The worker's attempt at a task, as the checkpointer that fences its writes sees it.

Its own module, imported by both ``_checkpoint`` (which picks the saver) and
``_fenced_saver`` (which reads it at each write), so that neither imports the other back
and importing the runner does not load the PostgreSQL saver.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["CheckpointFence"]


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointFence:
    """The worker's attempt at a task that a checkpointer writes for."""

    task_id: str
    attempt: int
    """The attempt's number (``Ledger.begin_attempt``): the task's fencing number while no
    later attempt has begun."""
    on_cancel: Callable[[], None] | None = field(default=None, compare=False)
    """Called when a write finds a cancel asked for in the ledger (the fence's read of the
    task's row sees the flag too): the run stops at a step boundary without a read of its own
    per step (``AttemptWatch.cancelled``)."""
    on_superseded: Callable[[int | None], None] | None = field(default=None, compare=False)
    """Called with the task's attempt (None: the task is gone) when a write finds the
    attempt superseded, before it is refused (``AttemptWatch.supersede``): the run learns it
    from a refusal that no caller of its own sees (the writes of a step that a read saves
    first)."""
