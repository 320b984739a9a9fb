"""A worker with tasks in flight (``relaygraph worker --tasks-in-flight N``): one process holds
many attempts at once, each a coroutine on its task loop (``TaskRunner.arun`` with the
worker's attempt), while the thread of each message (Celery's threads pool) waits for its run.

The runs are called in this process, without Celery (as tests/test_worker_fencing.py does for
one run), on SQLite and PostgreSQL (the ``url`` fixture); the waits are for events under a
generous deadline, never a fixed sleep.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from relaygraph.store import Ledger
from relaygraph.worker import WorkerSettings, celery_config, worker_argv

from .test_worker_fencing import (  # noqa: F401  (worker_env: the fixture, used by name)
    event_types,
    submitted,
    task_of,
    worker_env,
)

BROKER = "amqp://guest:guest@127.0.0.1:5672//"
IN_FLIGHT = 20
DEADLINE = 120.0


def test_tasks_in_flight_run_on_a_threads_pool_of_that_many() -> None:
    settings = WorkerSettings(broker_url=BROKER, tasks_in_flight=IN_FLIGHT, concurrency=3)
    argv = worker_argv(settings, hostname="w1@box")
    assert {"--pool=threads", f"--concurrency={IN_FLIGHT}"} <= set(argv)
    assert "--pool=prefork" not in argv
    config = celery_config(settings)
    # A thread cannot be killed: the attempt's own watch stops a run that lost its message.
    assert config["worker_cancel_long_running_tasks_on_connection_loss"] is False
    assert config["task_acks_late"] and config["worker_prefetch_multiplier"] == 1
    # Without it, one task per prefork child, as before.
    prefork = WorkerSettings(broker_url=BROKER, concurrency=3)
    assert {"--pool=prefork", "--concurrency=3"} <= set(worker_argv(prefork, hostname="w@b"))
    assert celery_config(prefork)["worker_cancel_long_running_tasks_on_connection_loss"] is True


def test_a_bad_tasks_in_flight_names_its_flag() -> None:
    from relaygraph.errors import ConfigError
    from relaygraph.worker import load_worker_settings

    with pytest.raises(ConfigError, match="RELAYGRAPH_TASKS_IN_FLIGHT / --tasks-in-flight 0"):
        load_worker_settings(tasks_in_flight=0)


@pytest.fixture
def in_flight_env(worker_env: Ledger, monkeypatch: pytest.MonkeyPatch) -> Ledger:  # noqa: F811
    """A worker process's environment (``worker_env``) with tasks in flight, and its ledger."""
    monkeypatch.setenv("RELAYGRAPH_TASKS_IN_FLIGHT", str(IN_FLIGHT))
    return worker_env


def test_one_process_holds_its_tasks_in_flight_at_once_on_its_loop(
    in_flight_env: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Twenty messages, each on a thread of its own (as Celery's threads pool hands them):
    their twenty attempts are all streaming at once, on the one task loop of the process,
    and each runs once, fenced by its attempt, to its end."""
    from relaygraph.runner._task_run import TaskRun
    from relaygraph.worker import worker_runtime

    ledger = in_flight_env
    runtime = worker_runtime()
    assert runtime.loop is not None and runtime.slots == IN_FLIGHT
    tasks = [submitted(ledger) for _ in range(IN_FLIGHT)]
    messages = [(task_id, ledger.queue_for_workers(task_id)) for task_id in tasks]

    lock = threading.Lock()
    streaming: set[str] = set()
    threads: set[str] = set()
    all_in_flight = threading.Event()
    astream = TaskRun.astream

    async def counted(self: TaskRun, *args: Any, **kwargs: Any) -> Any:
        import asyncio

        with lock:
            streaming.add(self.task.id)
            threads.add(threading.current_thread().name)
            if len(streaming) == IN_FLIGHT:
                all_in_flight.set()
        # No run goes on before every one is in flight: one message at a time would wait
        # here for good (and fail at the deadline).
        assert await asyncio.to_thread(all_in_flight.wait, DEADLINE), sorted(streaming)
        return await astream(self, *args, **kwargs)

    monkeypatch.setattr(TaskRun, "astream", counted)
    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        results = list(pool.map(lambda message: runtime.run(*message), messages))

    assert all_in_flight.is_set()
    assert threads == {"relaygraph-tasks"}  # The loop's thread, not the messages' threads.
    for task_id, result in zip(tasks, results, strict=True):
        assert result is not None and result.status == "succeeded", result
        task = task_of(ledger, task_id)
        assert (task.status, task.attempts) == ("succeeded", 1), task.stop_reason
        types = event_types(ledger, task_id)
        assert types.count("run_started") == types.count("run_finished") == 1
        assert ledger.lease_of(task_id) == (None, None)


def test_a_process_with_tasks_in_flight_reports_them_as_its_slots(
    in_flight_env: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    from relaygraph.worker import worker_runtime

    runtime = worker_runtime()
    reported: list[int] = []
    heard = threading.Event()

    def report(worker_id: str, *, slots: int) -> None:
        reported.append(slots)
        heard.set()

    monkeypatch.setattr(runtime.ledger, "report_worker_slots", report)
    runtime.start_reporting()
    assert heard.wait(DEADLINE)
    assert reported[0] == IN_FLIGHT


def test_a_superseded_attempt_on_the_loop_writes_nothing_of_its_end(
    in_flight_env: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The task goes on to another attempt while this process's run of it is in flight (its
    worker froze, and the broker gave the message to another): the run stops, refused, and
    ends nothing; the task stays the new attempt's."""
    from relaygraph.runner._task_run import TaskRun
    from relaygraph.worker import worker_runtime

    ledger = in_flight_env
    runtime = worker_runtime()
    task_id = submitted(ledger)
    dispatch = ledger.queue_for_workers(task_id)
    astream = TaskRun.astream

    async def superseded_first(self: TaskRun, *args: Any, **kwargs: Any) -> Any:
        import asyncio

        # Another worker begins the next attempt of the same message before a step runs.
        begun = await asyncio.to_thread(
            ledger.start_attempt, task_id, dispatch=dispatch, worker_id="other", max_attempts=3
        )
        assert begun is not None and begun.number == 2
        return await astream(self, *args, **kwargs)

    monkeypatch.setattr(TaskRun, "astream", superseded_first)
    assert runtime.run(task_id, dispatch) is None
    task = task_of(ledger, task_id)
    assert (task.status, task.attempts) == ("running", 2)
    assert "run_finished" not in event_types(ledger, task_id)


def test_the_worker_command_takes_tasks_in_flight() -> None:
    from relaygraph.cli._parser import build_parser

    args = build_parser().parse_args(["worker", "--tasks-in-flight", "200"])
    assert args.tasks_in_flight == 200
    assert build_parser().parse_args(["worker"]).tasks_in_flight is None


def test_the_worker_command_refuses_both_pools_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    """--concurrency (prefork processes) and --tasks-in-flight (one process's loop) choose
    the pool: given both, one would be ignored, so the command says so instead."""
    from relaygraph.cli._parser import build_parser

    with pytest.raises(SystemExit) as refused:
        build_parser().parse_args(["worker", "--concurrency", "3", "--tasks-in-flight", "5"])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert "--tasks-in-flight" in err and "--concurrency" in err, err
