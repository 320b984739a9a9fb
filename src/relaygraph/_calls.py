"""One body of code for a node's sync and async call: the node's logic is a generator that
yields each blocking call (a model's, an agent's subgraph, a middleware's handler) and gets
its answer back; :func:`run_sync` answers with the call made on the thread, :func:`run_async`
with the call awaited on the event loop.

LangGraph runs a node's ``afunc`` under ``astream`` and its ``func`` under ``stream``. A
sync-only node under ``astream`` runs on a thread of the loop's pool and holds that thread
for the whole call (a model's answer takes seconds): a server holding hundreds of tasks in
flight would need as many threads. Written twice, the team graph's nodes (their budgets,
handoffs, ping-pong checks) would drift apart; as a generator they are written once, and
only the call itself differs (the sans-I/O pattern). An exception of the call is thrown
into the generator at its ``yield``, so the node's own ``try``/``except`` around the
``yield`` handles it as it handled the call's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

__all__ = ["Call", "Steps", "run_async", "run_sync"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Call:
    """A blocking call a node's steps ask for, in both its forms."""

    sync: Callable[[], Any]
    """Makes the call on this thread."""
    async_: Callable[[], Awaitable[Any]]
    """Makes the call on the event loop."""

    @classmethod
    def invoke(cls, runnable: Any, value: Any, config: Any = None, **kwargs: Any) -> Call:
        """``runnable.invoke(value, config)``, or its ``ainvoke``."""
        return cls(
            lambda: runnable.invoke(value, config, **kwargs),
            lambda: runnable.ainvoke(value, config, **kwargs),
        )

    @classmethod
    def blocking(cls, fn: Callable[..., Any], *args: Any) -> Call:
        """``fn(*args)``, a short blocking call (a ledger read or write): on this thread, or
        on a thread of the loop's default executor, so that the loop goes on meanwhile."""
        import asyncio

        return cls(lambda: fn(*args), lambda: asyncio.to_thread(fn, *args))

    @classmethod
    def handler(cls, handler: Callable[[Any], Any], request: Any) -> Call:
        """A middleware's call of the next handler, as LangChain passed it: a sync one under
        ``wrap_*`` (called on the thread), an async one under ``awrap_*`` (awaited)."""
        return cls(lambda: handler(request), lambda: handler(request))


Steps = Generator[Call, Any, T]
"""A node's logic: yields the calls it makes, returns the node's result."""


@dataclass(frozen=True, slots=True)
class _Returned(Generic[T]):
    """What the steps returned: they ask for no more calls."""

    value: T


def _resume(
    steps: Steps[T], answer: Any = None, error: Exception | None = None
) -> Call | _Returned[T]:
    """Hand ``steps`` the answer of the call they asked for, or throw in the call's
    ``error`` at their ``yield``: the next call they ask for, or what they returned.
    With neither, the steps start."""
    try:
        return steps.send(answer) if error is None else steps.throw(error)
    except StopIteration as stop:
        return _Returned(stop.value)


def run_sync(steps: Steps[T]) -> T:
    """Run ``steps``, making each call on this thread."""
    step = _resume(steps)
    while isinstance(step, Call):
        try:
            answer = step.sync()
        except Exception as exc:
            step = _resume(steps, error=exc)
        else:
            step = _resume(steps, answer)
    return step.value


async def run_async(steps: Steps[T]) -> T:
    """Run ``steps``, awaiting each call on the running event loop."""
    step = _resume(steps)
    while isinstance(step, Call):
        try:
            answer = await step.async_()
        except Exception as exc:
            step = _resume(steps, error=exc)
        else:
            step = _resume(steps, answer)
    return step.value
