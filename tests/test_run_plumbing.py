"""What keeps a run lean: batched ledger writes behind the graph, a compiled team kept per
process, and team records that checkpoints do not rewrite at every step."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from relaygraph.errors import ConfigError
from relaygraph.runner import RunResult, run_task
from relaygraph.runner._event_writer import EventWriter
from relaygraph.runner._team_cache import TeamCache
from relaygraph.store import LOCAL_PROJECT_ID, Ledger
from relaygraph.team import default_team
from relaygraph.topology import Topology
from tests.builtin_team import default_policy
from tests.conftest import EXAMPLE_RELAY

Relay = tuple[list[dict[str, Any]], RunResult, Path]


@pytest.fixture(scope="module")
def relay(tmp_path_factory: pytest.TempPathFactory) -> Relay:
    """The shipped relay example, run once: its events, its result and its data directory."""
    events: list[dict[str, Any]] = []
    home = tmp_path_factory.mktemp("relay")
    result = run_task(
        "When are checkpoints written?",
        model=f"scripted:{EXAMPLE_RELAY}",
        home=home,
        on_event=events.append,
    )
    return events, result, home


def _rows(sqlite_ledger: Ledger, task_id: str) -> dict[str, Any]:
    def plain(records: list[Any], *drop: str) -> list[dict[str, Any]]:
        return [{k: v for k, v in asdict(r).items() if k not in drop} for r in records]

    volatile = ("id", "task_id", "created_at", "finished_at", "updated_at")
    return {
        "events": [(e.seq, e.type, e.agent, e.data) for e in sqlite_ledger.events_after(task_id)],
        "handoffs": plain(sqlite_ledger.handoffs(task_id), *volatile),
        "tool_calls": plain(sqlite_ledger.tool_calls(task_id), *volatile),
        "usage": plain(sqlite_ledger.usage(task_id), *volatile),
    }


def test_a_batch_of_events_records_what_one_at_a_time_does(
    sqlite_ledger: Ledger, relay: Relay
) -> None:
    events, _, _ = relay
    one, _ = sqlite_ledger.create_task(project_id=LOCAL_PROJECT_ID, input="x")
    batched, _ = sqlite_ledger.create_task(project_id=LOCAL_PROJECT_ID, input="x")
    for event in events:
        sqlite_ledger.append_event(one.id, event)
    half = len(events) // 2
    assert sqlite_ledger.append_events(batched.id, events[:half]) == list(range(1, half + 1))
    assert sqlite_ledger.append_events(batched.id, events[half:]) == list(
        range(half + 1, len(events) + 1)
    )
    assert sqlite_ledger.append_events(batched.id, []) == []
    expected = _rows(sqlite_ledger, one.id)
    assert expected["handoffs"] and expected["tool_calls"] and expected["usage"]
    assert _rows(sqlite_ledger, batched.id) == expected


def test_a_bad_event_in_a_batch_writes_nothing(sqlite_ledger: Ledger) -> None:
    task, _ = sqlite_ledger.create_task(project_id=LOCAL_PROJECT_ID, input="x")
    with pytest.raises(ConfigError, match="'type' 7"):
        sqlite_ledger.append_events(task.id, [{"type": "route", "next": "coder"}, {"type": 7}])
    assert sqlite_ledger.events_after(task.id) == []
    assert sqlite_ledger.handoffs(task.id) == []


class _SlowLedger:
    """Records batches; the first write waits, so the events behind it queue up."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.batches: list[list[str]] = []
        self.fail_on = fail_on
        self.release = threading.Event()

    def append_events(self, task_id: str, events: list[dict[str, Any]]) -> list[int]:
        if not self.batches:
            self.release.wait(5)
        if any(e["type"] == self.fail_on for e in events):
            raise RuntimeError(f"cannot write {self.fail_on}")
        self.batches.append([e["type"] for e in events])
        return []


def test_the_event_writer_batches_in_order_and_hands_on_after_writing() -> None:
    sqlite_ledger = _SlowLedger()
    seen: list[tuple[str, int]] = []
    writer = EventWriter(
        sqlite_ledger,
        "task-1",
        lambda e: seen.append((e["type"], len(sqlite_ledger.batches))),
        linger_seconds=0,
    )
    writer.put({"type": "run_started"})
    time.sleep(0.05)  # The writer is now inside its first (held) write.
    for kind in ("route", "token", "agent_started", "token", "agent_finished"):
        writer.put({"type": kind})
    assert seen == []  # Nothing is handed on before the ledger has it.
    sqlite_ledger.release.set()
    writer.flush()
    assert sqlite_ledger.batches == [["run_started"], ["route", "agent_started", "agent_finished"]]
    # Tokens are not stored but keep their place among the events handed on.
    assert [kind for kind, _ in seen] == [
        "run_started",
        "route",
        "token",
        "agent_started",
        "token",
        "agent_finished",
    ]
    assert all(written >= 1 for _, written in seen)
    writer.close()


def test_the_event_writer_lingers_for_the_events_right_behind() -> None:
    sqlite_ledger = _SlowLedger()
    sqlite_ledger.release.set()
    writer = EventWriter(sqlite_ledger, "task-1", lambda e: None, linger_seconds=5)
    writer.put({"type": "route"})
    writer.put({"type": "agent_started"})
    start = time.monotonic()
    writer.flush()  # Ends the linger at once.
    assert time.monotonic() - start < 2
    assert sqlite_ledger.batches == [["route", "agent_started"]]
    writer.put({"type": "final"})
    writer.close()
    assert sqlite_ledger.batches[-1] == ["final"]


def test_a_flush_behind_a_write_in_progress_does_not_wait_out_the_linger() -> None:
    """The writer sleeps while it lingers; a flush queued (behind an event) while the
    writer is still writing the batch before must still wake it."""
    written = threading.Event()
    proceed = threading.Event()
    batches: list[list[str]] = []

    class HeldLedger:
        def append_events(self, task_id: str, events: list[dict[str, Any]]) -> list[int]:
            batches.append([e["type"] for e in events])
            if len(batches) == 1:
                written.set()
                proceed.wait(5)
            return []

    writer = EventWriter(HeldLedger(), "task-1", lambda e: None, linger_seconds=30)
    writer.put({"type": "route"})
    writer.put({"type": "agent_started"})
    flusher = threading.Thread(target=writer.flush)
    flusher.start()
    assert written.wait(5)  # The first batch is being written.
    writer.put({"type": "agent_finished"})
    start = time.monotonic()
    done = threading.Thread(target=writer.flush)
    done.start()
    proceed.set()
    done.join(10)
    flusher.join(10)
    assert time.monotonic() - start < 5
    assert batches == [["route", "agent_started"], ["agent_finished"]]
    writer.close()


def test_a_failed_write_is_raised_on_the_runs_thread() -> None:
    sqlite_ledger = _SlowLedger(fail_on="handoff")
    sqlite_ledger.release.set()
    seen: list[str] = []
    writer = EventWriter(sqlite_ledger, "task-1", lambda e: seen.append(e["type"]))
    writer.put({"type": "route"})
    writer.flush()
    writer.put({"type": "handoff"})
    with pytest.raises(RuntimeError, match="cannot write handoff"):
        writer.flush()
    with pytest.raises(RuntimeError, match="cannot write handoff"):
        writer.put({"type": "final"})
    with pytest.raises(RuntimeError, match="cannot write handoff"):
        writer.close()
    assert seen == ["route"]


def test_the_team_cache_compiles_once_per_key(script: Callable[[dict[str, Any]], str]) -> None:
    spec = script({"supervisor": [{"route": {"next": "FINISH", "task": "", "reason": "r"}}]})
    roles = Topology().roles(tuple(default_policy().agents))
    specs = dict.fromkeys(roles, spec)
    cache = TeamCache(size=2)
    team = default_team()
    policy, topology = default_policy(), Topology()
    first = cache.get(specs, team=team, policy=policy, topology=topology)
    assert cache.get(specs, team=team, policy=policy, topology=topology) is first
    assert first.checkpointer is None  # Each run binds its own.

    # Another topology, another policy, or an edited script file: compiled anew.
    swarm = cache.get(specs, team=team, policy=policy, topology=Topology(kind="swarm"))
    assert swarm is not first
    path = Path(spec.removeprefix("scripted:"))
    path.write_text(json.dumps({"supervisor": [], "writer": []}), encoding="utf-8")
    edited = cache.get(specs, team=team, policy=policy, topology=topology)
    assert edited is not first
    # Another team (even one equal to it in every field) is compiled anew: its tools' code
    # is its own.
    from relaygraph.agents import builtin
    from relaygraph.team import Team

    twin = Team(agents=builtin.agents(), name="default")
    assert twin.digest == team.digest
    assert cache.get(specs, team=twin, policy=policy, topology=topology) is not edited
    # The least recently used keys were dropped.
    assert cache.get(specs, team=team, policy=policy, topology=Topology(kind="swarm")) is not swarm


def test_checkpoints_do_not_rewrite_the_teams_records(relay: Relay) -> None:
    """visits, handoffs, usage and violations accumulate over a task; each checkpoint
    would rewrite them whole (O(history) per step). They are delta channels: the state
    has them, the checkpoint blobs do not."""
    _, result, home = relay
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    serde = JsonPlusSerializer()
    conn = sqlite3.connect(home / "checkpoints.sqlite")
    try:
        rows = conn.execute(
            "SELECT type, checkpoint FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ''",
            # The CLI's threads live under the local project's key (threads are per project).
            (f"{LOCAL_PROJECT_ID}/{result.thread_id}",),
        ).fetchall()
    finally:
        conn.close()
    assert len(rows) > 5
    for kind, blob in rows:
        values = serde.loads_typed((kind, blob))["channel_values"]
        assert not {"visits", "handoffs", "usage", "violations"} & set(values)
    # ... and the result, read back from the state, has them all.
    assert [h["to"] for h in result.handoffs] == ["researcher", "coder", "writer"]
    assert result.agents_run == ["researcher", "coder", "writer"]


def test_a_task_whose_model_cannot_be_built_fails_on_the_record(
    sqlite_ledger: Ledger, home: Path
) -> None:
    from relaygraph.policies import policy_to_mapping
    from relaygraph.runner import TaskRunner

    roles = Topology().roles(tuple(default_policy().agents))
    task, _ = sqlite_ledger.create_task(
        project_id=LOCAL_PROJECT_ID,
        input="x",
        policy=policy_to_mapping(default_policy()),
        models=dict.fromkeys(roles, "scripted:/gone/script.json"),
        topology=Topology().to_mapping(),
    )
    with pytest.raises(ConfigError, match="does not exist"):
        TaskRunner(ledger=sqlite_ledger, home=home).run(task, {"request": "x"})
    stored = sqlite_ledger.get_task(task.id, project_id=LOCAL_PROJECT_ID)
    assert stored is not None and stored.status == "failed"
    assert "'/gone/script.json' does not exist" in (stored.stop_reason or "")
    assert [e.type for e in sqlite_ledger.events_after(task.id)] == ["run_finished"]


def test_who_asked_goes_into_the_config_never_into_state(sqlite_ledger: Ledger, home: Path) -> None:
    """The project's identity travels in ``config["configurable"]`` (LangGraph records it in the
    checkpoints' metadata), and nothing a model could write holds it."""
    from relaygraph.policies import policy_to_mapping
    from relaygraph.runner import TaskRunner
    from relaygraph.runner._checkpoint import sqlite_checkpointer
    from relaygraph.runner._team_cache import team_cache

    roles = Topology().roles(tuple(default_policy().agents))
    specs = dict.fromkeys(roles, f"scripted:{EXAMPLE_RELAY}")
    task, _ = sqlite_ledger.create_task(
        project_id=LOCAL_PROJECT_ID,
        input="When are checkpoints written?",
        policy=policy_to_mapping(default_policy()),
        models=specs,
        topology=Topology().to_mapping(),
    )
    result = TaskRunner(ledger=sqlite_ledger, home=home).run(
        task, {"request": task.input}, identity={"project": "project-acme-7f3"}
    )
    assert result.status == "succeeded"
    team = team_cache.get(specs, team=default_team(), policy=default_policy(), topology=Topology())
    with sqlite_checkpointer(home / "checkpoints.sqlite") as saver:
        snapshot = team.copy({"checkpointer": saver}).get_state(
            {"configurable": {"thread_id": task.checkpoint_thread}}
        )
    assert snapshot.metadata is not None
    assert snapshot.metadata["relaygraph_project"] == "project-acme-7f3"
    assert snapshot.metadata["relaygraph_task_id"] == task.id
    assert "project-acme-7f3" not in json.dumps(snapshot.values, default=str)


def test_a_script_key_that_names_no_role_is_refused(
    home: Path, script: Callable[[dict[str, Any]], str]
) -> None:
    spec = script(
        {
            "supervisor": [{"route": {"next": "FINISH", "task": "", "reason": "r"}}],
            "reviewr": [{"content": "typo"}],
        }
    )
    with pytest.raises(ConfigError, match="has turns for 'reviewr', which is no role"):
        run_task("go", model=spec, home=home)


def test_a_long_lived_process_keeps_its_modules_out_of_full_collections() -> None:
    """``settle_long_lived`` (what ``serve``, its task processes and a worker's pool process
    call before their first task) imports what runs use and freezes it: a full collection
    then walks a small fraction of the objects it walked before; and the youngest
    generation is collected less often. In a process of its own: frozen objects are never
    collected, and the test session's are not to be frozen."""
    import subprocess
    import sys

    probe = """
import gc, json, sys
import relaygraph.api, relaygraph.cli
from relaygraph.runner import settle_long_lived
from relaygraph.runner._long_lived import RUN_MODULES
before, threshold = len(gc.get_objects()), gc.get_threshold()
frozen = settle_long_lived()
print(json.dumps({"before": before, "frozen": frozen, "threshold": [threshold, gc.get_threshold()],
    "walked": len(gc.get_objects()),
    "imported": all(m in sys.modules for m in RUN_MODULES)}))
"""
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=True
    )
    found = json.loads(done.stdout)
    assert found["imported"], found
    assert found["frozen"] >= found["before"], found  # the run modules were imported first
    assert found["walked"] < found["frozen"] / 20, found
    (young, *older), (settled_young, *settled_older) = found["threshold"]
    assert (young, settled_young, settled_older) == (700, 10_000, older), found


@pytest.mark.parametrize("stream_tokens", [False, True])
def test_a_runs_steps_run_on_its_own_thread_unless_tokens_stream(
    home: Path, stream_tokens: bool
) -> None:
    """Without tokens the events go straight to the run's writer, so LangGraph runs every
    step on the run's thread: no hand-over to its pool per step and per event (on a busy
    server each is a wait behind the other runs). With tokens, the steps run on LangGraph's
    pool as its stream needs; the events are the same either way."""
    from langchain_core.callbacks import BaseCallbackHandler

    class Threads(BaseCallbackHandler):
        def __init__(self) -> None:
            self.seen: set[int] = set()

        def on_chat_model_start(self, *args: Any, **kwargs: Any) -> None:
            self.seen.add(threading.get_ident())

    threads = Threads()
    events: list[dict[str, Any]] = []
    result = run_task(
        "When are checkpoints written?",
        model=f"scripted:{EXAMPLE_RELAY}",
        home=home,
        on_event=events.append,
        stream_tokens=stream_tokens,
        callbacks=[threads],
    )
    assert result.status == "succeeded"
    on_this_thread = threads.seen == {threading.get_ident()}
    assert on_this_thread is not stream_tokens
    kinds = [e["type"] for e in events if e["type"] != "token"]
    assert kinds.count("agent_started") == kinds.count("agent_finished") >= 2
    assert kinds[0] == "run_started" and kinds[-2:] == ["final", "run_finished"]


@pytest.mark.parametrize("stream_tokens", [False, True])
def test_a_failed_ledger_write_stops_the_run(
    home: Path, monkeypatch: pytest.MonkeyPatch, stream_tokens: bool
) -> None:
    """A ledger write that fails mid-run stops the run at its next step, instead of letting
    it go on calling models and running tools whose events can no longer be stored."""
    from langchain_core.callbacks import BaseCallbackHandler

    failed: list[bool] = []
    append = Ledger.append_events

    def append_events(self: Ledger, task_id: str, events: list[Any], **kw: Any) -> Any:
        if not failed and any(e["type"] == "tool_call" for e in events):
            failed.append(True)
            raise RuntimeError("ledger down")
        return append(self, task_id, events, **kw)

    monkeypatch.setattr(Ledger, "append_events", append_events)

    class CallsAfterTheFailure(BaseCallbackHandler):
        def __init__(self) -> None:
            self.names: list[str] = []

        def on_chat_model_start(self, serialized: Any, *args: Any, **kwargs: Any) -> None:
            if failed:
                self.names.append("model")

        def on_tool_start(self, serialized: Any, *args: Any, **kwargs: Any) -> None:
            if failed:
                self.names.append(str((serialized or {}).get("name")))

    after = CallsAfterTheFailure()
    with pytest.raises(RuntimeError, match="ledger down"):
        run_task(
            "When are checkpoints written?",
            model=f"scripted:{EXAMPLE_RELAY}",
            home=home,
            stream_tokens=stream_tokens,
            callbacks=[after],
        )
    # The run stops at its next step: at most the call already under way finishes.
    assert len(after.names) <= 1, after.names
    assert not list(home.glob("tasks/*/artifacts/report.md"))  # the writer never ran
