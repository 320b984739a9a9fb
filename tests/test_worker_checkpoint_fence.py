"""A superseded attempt's checkpoint writes are refused, atomically, on PostgreSQL.

A worker that froze while RabbitMQ gave its task to another worker comes back with the old
attempt's graph still running. Its ledger writes are refused by the fencing number
(tests/test_worker_fencing.py); these tests try to make its *checkpoints* land on the thread
the new attempt goes on from: a stale graph that wakes up after the new attempt finished,
a stale worker's run of a real task, and a write caught between its check and its INSERTs
while the next attempt begins. The frozen worker as real processes (SIGSTOP, SIGCONT) is in
tests/test_worker_cluster.py.

PostgreSQL only (the worker mode's database): skipped without it, unless
``RELAYGRAPH_REQUIRE_POSTGRES=1``. Every wait is for an event or a condition polled under a
generous deadline; nothing sleeps for a fixed time.
"""

from __future__ import annotations

import json
import operator
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph

from relaygraph.runner import CheckpointFence
from relaygraph.runner._checkpoint import open_checkpointer, postgres_conninfo
from relaygraph.runner._fenced_saver import FencedPostgresSaver
from relaygraph.store import DATABASE_URL_ENV, LOCAL_PROJECT_ID, AttemptSuperseded, Ledger

from .worker_cluster import gated_coder, wait_until

DEADLINE = 120.0
"""Seconds any one wait may take (generous: a loaded 2-core machine)."""
WORKER = "worker-test-1"


def conninfo() -> str:
    import os

    info = postgres_conninfo(os.environ[DATABASE_URL_ENV])
    assert info is not None
    return info


def running_task(postgres_ledger: Ledger) -> tuple[str, int]:
    """A task a worker took (attempt 1), and its dispatch."""
    task, _ = postgres_ledger.create_task(project_id=LOCAL_PROJECT_ID, input="x")
    dispatch = postgres_ledger.queue_for_workers(task.id)
    assert begin(postgres_ledger, task.id, dispatch) == 1
    return task.id, dispatch


def begin(postgres_ledger: Ledger, task_id: str, dispatch: int) -> int | None:
    return postgres_ledger.begin_attempt(
        task_id, dispatch=dispatch, worker_id=WORKER, max_attempts=5
    )


def checkpoint_rows(thread_id: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row the checkpointer holds for the thread, table by table."""
    queries = {
        "checkpoints": "SELECT checkpoint_ns, checkpoint_id, parent_checkpoint_id, "
        "checkpoint, metadata FROM checkpoints WHERE thread_id = %s",
        "checkpoint_writes": "SELECT checkpoint_ns, checkpoint_id, task_id, idx, channel, "
        "type, blob FROM checkpoint_writes WHERE thread_id = %s",
        "checkpoint_blobs": "SELECT checkpoint_ns, channel, version, type, blob "
        "FROM checkpoint_blobs WHERE thread_id = %s",
    }
    with psycopg.connect(conninfo()) as connection:
        return {
            table: sorted(
                (tuple(json.dumps(v, sort_keys=True) if isinstance(v, dict) else v for v in row))
                for row in connection.execute(sql, (thread_id,)).fetchall()
            )
            for table, sql in queries.items()
        }


def waited(condition: Callable[[], Any], what: str, timeout: float = DEADLINE) -> Any:
    """``wait_until`` of the cluster helpers, failing the test when it times out."""
    try:
        return wait_until(condition, timeout, what)
    except TimeoutError as exc:
        pytest.fail(str(exc), pytrace=False)


class Background:
    """Runs ``target`` on a thread; :meth:`outcome` is what it returned or raised."""

    def __init__(self, target: Callable[[], Any]) -> None:
        self.value: Any = None
        self.error: BaseException | None = None
        self._target = target
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.value = self._target()
        except BaseException as exc:
            self.error = exc

    def done(self) -> bool:
        return not self._thread.is_alive()

    def outcome(self, timeout: float = DEADLINE) -> tuple[Any, BaseException | None]:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"still running after {timeout:g} s"
        return self.value, self.error


# 1. A stale attempt's graph wakes up after the new attempt finished the thread


class Steps(TypedDict):
    steps: Annotated[list[str], operator.add]


def two_steps(saver: Any, by: str, frozen: threading.Event | None = None) -> Any:
    """first → second (which, given ``frozen``, waits for it: the worker froze mid-step)."""
    entered = threading.Event()

    def second(state: Steps) -> Steps:
        entered.set()
        if frozen is not None:
            assert frozen.wait(DEADLINE)
        return {"steps": [f"second by {by}"]}

    return two_step_graph(saver, lambda state: {"steps": [f"first by {by}"]}, second, entered)


def two_step_graph(saver: Any, first: Any, second: Any, entered: Any) -> Any:
    """The graph of nodes ``first`` → ``second`` on ``saver``, holding as ``entered`` the
    event that ``second`` sets when it starts."""
    builder = StateGraph(Steps)
    builder.add_node("first", first)
    builder.add_node("second", second)
    builder.add_edge(START, "first")
    builder.add_edge("first", "second")
    builder.add_edge("second", END)
    graph = builder.compile(checkpointer=saver)
    graph.entered = entered  # type: ignore[attr-defined]
    return graph


def test_a_stale_attempt_that_wakes_up_saves_nothing_on_the_new_attempts_thread(
    postgres_ledger: Ledger, home: Path
) -> None:
    task_id, dispatch = running_task(postgres_ledger)
    config: RunnableConfig = {"configurable": {"thread_id": f"thread-{task_id}"}}
    frozen = threading.Event()
    fence = CheckpointFence(task_id=task_id, attempt=1)
    with open_checkpointer(home, fence=fence) as stale_saver:
        assert isinstance(stale_saver, FencedPostgresSaver)
        assert stale_saver.fence == CheckpointFence(task_id=task_id, attempt=1)
        stale = two_steps(stale_saver, "attempt 1", frozen)
        stale_run = Background(lambda: stale.invoke({"steps": []}, config, durability="sync"))
        # Attempt 1 saved its first step and froze in the second.
        assert stale.entered.wait(DEADLINE)

        # The task is redelivered: attempt 2 goes on from attempt 1's last checkpoint.
        assert begin(postgres_ledger, task_id, dispatch) == 2
        with open_checkpointer(home, fence=CheckpointFence(task_id=task_id, attempt=2)) as saver:
            new = two_steps(saver, "attempt 2")
            assert new.invoke(None, config, durability="sync") == {
                "steps": ["first by attempt 1", "second by attempt 2"]
            }
            saved = checkpoint_rows(f"thread-{task_id}")
            latest = saver.get_tuple(config)
            assert latest is not None

            # Attempt 1 wakes up: its step's writes and its checkpoint are refused.
            frozen.set()
            _, error = stale_run.outcome()
            assert isinstance(error, AttemptSuperseded), error
            assert (error.task_id, error.attempt, error.current) == (task_id, 1, 2)
            # So are its writes made straight to the saver, on the new attempt's latest
            # checkpoint: a step's writes are kept until its checkpoint, and refused with
            # it; the task gone, they are refused too.
            stale_saver.put_writes(latest.config, [("steps", ["stale"])], "stale-task")
            with pytest.raises(AttemptSuperseded):
                stale_saver.put(latest.config, latest.checkpoint, latest.metadata, {})

            assert checkpoint_rows(f"thread-{task_id}") == saved
            assert new.get_state(config).values == {
                "steps": ["first by attempt 1", "second by attempt 2"]
            }
            # The saver's reads are its own, unfenced.
            assert stale_saver.get_tuple(config) == saver.get_tuple(config)
            # The latest attempt writes; one of an unknown task is refused.
            saver.put_writes(latest.config, [("steps", ["late"])], "new-task")
            saver.save_kept()
            assert [w[0] for w in saver.get_tuple(latest.config).pending_writes] == ["new-task"]
    with open_checkpointer(home, fence=CheckpointFence(task_id="gone", attempt=1)) as orphan:
        orphan.put_writes(latest.config, [("steps", ["x"])], "t")
        with pytest.raises(AttemptSuperseded) as refused:
            orphan.save_kept()
        assert refused.value.current is None


# 2. A write caught between its check and its INSERTs while the next attempt begins


class HeldSaver(FencedPostgresSaver):
    """Holds its writes between the fence's read and their INSERTs until ``go`` is set."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.held = threading.Event()
        self.go = threading.Event()

    def _write_kept(self, cur: Any) -> None:
        self.held.set()
        assert self.go.wait(DEADLINE)
        super()._write_kept(cur)


def put_and_save(saver: FencedPostgresSaver, config: RunnableConfig, value: str, by: str) -> None:
    """A task's writes, and their saving at once (as the step's checkpoint would)."""
    saver.put_writes(config, [("steps", [value])], by)
    saver.save_kept()


def test_the_next_attempt_waits_for_a_write_that_passed_the_fence(
    postgres_ledger: Ledger, home: Path
) -> None:
    """The check and the save are one transaction: a write that found its attempt current
    commits before the next attempt can begin, never after it."""
    task_id, dispatch = running_task(postgres_ledger)
    with open_checkpointer(home):  # The saver's tables.
        pass
    config: RunnableConfig = {
        "configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "c1"}
    }
    with HeldSaver.for_attempt(conninfo(), CheckpointFence(task_id=task_id, attempt=1)) as saver:
        writer_pid = saver.conn.info.backend_pid  # type: ignore[union-attr]
        write = Background(lambda: put_and_save(saver, config, "one", "task-1"))
        assert saver.held.wait(DEADLINE)
        next_attempt = Background(lambda: begin(postgres_ledger, task_id, dispatch))

        # The next attempt waits on the task's row, which the write holds.
        def blocked_by_the_write() -> bool:
            with psycopg.connect(conninfo(), autocommit=True) as connection:
                row = connection.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                    (writer_pid,),
                ).fetchone()
            return bool(row and row[0])

        waited(blocked_by_the_write, "begin_attempt to wait for the write's lock")
        assert not next_attempt.done()
        saver.go.set()
        assert write.outcome() == (None, None)
        assert next_attempt.outcome() == (2, None)

        # The write committed, as attempt 1's; attempt 1 writes nothing more.
        assert [row[2] for row in checkpoint_rows("t")["checkpoint_writes"]] == ["task-1"]
        with pytest.raises(AttemptSuperseded):
            put_and_save(saver, config, "two", "task-2")
        assert [row[2] for row in checkpoint_rows("t")["checkpoint_writes"]] == ["task-1"]


# 3. A stale worker's run of a real task, woken after the new attempt finished it


def test_a_stale_workers_run_stops_without_touching_the_new_attempts_checkpoints(
    postgres_ledger: Ledger, home: Path, tmp_path: Path
) -> None:
    from relaygraph.runner import Intake, TaskRequest, submit_task
    from relaygraph.team import default_team
    from relaygraph.worker import close_worker_runtime, run_ledger_task

    script = tmp_path / "gated.json"
    script.write_text(json.dumps(gated_coder()), encoding="utf-8")
    request = TaskRequest(input="compute slowly", team=default_team(), model=f"scripted:{script}")
    task = submit_task(request, Intake(ledger=postgres_ledger)).task
    workspace = home / "tasks" / task.id / "workspace"

    def starts(count: int) -> list[str]:
        path = workspace / "starts.txt"
        return waited(
            lambda: path.exists() and len(lines := path.read_text().split()) >= count and lines,
            f"the tool to start {count} time(s)",
        )

    dispatch = postgres_ledger.queue_for_workers(task.id)
    try:
        # Attempt 1 runs the tool, and its worker freezes there (the tool waits).
        stale = Background(lambda: run_ledger_task(task.id, dispatch))
        [old_token] = starts(1)
        # The message is redelivered: attempt 2 continues from attempt 1's last checkpoint
        # (the tool call pending) and finishes the task.
        new = Background(lambda: run_ledger_task(task.id, dispatch))
        new_token = starts(2)[1]
        (workspace / f"go-{new_token}").touch()
        assert new.outcome() == (None, None)
        done = postgres_ledger.get_task(task.id, project_id=LOCAL_PROJECT_ID)
        assert done is not None
        assert (done.status, done.answer, done.attempts) == ("succeeded", "It ran.", 2)
        saved = checkpoint_rows(done.checkpoint_thread)
        events = [(e.seq, e.type) for e in postgres_ledger.events_after(task.id)]

        # Attempt 1 wakes up with its tool's result in hand and the rest of the task to
        # run: it stops, and nothing of it is saved.
        (workspace / f"go-{old_token}").touch()
        assert stale.outcome() == (None, None)
    finally:
        for token in (workspace / "starts.txt").read_text().split():
            (workspace / f"go-{token}").touch()
        close_worker_runtime()

    assert checkpoint_rows(done.checkpoint_thread) == saved
    after = postgres_ledger.get_task(task.id, project_id=LOCAL_PROJECT_ID)
    assert after is not None
    assert (after.status, after.answer, after.stop_reason, after.last_event_seq) == (
        done.status,
        done.answer,
        done.stop_reason,
        done.last_event_seq,
    )
    assert [(e.seq, e.type) for e in postgres_ledger.events_after(task.id)] == events
    [call] = [c for c in postgres_ledger.tool_calls(task.id) if c.tool == "run_python"]
    assert f"went {new_token}" in (call.result_preview or "")


# 4. The fence's read sees a cancel too: the run needs no read of its own per step


def test_a_write_tells_the_fence_of_a_cancel_asked_for(postgres_ledger: Ledger, home: Path) -> None:
    task_id, _ = running_task(postgres_ledger)
    with open_checkpointer(home):  # The saver's tables.
        pass
    config: RunnableConfig = {
        "configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "c1"}
    }
    told: list[str] = []
    fence = CheckpointFence(task_id=task_id, attempt=1, on_cancel=lambda: told.append("cancel"))
    with open_checkpointer(home, fence=fence) as saver:
        put_and_save(saver, config, "one", "task-1")
        assert told == []
        assert (
            postgres_ledger.request_cancel(task_id).status == "running"
        )  # It waits for the worker.
        put_and_save(saver, config, "two", "task-2")
        assert told == ["cancel"]
        # The write itself is saved: the run stops at the step boundary, after its writes.
        writes = checkpoint_rows("t")["checkpoint_writes"]
        assert [row[2] for row in writes] == ["task-1", "task-2"]


def test_a_workers_run_reads_no_attempt_state_per_step(
    postgres_ledger: Ledger, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL the fenced checkpointer checks the attempt and the cancel flag in each
    write; the run's step boundaries make no read of their own (only the watch's poll)."""
    from relaygraph.runner import Intake, TaskRequest, submit_task
    from relaygraph.team import default_team
    from relaygraph.worker import close_worker_runtime, run_ledger_task
    from tests.conftest import EXAMPLE_RELAY

    reads: list[str] = []
    state = Ledger.attempt_state

    def counted(self: Ledger, task_id: str) -> Any:
        reads.append(threading.current_thread().name)
        return state(self, task_id)

    monkeypatch.setattr(Ledger, "attempt_state", counted)
    request = TaskRequest(input="x", team=default_team(), model=f"scripted:{EXAMPLE_RELAY}")
    task = submit_task(request, Intake(ledger=postgres_ledger)).task
    try:
        run_ledger_task(task.id, postgres_ledger.queue_for_workers(task.id))
    finally:
        close_worker_runtime()
    done = postgres_ledger.get_task(task.id, project_id=LOCAL_PROJECT_ID)
    assert done is not None and done.status == "succeeded", done
    # Only the watch polls (every half second, on the process's renewal threads); the step
    # boundaries (more than a dozen in this task) read nothing.
    assert [name for name in reads if not name.startswith("relaygraph-renewal")] == []
