"""A run's checkpoint saves on the run's own thread, not on a thread of a pool made per loop.

Every LangGraph loop (the team graph's, and each agent visit's subgraph) opens a
``BackgroundExecutor``: a thread pool of its own, made for the loop and joined at its end.
It hands each step's writes (``put_writes``) and checkpoint (``put``) to that pool, and
under ``durability="sync"``, which every relaygraph run uses (see ``TaskRun.stream``), the
loop then waits for the checkpoint before its next step. The save is on the run's path
either way; the pool only adds to it: a run starts threads for its saves, and each save is a
hand-over to another thread and back, each a wait for the interpreter's lock while the
process's other runs hold it (on a busy in-process server, behind the other runs' threads as
well).

LangGraph offers no setting for it (its executor is made from the run's config, a
``ThreadPoolExecutor`` always), so this wraps ``BackgroundExecutor.submit``: inside
:func:`saves_inline`, a checkpointer's ``put_writes`` and the loop's checkpoint save run at
once on the calling thread, in a future already done, which the executor tracks as it tracks
its own (an error is raised where the loop waits for it, and again when the loop closes, as
a pool's future raises it). Anything else a loop submits (a step's parallel tasks, the
stream's waiter) still goes to the pool, and outside :func:`saves_inline` (a caller's own
LangGraph graphs in the same process) nothing changes. The order of saves is kept: the loop
submits a checkpoint after the writes it follows, and each ends before the next is
submitted.

The wrapper relies on a private method, so pyproject.toml pins LangGraph to the minor it is
tested with (``<1.3``), and tests/test_inline_saves.py checks the signatures and the
behaviour it relies on: moving the pin means running those first. Should a LangGraph lack
the names anyway, :func:`install` leaves it alone and logs a warning once, and runs go on
with their saves on the pool: slower, never wrong.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import functools
import logging
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["install", "saves_inline"]

_INLINE: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "relaygraph_saves_inline", default=False
)
_installed = False
_unavailable_told = False
_lock = threading.Lock()
log = logging.getLogger(__name__)

SUBMIT_OPTIONS = ("__name__", "__cancel_on_exit__", "__reraise_on_exit__", "__next_tick__")
"""The keyword options of ``BackgroundExecutor.submit`` that the wrapper reads or drops
(every other keyword goes to the save)."""


@contextlib.contextmanager
def saves_inline() -> Iterator[None]:
    """Within this block (on this thread, and in what LangGraph runs from it, as it copies
    the context), LangGraph loops save checkpoints and writes on the thread that submits
    them."""
    install()
    token = _INLINE.set(True)
    try:
        yield
    finally:
        _INLINE.reset(token)


def install() -> bool:
    """Wrap LangGraph's ``BackgroundExecutor.submit`` once per process; False when this
    LangGraph lacks what the wrapper relies on (then nothing is changed)."""
    global _installed
    with _lock:
        if _installed:
            return True
        try:
            from langgraph.checkpoint.base import BaseCheckpointSaver
            from langgraph.pregel._executor import BackgroundExecutor
            from langgraph.pregel._loop import SyncPregelLoop
        except ImportError:
            return _unavailable("its executor or loop module is gone")
        save = getattr(SyncPregelLoop, "_checkpointer_put_after_previous", None)
        original = getattr(BackgroundExecutor, "submit", None)
        if save is None or original is None or not hasattr(BackgroundExecutor, "done"):
            return _unavailable("BackgroundExecutor.submit/done or the loop's save is gone")

        def is_save(fn: Any) -> bool:
            if getattr(fn, "__func__", None) is save:
                return True
            owner = getattr(fn, "__self__", None)
            return isinstance(owner, BaseCheckpointSaver) and fn.__name__ == "put_writes"

        @functools.wraps(original)  # its __wrapped__: the method as LangGraph has it
        def submit(self: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
            if not _INLINE.get() or kwargs.get("__next_tick__") or not is_save(fn):
                return original(self, fn, *args, **kwargs)
            reraise = kwargs.pop("__reraise_on_exit__", True)
            cancel = kwargs.pop("__cancel_on_exit__", False)
            kwargs.pop("__name__", None)
            kwargs.pop("__next_tick__", None)
            future: concurrent.futures.Future[Any] = concurrent.futures.Future()
            self.tasks[future] = (cancel, reraise)
            future.add_done_callback(self.done)
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # raised where the loop waits for it, as from the pool
                future.set_exception(exc)
            return future

        BackgroundExecutor.submit = submit  # type: ignore[method-assign]
        _installed = True
        return True


def _unavailable(why: str) -> bool:
    """Say once per process that runs save on LangGraph's pool (see the module's doc)."""
    global _unavailable_told
    if not _unavailable_told:
        _unavailable_told = True
        log.warning("checkpoint saves stay on LangGraph's thread pool: %s", why)
    return False
