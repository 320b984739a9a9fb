"""A process that runs tasks for a long time keeps its modules out of the cyclic GC's scans.

Python's cyclic garbage collector walks every tracked object of the oldest generation in a
full collection: with LangChain, LangGraph, the OpenAI client and SQLAlchemy imported, about
a quarter of a million objects, nearly all of them modules' functions, classes and constants
that live as long as the process. A full collection takes long in proportion, and the
interpreter runs nothing else meanwhile: every task of an in-process server stalls for it,
every few seconds under load (benchmarks/bench_service.py measures it). ``gc.freeze()``
(the standard library's answer for long-lived servers) moves what exists now into a
permanent generation that collections skip, which leaves a full collection only the
objects of the runs.

It is called once by a process that lives to run tasks (``relaygraph serve``, a task process
of ``serve --processes``, a Celery worker's pool process), after it has imported what its
runs use and before it runs any: what exists then lives for the whole process anyway, so
nothing that would become garbage is frozen (a frozen object that becomes cyclic garbage is
never collected). Not in a library call (``run_task``, the API app in a caller's process):
the caller's objects are not this package's to freeze.
The compiled teams (a few percent of the objects, made at a team's first task) stay in the
collector's reach.

It also collects the youngest generation less often (:data:`YOUNG_THRESHOLD` allocations
instead of 700): a run allocates tens of thousands of objects (messages, checkpoints, the
model client's requests), nearly all gone before the next collection, and every collection
stops every thread of the process. Fewer young collections give a busy in-process server
less CPU per task (benchmarks/bench_service.py compares them side by side).
"""

from __future__ import annotations

import contextlib
import gc
import importlib

__all__ = ["settle_long_lived"]

RUN_MODULES = (
    "relaygraph.runner._task_run",
    "relaygraph.supervisor",
    "relaygraph.team",
    "langchain.agents",
    "langgraph.checkpoint.sqlite",
    "langchain_openai",
)
"""What a task's run imports on its way (lazily, elsewhere): imported before the freeze."""
YOUNG_THRESHOLD = 10_000
"""Allocations (less deallocations) between collections of the youngest generation."""


def settle_long_lived() -> int:
    """Import what runs use, collect, and freeze what the process holds now, then collect
    the youngest generation every :data:`YOUNG_THRESHOLD` allocations; returns how many
    objects were frozen in all (``gc.get_freeze_count``)."""
    for name in RUN_MODULES:
        with contextlib.suppress(ImportError):  # an optional part that is not installed
            importlib.import_module(name)
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, oldest)
    return gc.get_freeze_count()
