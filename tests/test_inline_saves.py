"""A run saves its checkpoints on its own thread (runner/_inline_saves.py): no thread pool per
LangGraph loop for the saves, no hand-over per step; a caller's own graphs are left alone."""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph

from relaygraph.runner import run_task
from relaygraph.runner._inline_saves import install, saves_inline
from tests.conftest import EXAMPLE_RELAY


@pytest.fixture
def save_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, int]]]:
    """The thread of every ``put`` and ``put_writes`` of SQLite and in-memory savers."""
    seen: list[tuple[str, int]] = []
    for saver in (SqliteSaver, InMemorySaver):
        for name in ("put", "put_writes"):
            original = getattr(saver, name)

            @functools.wraps(original)
            def spy(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
                seen.append((_original.__name__, threading.get_ident()))
                return _original(self, *args, **kwargs)

            monkeypatch.setattr(saver, name, spy)
    yield seen


class _State(TypedDict):
    n: int


def _counting_graph(checkpointer: Any) -> Any:
    graph = StateGraph(_State)
    graph.add_node("one", lambda state: {"n": state["n"] + 1})
    graph.add_node("two", lambda state: {"n": state["n"] + 1})
    graph.add_edge(START, "one")
    graph.add_edge("one", "two")
    graph.add_edge("two", END)
    return graph.compile(checkpointer=checkpointer)


def test_this_langgraph_has_what_the_inline_saves_rely_on() -> None:
    # A LangGraph whose executor changed leaves runs on the pool: this says so.
    assert install() is True


def test_a_run_saves_every_checkpoint_and_write_on_its_own_thread(
    home: Path, save_threads: list[tuple[str, int]]
) -> None:
    result = run_task("When are checkpoints written?", model=f"scripted:{EXAMPLE_RELAY}")

    assert result.status == "succeeded"
    kinds = {name for name, _ in save_threads}
    assert kinds == {"put", "put_writes"}
    # The team graph's saves and those of each agent's subgraph alike.
    assert len(save_threads) > 10
    assert {ident for _, ident in save_threads} == {threading.get_ident()}


def test_a_callers_own_graph_keeps_langgraphs_pool(save_threads: list[tuple[str, int]]) -> None:
    install()
    graph = _counting_graph(InMemorySaver())

    assert graph.invoke({"n": 0}, {"configurable": {"thread_id": "t"}}, durability="sync") == {
        "n": 2
    }
    assert save_threads
    assert threading.get_ident() not in {ident for _, ident in save_threads}


def test_inside_the_block_a_graph_saves_on_the_callers_thread_in_order(
    save_threads: list[tuple[str, int]],
) -> None:
    saver = InMemorySaver()
    graph = _counting_graph(saver)
    config = {"configurable": {"thread_id": "t"}}

    with saves_inline():
        assert graph.invoke({"n": 0}, config, durability="sync") == {"n": 2}

    assert {ident for _, ident in save_threads} == {threading.get_ident()}
    # Every step's checkpoint is there, each the child of the one before.
    history = list(graph.get_state_history(config))
    assert [s.metadata["step"] for s in history] == [2, 1, 0, -1]
    assert history[0].values == {"n": 2}
    parents = [s.parent_config for s in history[:-1]]
    assert [p["configurable"]["checkpoint_id"] for p in parents if p] == [
        s.config["configurable"]["checkpoint_id"] for s in history[1:]
    ]


def test_a_save_that_fails_inside_the_block_fails_the_run() -> None:
    class Broken(InMemorySaver):
        def put(self, *args: Any, **kwargs: Any) -> Any:
            raise OSError("disk full")

    graph = _counting_graph(Broken())

    with saves_inline(), pytest.raises(OSError, match="disk full"):
        graph.invoke({"n": 0}, {"configurable": {"thread_id": "t"}}, durability="sync")


def test_the_private_langgraph_api_the_wrapper_relies_on_is_unchanged() -> None:
    """The wrapper calls ``BackgroundExecutor``'s private API as this LangGraph minor has it:
    a LangGraph that renamed a keyword option, the ``tasks`` book or the loop's save would
    leave the saves on the pool (or break the wrapper) without an error of its own."""
    from langgraph.pregel._executor import BackgroundExecutor
    from langgraph.pregel._loop import SyncPregelLoop

    from relaygraph.runner._inline_saves import SUBMIT_OPTIONS

    # LangGraph's own method, wrapped or not (the wrapper keeps it as __wrapped__).
    original = getattr(BackgroundExecutor.submit, "__wrapped__", BackgroundExecutor.submit)
    submit = inspect.signature(original, follow_wrapped=False).parameters
    assert list(submit)[:2] == ["self", "fn"]
    assert submit["args"].kind is inspect.Parameter.VAR_POSITIONAL
    assert submit["kwargs"].kind is inspect.Parameter.VAR_KEYWORD
    for option in SUBMIT_OPTIONS:
        assert submit[option].kind is inspect.Parameter.KEYWORD_ONLY, option
    assert list(inspect.signature(BackgroundExecutor.done).parameters) == ["self", "task"]
    assert callable(SyncPregelLoop._checkpointer_put_after_previous)

    # The executor books each future it tracks as (cancel on exit, reraise on exit), and
    # ``done`` takes a finished one off the book: the wrapper books its futures the same way.
    release = threading.Event()
    executor = BackgroundExecutor({})
    with executor:
        future = executor.submit(
            release.wait, 60, __cancel_on_exit__=True, __reraise_on_exit__=False
        )
        assert executor.tasks[future] == (True, False)
        release.set()
        assert future.result(timeout=60) is True
    assert future not in executor.tasks


def test_langgraph_is_pinned_to_the_minor_the_wrapper_is_tested_with() -> None:
    """Moving LangGraph to another minor is a choice made with the test above, not an
    upgrade that ``pip`` makes on its own."""
    import tomllib
    from importlib.metadata import version

    from packaging.requirements import Requirement
    from packaging.version import Version

    pyproject = Path(__file__).parents[1] / "pyproject.toml"
    dependencies = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["dependencies"]
    (langgraph,) = [Requirement(d) for d in dependencies if Requirement(d).name == "langgraph"]
    installed = Version(version("langgraph"))
    assert installed in langgraph.specifier
    next_minor = Version(f"{installed.major}.{installed.minor + 1}")
    assert next_minor not in langgraph.specifier, (
        f"langgraph{langgraph.specifier} allows {next_minor}"
    )


def test_a_langgraph_without_the_names_is_told_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from relaygraph.runner import _inline_saves

    monkeypatch.setattr(_inline_saves, "_unavailable_told", False)
    with caplog.at_level("WARNING", logger=_inline_saves.__name__):
        assert _inline_saves._unavailable("gone") is False
        assert _inline_saves._unavailable("gone") is False
    assert [r.getMessage() for r in caplog.records] == [
        "checkpoint saves stay on LangGraph's thread pool: gone"
    ]
