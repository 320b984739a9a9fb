"""Runs on an event loop (``TaskRunner.arun``, what ``serve`` runs tasks with): the same
events, results and ledger records as a run on a thread, many at once on one loop, and no
thread per run."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from relaygraph.policies import policy_to_mapping
from relaygraph.runner import TaskRunner
from relaygraph.runner._checkpoint import close_async_checkpointers
from relaygraph.store import LOCAL_PROJECT_ID, Ledger, Task
from relaygraph.topology import Topology
from tests.builtin_team import default_policy
from tests.conftest import EXAMPLE_RELAY


def _task(ledger: Ledger, request: str, thread_id: str | None = None) -> Task:
    roles = Topology().roles(tuple(default_policy().agents))
    task, _ = ledger.create_task(
        project_id=LOCAL_PROJECT_ID,
        input=request,
        policy=policy_to_mapping(default_policy()),
        models=dict.fromkeys(roles, f"scripted:{EXAMPLE_RELAY}"),
        topology=Topology().to_mapping(),
        **({"thread_id": thread_id} if thread_id else {}),
    )
    return task


def _counts(usage: dict[str, Any]) -> dict[str, Any]:
    """A run's usage without its wall-clock seconds."""
    return {
        role: {k: v for k, v in figures.items() if "second" not in k}
        for role, figures in usage.items()
    }


def _kinds(ledger: Ledger, task_id: str) -> list[str]:
    return [e.type for e in ledger.events_after(task_id)]


def test_runs_on_a_loop_match_a_run_on_a_thread(ledger: Ledger, home: Path) -> None:
    runner = TaskRunner(ledger=ledger, home=home)
    on_thread = _task(ledger, "When are checkpoints written?")
    expected = runner.run(on_thread, {"request": on_thread.input})
    assert expected.status == "succeeded"

    tasks = [_task(ledger, "When are checkpoints written?") for _ in range(6)]
    threads_seen: list[int] = []

    async def main() -> list[Any]:
        async def sample() -> None:
            while True:
                threads_seen.append(threading.active_count())
                await asyncio.sleep(0.01)

        sampler = asyncio.create_task(sample())
        try:
            return await asyncio.gather(
                *(runner.arun(task, {"request": task.input}) for task in tasks)
            )
        finally:
            sampler.cancel()
            await close_async_checkpointers()

    results = asyncio.run(main())
    for task, result in zip(tasks, results, strict=True):
        assert result.status == "succeeded", result.stop_reason
        assert result.answer == expected.answer
        assert _counts(result.usage) == _counts(expected.usage)
        assert _kinds(ledger, task.id) == _kinds(ledger, on_thread.id)
        stored = ledger.get_task(task.id, project_id=LOCAL_PROJECT_ID)
        assert stored is not None and stored.status == "succeeded"
        assert ledger.lease_of(task.id)[0] is None  # The lease went with the end.
