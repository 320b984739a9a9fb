"""The tool journal: a tool call that completed is never run again when its step re-runs.

A step re-runs when the process died after a tool's side effect but before the step's
writes reached the checkpoint. The tests make that happen deterministically: in process, a
journal whose ``put`` stores the record and then fails the run (the process "dies" right
after the record is durable, before the result returns into the graph); and for real, a
child process that SIGKILLs itself as the checkpointer is about to save the last result.
Then the run goes on from its checkpoint and the side effects are counted.

Run as a script, this file is that child (see :func:`_child`).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from relaygraph.agents import Agent, TaskContext, ToolJournal
from relaygraph.agents._journal import JOURNAL_KEY, call_key, journal_record, replay
from relaygraph.backends.workspace import ArtifactStore, Workspace
from relaygraph.errors import ConfigError
from relaygraph.store import LOCAL_PROJECT_ID, Ledger, RecordNotFound
from relaygraph.team import Team

EFFECTS = "effects.txt"
"""Each side effect of a tool appends one line to this file of the task's workspace."""
RUN_PYTHON = {
    "name": "run_python",
    "args": {"code": f"open({EFFECTS!r}, 'a').write('run_python\\n')"},
}
WRITE_FILE = {"name": "write_file", "args": {"path": "notes.md", "content": "# Notes\n"}}
SAVE_ARTIFACT = {"name": "save_artifact", "args": {"name": "report.md", "content": "# Report\n"}}
BUILTIN_CALLS = (RUN_PYTHON, WRITE_FILE, SAVE_ARTIFACT)


# The ledger's journal, on SQLite and PostgreSQL


def _task(ledger: Ledger, key: str = "k-1") -> str:
    task, _ = ledger.create_task(project_id=LOCAL_PROJECT_ID, input="x", idempotency_key=key)
    return task.id


def _record(text: str = "ok") -> dict[str, Any]:
    return {"tool": "run_python", "call": "digest", "outcome": "success", "result": text}


def test_the_ledger_keeps_the_first_record_of_a_call(ledger: Ledger) -> None:
    task_id = _task(ledger)
    journal = ledger.tool_journal
    assert isinstance(journal, ToolJournal)
    assert journal.get(task_id, "call-1") is None
    assert journal.put(task_id, "call-1", _record("first")) == _record("first")
    assert journal.get(task_id, "call-1") == _record("first")
    # A second put of the call (an older attempt finishing late) changes nothing.
    assert journal.put(task_id, "call-1", _record("second")) == _record("first")
    assert journal.get(task_id, "call-1") == _record("first")
    # Calls are kept per task.
    other = _task(ledger, "k-2")
    assert journal.get(other, "call-1") is None
    assert journal.put(other, "call-1", _record("other")) == _record("other")
    assert journal.get(task_id, "call-1") == _record("first")


def test_the_ledger_refuses_a_bad_record(ledger: Ledger) -> None:
    task_id = _task(ledger)
    with pytest.raises(RecordNotFound):
        ledger.journal_call("no-such-task", "call-1", _record())
    with pytest.raises(ConfigError, match="call_id"):
        ledger.journal_call(task_id, " ", _record())
    with pytest.raises(ConfigError, match="call_id"):
        ledger.journal_call(task_id, "c" * 256, _record())
    with pytest.raises(ConfigError, match="record"):
        ledger.journal_call(task_id, "call-1", ["not", "an", "object"])  # type: ignore[arg-type]
    assert ledger.journaled_call(task_id, "call-1") is None


def test_concurrent_puts_of_one_call_agree_on_the_first(ledger: Ledger) -> None:
    task_id = _task(ledger)
    start = threading.Barrier(4)
    kept: list[Mapping[str, Any]] = []

    def put(n: int) -> None:
        start.wait()
        kept.append(ledger.journal_call(task_id, "call-1", _record(f"attempt {n}")))

    threads = [threading.Thread(target=put, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(kept) == 4
    assert all(k == kept[0] for k in kept)
    assert ledger.journaled_call(task_id, "call-1") == kept[0]


# A record holds the result as the graph received it


def test_a_record_replays_the_result_it_was_made_from() -> None:
    from langchain_core.messages import ToolMessage
    from langgraph.types import Command

    call = {"name": "run_python", "args": {"code": "print(1)"}, "id": "c-1"}
    message = ToolMessage(
        "exit code 0", tool_call_id="c-1", name="run_python", status="error", artifact={"a": [1]}
    )
    record = json.loads(json.dumps(journal_record(call, message)))  # as a JSON column returns it
    assert record["tool"] == "run_python" and record["outcome"] == "error"
    assert record["call"] == call_key(call)
    again = replay(record)
    assert isinstance(again, ToolMessage)
    assert (again.content, again.status, again.artifact, again.tool_call_id) == (
        "exit code 0",
        "error",
        {"a": [1]},
        "c-1",
    )
    assert again.response_metadata[JOURNAL_KEY] == "replayed"
    command = Command(update={"messages": [message], "notes": ["x"]})
    back = replay(journal_record(call, command))
    assert isinstance(back, Command) and back.update == command.update
    # The arguments are part of the key: the same id with other arguments is another call.
    assert call_key(call) != call_key({**call, "args": {"code": "print(2)"}})
    assert call_key(call) == call_key({**call, "args": {"code": "print(1) "}})


# Runs that die after a tool completed, in process


class Crash(Exception):
    """The process dying right after the journal's record is durable."""


@dataclass
class CrashingJournal:
    """The ledger's journal, failing the run right after it stores a record of ``tool``.

    ``remember=False`` is a run without a journal that dies at the same point: nothing is
    found on the re-run.
    """

    ledger: Ledger
    tool: str
    remember: bool = True
    crashed: bool = False
    puts: list[str] = field(default_factory=list)

    def get(self, task_id: str, call_id: str) -> Mapping[str, Any] | None:
        return self.ledger.journaled_call(task_id, call_id) if self.remember else None

    def put(self, task_id: str, call_id: str, record: Mapping[str, Any]) -> Mapping[str, Any]:
        kept = self.ledger.journal_call(task_id, call_id, record)
        self.puts.append(str(record["tool"]))
        if record["tool"] == self.tool and not self.crashed:
            self.crashed = True
            raise Crash(f"died after {self.tool} completed")
        return kept


def _script(*turns: list[Mapping[str, Any]]) -> dict[str, Any]:
    return {
        "supervisor": [
            {"route": {"next": "coder", "task": "do the work", "reason": "code"}},
            {"route": {"next": "FINISH", "task": "", "reason": "done"}},
        ],
        "coder": [*({"tool_calls": list(calls)} for calls in turns), {"content": "Done."}],
        "finalize": [{"content": "The work is done."}],
    }


def _team(policy: Mapping[str, Any] | None = None, *, writer: bool = False) -> Team:
    coder = Agent(
        name="coder",
        description="writes and runs code",
        prompt="You are the coder.",
        tools=("run_python", "write_file", "save_artifact"),
    )
    if not writer:
        return Team(agents=(coder,), policy=policy)
    peer = Agent(name="writer", description="writes", prompt="You are the writer.")
    return Team(agents=(coder, peer), policy=policy)


def _context(home: Path, task_id: str, journal: ToolJournal | None) -> TaskContext:
    context = replace(
        TaskContext.for_task(home, task_id=task_id, thread_id="t-1"), tool_journal=journal
    )
    context.workspace.mkdir(parents=True, exist_ok=True)
    context.artifacts.mkdir(parents=True, exist_ok=True)
    return context


def _count_file_tools(effects: Path) -> None:
    """Make ``write_file`` and ``save_artifact`` count their writes (``run_python``'s code
    counts its own runs)."""
    write_text, save = Workspace.write_text, ArtifactStore.save

    def counted(name: str, real: Any) -> Any:
        def call(self: Any, *args: Any) -> Any:
            done = real(self, *args)
            with effects.open("a", encoding="utf-8") as out:
                out.write(f"{name}\n")
            return done

        return call

    Workspace.write_text = counted("write_file", write_text)  # type: ignore[method-assign]
    ArtifactStore.save = counted("save_artifact", save)  # type: ignore[method-assign]


def _effects(context: TaskContext) -> Counter[str]:
    path = context.workspace / EFFECTS
    return Counter(path.read_text(encoding="utf-8").split()) if path.exists() else Counter()


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Workspace, "write_text", Workspace.write_text)
    monkeypatch.setattr(ArtifactStore, "save", ArtifactStore.save)


@pytest.fixture
def sqlite_ledger(tmp_path: Path) -> Iterator[Ledger]:
    with Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}") as ledger:
        ledger.upgrade()
        yield ledger


def _graph(
    script: dict[str, Any],
    tmp_path: Path,
    policy: Mapping[str, Any] | None = None,
    *,
    writer: bool = False,
) -> Any:
    from langgraph.checkpoint.memory import InMemorySaver

    path = tmp_path / "script.json"
    path.write_text(json.dumps(script), encoding="utf-8")
    team = _team(policy, writer=writer)
    return team.compile(model=f"scripted:{path}", checkpointer=InMemorySaver())


def _coder_messages(graph: Any, config: Any) -> list[Any]:
    visits = graph.get_state(config).values["visits"]
    return [m for v in visits if v["agent"] == "coder" for m in v["messages"]]


CONFIG = {"configurable": {"thread_id": "t-1"}}


@pytest.mark.parametrize("tool", ["run_python", "write_file", "save_artifact"])
def test_a_step_rerun_after_a_crash_does_not_repeat_a_completed_call(
    tool: str, home: Path, tmp_path: Path, sqlite_ledger: Ledger, counted: None
) -> None:
    task_id = _task(sqlite_ledger)
    journal = CrashingJournal(sqlite_ledger, tool)
    context = _context(home, task_id, journal)
    _count_file_tools(context.workspace / EFFECTS)
    # One call per model turn, so the crash finds the earlier calls' steps checkpointed.
    graph = _graph(_script(*([c] for c in BUILTIN_CALLS)), tmp_path)
    with pytest.raises(Crash):
        graph.invoke({"request": "work"}, CONFIG, context=context)
    assert _effects(context)[tool] == 1
    final = graph.invoke(None, CONFIG, context=context)
    assert final["status"] == "succeeded"
    assert _effects(context) == Counter({"run_python": 1, "write_file": 1, "save_artifact": 1})
    # The re-run step answered the call from the journal, as the tool had answered it.
    answers = {m.name: m for m in _coder_messages(graph, CONFIG) if m.type == "tool"}
    assert answers[tool].response_metadata.get(JOURNAL_KEY) == "replayed"
    assert [n for n, m in answers.items() if JOURNAL_KEY in m.response_metadata] == [tool]
    assert answers[tool].status == "success"
    assert sqlite_ledger.journaled_call(task_id, answers[tool].tool_call_id) is not None


def test_without_the_journal_the_rerun_step_repeats_the_call(
    home: Path, tmp_path: Path, sqlite_ledger: Ledger, counted: None
) -> None:
    # The control: the same crash with a journal that finds nothing runs the tool again.
    task_id = _task(sqlite_ledger)
    context = _context(home, task_id, CrashingJournal(sqlite_ledger, "run_python", False))
    graph = _graph(_script([RUN_PYTHON]), tmp_path)
    with pytest.raises(Crash):
        graph.invoke({"request": "work"}, CONFIG, context=context)
    graph.invoke(None, CONFIG, context=context)
    assert _effects(context)["run_python"] == 2


def test_parallel_calls_each_run_once_across_a_crash(
    home: Path, tmp_path: Path, sqlite_ledger: Ledger, counted: None
) -> None:
    # Three calls in one message run side by side in one step; the run dies as one of them
    # completes, whatever the others had done by then.
    task_id = _task(sqlite_ledger)
    context = _context(home, task_id, CrashingJournal(sqlite_ledger, "write_file"))
    _count_file_tools(context.workspace / EFFECTS)
    graph = _graph(_script(list(BUILTIN_CALLS)), tmp_path)
    with pytest.raises(Crash):
        graph.invoke({"request": "work"}, CONFIG, context=context)
    assert graph.invoke(None, CONFIG, context=context)["status"] == "succeeded"
    assert _effects(context) == Counter({"run_python": 1, "write_file": 1, "save_artifact": 1})


def test_an_approved_call_is_not_run_again_nor_asked_again(
    home: Path, tmp_path: Path, sqlite_ledger: Ledger, counted: None
) -> None:
    from langgraph.types import Command

    task_id = _task(sqlite_ledger)
    journal = CrashingJournal(sqlite_ledger, "run_python")
    context = _context(home, task_id, journal)
    policy = {"agents": {"coder": {"approval": ["run_python"]}}}
    graph = _graph(_script([RUN_PYTHON]), tmp_path, policy)
    paused = graph.invoke({"request": "work"}, CONFIG, context=context)
    assert paused["__interrupt__"] and journal.puts == []  # Paused before it ran.
    with pytest.raises(Crash):
        graph.invoke(Command(resume={"decision": "approve"}), CONFIG, context=context)
    final = graph.invoke(None, CONFIG, context=context)
    assert "__interrupt__" not in final and final["status"] == "succeeded"
    assert _effects(context)["run_python"] == 1


def test_refused_and_rejected_calls_and_handoffs_are_not_journaled(
    home: Path, tmp_path: Path, sqlite_ledger: Ledger
) -> None:
    from langgraph.types import Command

    task_id = _task(sqlite_ledger)
    context = _context(home, task_id, sqlite_ledger.tool_journal)
    policy = {"agents": {"coder": {"approval": ["run_python"]}}}
    script = _script(
        [{"name": "read_doc", "args": {"doc_id": "x"}, "id": "refused"}],  # not its tool
        [{"name": "write_file", "args": {"path": 3}, "id": "invalid"}],  # bad arguments
        [{**RUN_PYTHON, "id": "rejected"}],
        [{**WRITE_FILE, "id": "ran"}],
        [{"name": "transfer_to_writer", "args": {"task": "Write it up."}, "id": "handoff"}],
    )
    script["writer"] = [{"content": "Written."}]
    graph = _graph(script, tmp_path, policy, writer=True)
    graph.invoke({"request": "work"}, CONFIG, context=context)
    final = graph.invoke(Command(resume={"decision": "reject"}), CONFIG, context=context)
    assert final["status"] == "succeeded"
    assert [(h["source"], h["target"]) for h in final["handoffs"]][-1] == ("coder", "writer")
    not_run = ("refused", "invalid", "rejected", "handoff")
    assert {c: sqlite_ledger.journaled_call(task_id, c) for c in not_run} == dict.fromkeys(not_run)
    ran = sqlite_ledger.journaled_call(task_id, "ran")
    assert ran is not None and ran["tool"] == "write_file"


def test_a_record_of_another_call_under_the_same_id_is_not_its_answer(
    home: Path, tmp_path: Path, sqlite_ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    from langchain_core.messages import ToolMessage

    task_id = _task(sqlite_ledger)
    other = {"name": "write_file", "args": {"path": "a.md", "content": "a"}, "id": "c-1"}
    sqlite_ledger.journal_call(
        task_id, "c-1", journal_record(other, ToolMessage("Wrote a.md", tool_call_id="c-1"))
    )
    context = _context(home, task_id, sqlite_ledger.tool_journal)
    graph = _graph(_script([{**RUN_PYTHON, "id": "c-1"}]), tmp_path)
    assert graph.invoke({"request": "work"}, CONFIG, context=context)["status"] == "succeeded"
    assert _effects(context)["run_python"] == 1
    assert "has a record of another call with id 'c-1'" in caplog.text


# The real thing: a process killed with SIGKILL after its tools completed


def _child(home: Path, *, journal: bool) -> None:
    """Run the parallel calls in a child and SIGKILL it as the checkpointer is about to save
    the last of their results (the others are saved as the step's pending writes)."""
    from langchain_core.messages import ToolMessage
    from langgraph.checkpoint.sqlite import SqliteSaver

    ledger = Ledger(f"sqlite:///{home / 'ledger.sqlite'}")
    ledger.upgrade()
    task_id = _task(ledger)
    context = _context(home, task_id, ledger.tool_journal if journal else None)
    _count_file_tools(context.workspace / EFFECTS)
    saved: set[str] = set()

    class KilledSaver(SqliteSaver):
        def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
            results = {
                m.tool_call_id
                for _, value in writes
                for m in (value if isinstance(value, list) else [value])
                if isinstance(m, ToolMessage)
            }
            if results and len(saved | results) == len(BUILTIN_CALLS):
                os.kill(os.getpid(), signal.SIGKILL)
            saved.update(results)
            super().put_writes(config, writes, task_id, task_path)

    saver = KilledSaver(sqlite3.connect(home / "checkpoints.sqlite", check_same_thread=False))
    saver.setup()
    script = home / "script.json"
    script.write_text(json.dumps(_script(list(BUILTIN_CALLS))), encoding="utf-8")
    graph = _team().compile(model=f"scripted:{script}", checkpointer=saver)
    graph.invoke({"request": "work"}, CONFIG, context=context)


@pytest.mark.parametrize("journal", [True, False], ids=["journal", "no-journal"])
def test_calls_completed_before_a_kill_9_are_not_repeated(
    journal: bool, home: Path, tmp_path: Path, counted: None
) -> None:
    from langgraph.checkpoint.sqlite import SqliteSaver

    home.mkdir(parents=True, exist_ok=True)
    child = subprocess.run(
        [sys.executable, __file__, str(home), "journal" if journal else "none"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr[-3000:]
    ledger = Ledger(f"sqlite:///{home / 'ledger.sqlite'}")
    task_id = _task(ledger)
    context = _context(home, task_id, ledger.tool_journal if journal else None)
    assert _effects(context) == Counter({"run_python": 1, "write_file": 1, "save_artifact": 1})
    _count_file_tools(context.workspace / EFFECTS)
    with sqlite3.connect(home / "checkpoints.sqlite", check_same_thread=False) as connection:
        graph = _team().compile(
            model=f"scripted:{home / 'script.json'}", checkpointer=SqliteSaver(connection)
        )
        assert graph.invoke(None, CONFIG, context=context)["status"] == "succeeded"
    effects = _effects(context)
    if journal:
        assert effects == Counter({"run_python": 1, "write_file": 1, "save_artifact": 1})
    else:
        # The call whose result was being saved ran again; the other two were saved.
        assert sorted(effects.values()) == [1, 1, 2]
    ledger.close()


if __name__ == "__main__":
    _child(Path(sys.argv[1]), journal=sys.argv[2] == "journal")
