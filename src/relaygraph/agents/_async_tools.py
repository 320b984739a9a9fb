"""Coroutine-only tools, callable from the team graph's threads.

The team graph runs synchronously (``graph.stream`` on a runner's thread), so LangChain calls
each tool's sync path, and a tool that has only a coroutine (an ``async def`` function, a
``StructuredTool`` made with ``coroutine=`` only, every tool of ``langchain-mcp-adapters``)
fails there with ``NotImplementedError``. :func:`sync_capable` gives such a tool a sync path
that runs its coroutine on one event loop kept by the process in a daemon thread
(:func:`background_loop`) and waits for it. The tool stays the same tool for everything
around it: its name, description and schema, the policy middleware, the tool journal and the
trace see one call that returns (or raises) like a sync tool's.

One loop for the process, not one per call (``asyncio.run``): a tool may keep state bound to
the loop that first ran it (an HTTP client's pool, an MCP session), and every call of it then
finds that loop again.

A task cancelled while the coroutine runs stops it: the waiting thread looks at the run's
drain request (LangGraph's ``RunControl``, which a cancel sets) and cancels the coroutine,
whose ``finally`` blocks run, and the call answers that it was cancelled; the run then ends at
the step's boundary, ``cancelled``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from langchain_core.callbacks import CallbackManagerForToolRun
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool, ToolException

__all__ = ["background_loop", "run_coroutine", "sync_capable"]

T = TypeVar("T")

POLL_SECONDS = 0.05
"""How often a thread waiting on a coroutine looks for its run's cancel (as the runner's
drain watch does)."""
STOP_SECONDS = 5.0
"""How long a cancelled coroutine gets to run its ``finally`` blocks before the call
answers anyway."""


class _BackgroundLoop:
    """The process's event loop for coroutine-only tools, in a daemon thread made on first
    use (and again in a forked child, which has no threads of its parent's)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    def get(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                loop = asyncio.new_event_loop()
                threading.Thread(
                    target=_run_forever, args=(loop,), name="relaygraph-async-tools", daemon=True
                ).start()
                self._loop = loop
            return self._loop

    def forget(self) -> None:
        self._lock = threading.Lock()
        self._loop = None


def _run_forever(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    loop.run_forever()


_LOOP = _BackgroundLoop()
os.register_at_fork(after_in_child=_LOOP.forget)


def background_loop() -> asyncio.AbstractEventLoop:
    """The event loop this process runs coroutine-only tools on (started on first use)."""
    return _LOOP.get()


def run_coroutine(
    coroutine: Coroutine[Any, Any, T],
    *,
    cancelled: Any = None,
) -> T:
    """Run ``coroutine`` on :func:`background_loop` and wait for its result from this thread.

    It runs in a copy of this thread's context (LangGraph's config and runtime, the run's
    event sink), as it would have run here.

    Args:
        coroutine: What to run.
        cancelled: A callable asked every :data:`POLL_SECONDS`; when it answers True the
            coroutine is cancelled and :class:`asyncio.CancelledError` raised here.

    Raises:
        Whatever the coroutine raises.
    """
    loop = background_loop()
    context = contextvars.copy_context()
    result: concurrent.futures.Future[T] = concurrent.futures.Future()
    task_made: concurrent.futures.Future[asyncio.Task[T]] = concurrent.futures.Future()

    def start() -> None:
        task = loop.create_task(coroutine, context=context)
        task.add_done_callback(lambda done: _settle(result, done))
        task_made.set_result(task)

    loop.call_soon_threadsafe(start)
    while True:
        try:
            return result.result(timeout=POLL_SECONDS)
        except concurrent.futures.TimeoutError:
            if cancelled is None or not cancelled():
                continue
        task = task_made.result()
        loop.call_soon_threadsafe(task.cancel)
        try:
            return result.result(timeout=STOP_SECONDS)
        except concurrent.futures.TimeoutError:
            raise asyncio.CancelledError("the coroutine did not stop in time") from None


def _settle(result: concurrent.futures.Future[T], task: asyncio.Task[T]) -> None:
    if task.cancelled():
        result.set_exception(asyncio.CancelledError())
    elif (error := task.exception()) is not None:
        result.set_exception(error)
    else:
        result.set_result(task.result())


def _cancel_requested() -> bool:
    """Whether the graph run this thread works for was asked to stop for a cancel."""
    from langgraph.config import get_config
    from langgraph.constants import CONF

    try:
        runtime = get_config()[CONF].get("__pregel_runtime")
    except RuntimeError:  # Called outside a graph run: nothing can cancel it.
        return False
    return getattr(runtime, "drain_reason", None) == "cancel"


class _CoroutineTool(StructuredTool):
    """A coroutine-only ``StructuredTool`` whose sync path runs the coroutine on the
    process's background loop."""

    def _run(
        self,
        *args: Any,
        config: RunnableConfig,
        run_manager: CallbackManagerForToolRun | None = None,
        **kwargs: Any,
    ) -> Any:
        try:
            return run_coroutine(
                self._arun(*args, config=config, run_manager=None, **kwargs),
                cancelled=_cancel_requested,
            )
        except asyncio.CancelledError:
            # Answered as a tool error (every call in a transcript is answered); the run
            # stops at the step's boundary.
            raise ToolException(f"{self.name} was cancelled with its task") from None


def sync_capable(tool: BaseTool) -> BaseTool:
    """``tool``, or a copy of it that can also be called synchronously when it has only a
    coroutine (see the module's docstring). A tool with a sync path is returned as it is.
    """
    if type(tool) is not StructuredTool or tool.func is not None or tool.coroutine is None:
        return tool
    fields = {name: getattr(tool, name) for name in StructuredTool.model_fields}
    return _CoroutineTool(**fields)
