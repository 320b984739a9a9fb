"""The time by which the model call being made must end: what a task's time limit leaves.

The policy layer knows how much of ``max_seconds`` is left before each model call; the model
layer makes the call, its retries and its waits. This context variable carries the one to the
other without either importing the other, so that a hung server, a slow answer or a
``Retry-After`` cannot hold a task past its limit: the call gets the time that is left as its
deadline, and its retries fit inside it. Stdlib only: every layer may import it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["due_within", "seconds_left"]

_deadline: ContextVar[float | None] = ContextVar("relaygraph_call_deadline", default=None)
"""``time.monotonic()`` by which the calls made in this context must end; None: no limit."""


@contextmanager
def due_within(seconds: float | None) -> Iterator[None]:
    """Calls made in this block must end within ``seconds`` (None: no limit of its own); an
    earlier deadline of an enclosing block still holds."""
    if seconds is None:
        yield
        return
    due = time.monotonic() + max(seconds, 0.0)
    outer = _deadline.get()
    token = _deadline.set(due if outer is None else min(due, outer))
    try:
        yield
    finally:
        _deadline.reset(token)


def seconds_left() -> float | None:
    """Seconds left before this context's deadline (0 once it passed); None: no deadline."""
    due = _deadline.get()
    return None if due is None else max(due - time.monotonic(), 0.0)
